#include "gatedDeltaRulePlugin.h"

#include "gatedDeltaRuleKernels.h"

#include "../common/checks.h"
#include "../common/fields.h"
#include "../common/tensors.h"

#include <cmath>
#include <sstream>

namespace gdn
{
namespace plugin
{

using nvinfer1::DataType;
using nvinfer1::Dims;
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;
using nvinfer1::PluginTensorDesc;
using nvinfer1::TensorFormat;
using IO = GatedDeltaRuleIO;

char const* GatedDeltaRuleIO::inputName(int32_t i) noexcept
{
    static char const* const kNames[kNB_INPUTS] = {"q", "k", "v", "g", "beta", "initial_state"};
    return i >= 0 && i < kNB_INPUTS ? kNames[i] : "(no such input)";
}

char const* GatedDeltaRuleIO::outputName(int32_t i) noexcept
{
    static char const* const kNames[kNB_OUTPUTS] = {"o", "final_state"};
    return i >= 0 && i < kNB_OUTPUTS ? kNames[i] : "(no such output)";
}

namespace
{

constexpr int32_t kINPUT_RANKS[IO::kNB_INPUTS] = {4, 4, 4, 3, 3, 4};

void checkCounts(int32_t nbInputs, int32_t nbOutputs)
{
    GDN_PLUGIN_CHECK(nbInputs == IO::kNB_INPUTS && nbOutputs == IO::kNB_OUTPUTS,
        kGDR_PLUGIN_NAME << " takes " << IO::kNB_INPUTS << " inputs (q, k, v, g, beta, initial_state) and gives "
                         << IO::kNB_OUTPUTS << " outputs (o, final_state), got " << nbInputs << " and " << nbOutputs);
}

//! Checks ranks and every dim that two inputs share; a dim < 0 (unknown at build time) matches anything.
void checkInputDims(Dims const* in)
{
    for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
    {
        GDN_PLUGIN_CHECK(in[i].nbDims == kINPUT_RANKS[i], kGDR_PLUGIN_NAME << ": " << IO::inputName(i) << " must have rank "
                                                          << kINPUT_RANKS[i] << ", got " << dimsToString(in[i]));
    }
    auto same = [&](int32_t a, int32_t da, int32_t b, int32_t db, char const* what) {
        int64_t const x = in[a].d[da];
        int64_t const y = in[b].d[db];
        GDN_PLUGIN_CHECK(x < 0 || y < 0 || x == y,
            kGDR_PLUGIN_NAME << ": " << what << " differs: " << IO::inputName(a) << " " << dimsToString(in[a]) << " vs "
                             << IO::inputName(b) << " " << dimsToString(in[b]));
    };
    for (int32_t d = 0; d < 4; ++d)
    {
        same(IO::kQ, d, IO::kK, d, "q and k shape");
    }
    for (int32_t i : {IO::kV, IO::kG, IO::kBETA})
    {
        same(IO::kQ, 0, i, 0, "batch B");
        same(IO::kQ, 1, i, 1, "sequence length T");
    }
    same(IO::kV, 2, IO::kG, 2, "value heads Hv");
    same(IO::kV, 2, IO::kBETA, 2, "value heads Hv");
    same(IO::kQ, 0, IO::kINITIAL_STATE, 0, "batch B");
    same(IO::kV, 2, IO::kINITIAL_STATE, 1, "value heads Hv");
    same(IO::kQ, 3, IO::kINITIAL_STATE, 2, "key dim Dk");
    same(IO::kV, 3, IO::kINITIAL_STATE, 3, "value dim Dv");
    int64_t const hk = in[IO::kQ].d[2];
    int64_t const hv = in[IO::kV].d[2];
    GDN_PLUGIN_CHECK(hk < 0 || hv < 0 || (hk > 0 && hv % hk == 0),
        kGDR_PLUGIN_NAME << ": value heads Hv = " << hv << " must be a multiple of key heads Hk = " << hk);
}

Dims const* collectDims(PluginTensorDesc const* desc, Dims* out)
{
    for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
    {
        out[i] = desc[i].dims;
    }
    return out;
}

//! Kernel parameters (no pointers) for concrete input dims.
GatedDeltaRuleParams makeParams(Dims const* in, DataType type, float scale, int32_t useQkL2norm)
{
    GatedDeltaRuleParams p;
    p.dtype = toKernelDataType(type, "GatedDeltaRule q/k/v/beta");
    p.batch = dimAsInt32(in[IO::kQ], 0, "q");
    p.seqLen = dimAsInt32(in[IO::kQ], 1, "q");
    p.numKeyHeads = dimAsInt32(in[IO::kQ], 2, "q");
    p.keyDim = dimAsInt32(in[IO::kQ], 3, "q");
    p.numValueHeads = dimAsInt32(in[IO::kV], 2, "v");
    p.valueDim = dimAsInt32(in[IO::kV], 3, "v");
    p.numSeqs = p.batch;
    p.cuSeqlens = nullptr;
    p.scale = scale;
    p.useQkL2norm = useQkL2norm != 0;
    return p;
}

std::string paramsToString(GatedDeltaRuleParams const& p)
{
    std::ostringstream os;
    os << "B=" << p.batch << " T=" << p.seqLen << " Hk=" << p.numKeyHeads << " Hv=" << p.numValueHeads
       << " Dk=" << p.keyDim << " Dv=" << p.valueDim << " dtype=" << static_cast<int32_t>(p.dtype)
       << " stateType=" << static_cast<int32_t>(p.stateType);
    return os.str();
}

} // namespace

// ==================================================================== GatedDeltaRulePlugin

GatedDeltaRulePlugin::GatedDeltaRulePlugin(float scale, int32_t useQkL2norm)
    : mScale(scale)
    , mUseQkL2norm(useQkL2norm)
{
    GDN_PLUGIN_CHECK(std::isfinite(scale), kGDR_PLUGIN_NAME << ": field 'scale' must be finite, got " << scale);
    GDN_PLUGIN_CHECK(useQkL2norm == 0 || useQkL2norm == 1,
        kGDR_PLUGIN_NAME << ": field 'use_qk_l2norm' must be 0 or 1, got " << useQkL2norm);
    std::ostringstream os;
    os.precision(9);
    os << "scale=" << mScale << ",use_qk_l2norm=" << mUseQkL2norm;
    mDescription = os.str();
}

// ---------------------------------------------------------------------- IPluginV3

nvinfer1::IPluginCapability* GatedDeltaRulePlugin::getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
    case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuildV2*>(this);
    case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    }
    logError(std::string(kGDR_PLUGIN_NAME) + ": unknown capability type "
        + std::to_string(static_cast<int32_t>(type)));
    return nullptr;
}

nvinfer1::IPluginV3* GatedDeltaRulePlugin::clone() noexcept
{
    GDN_PLUGIN_TRY
    {
        return new GatedDeltaRulePlugin(mScale, mUseQkL2norm);
    }
    GDN_PLUGIN_CATCH("GatedDeltaRulePlugin::clone")
    return nullptr;
}

// ---------------------------------------------------------------------- IPluginV3OneCore

char const* GatedDeltaRulePlugin::getPluginName() const noexcept
{
    return kGDR_PLUGIN_NAME;
}

char const* GatedDeltaRulePlugin::getPluginVersion() const noexcept
{
    return kGDR_PLUGIN_VERSION;
}

char const* GatedDeltaRulePlugin::getPluginNamespace() const noexcept
{
    return kGDR_PLUGIN_NAMESPACE;
}

// ---------------------------------------------------------------------- IPluginV3OneBuild(V2)

int32_t GatedDeltaRulePlugin::getNbOutputs() const noexcept
{
    return IO::kNB_OUTPUTS;
}

int32_t GatedDeltaRulePlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    GDN_PLUGIN_TRY
    {
        checkCounts(nbInputs, nbOutputs);
        DataType const t = inputTypes[IO::kQ];
        GDN_PLUGIN_CHECK(isKernelFloat(t), kGDR_PLUGIN_NAME << ": q has dtype " << dataTypeName(t)
                                                            << "; only kFLOAT, kHALF and kBF16 are supported");
        for (int32_t i : {IO::kK, IO::kV, IO::kBETA})
        {
            GDN_PLUGIN_CHECK(inputTypes[i] == t, kGDR_PLUGIN_NAME << ": q, k, v and beta must share one dtype, but q is "
                                                                  << dataTypeName(t) << " and " << IO::inputName(i)
                                                                  << " is " << dataTypeName(inputTypes[i]));
        }
        GDN_PLUGIN_CHECK(inputTypes[IO::kG] == DataType::kFLOAT,
            kGDR_PLUGIN_NAME << ": g must be kFLOAT, got " << dataTypeName(inputTypes[IO::kG]));
        // The state's storage dtype is independent of T; final_state keeps it.
        DataType const st = inputTypes[IO::kINITIAL_STATE];
        GDN_PLUGIN_CHECK(isKernelFloat(st), kGDR_PLUGIN_NAME << ": initial_state has dtype " << dataTypeName(st)
                                                             << "; only kFLOAT, kHALF and kBF16 are supported");
        outputTypes[IO::kO] = t;
        outputTypes[IO::kFINAL_STATE] = st;
        return 0;
    }
    GDN_PLUGIN_CATCH("GatedDeltaRulePlugin::getOutputDataTypes")
    return -1;
}

int32_t GatedDeltaRulePlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
    DimsExprs const* /* shapeInputs */, int32_t /* nbShapeInputs */, DimsExprs* outputs, int32_t nbOutputs,
    nvinfer1::IExprBuilder& /* exprBuilder */) noexcept
{
    GDN_PLUGIN_TRY
    {
        checkCounts(nbInputs, nbOutputs);
        // Check what is known at build time: constants compare, symbolic dims pass as -1.
        Dims known[IO::kNB_INPUTS];
        for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
        {
            known[i].nbDims = inputs[i].nbDims;
            for (int32_t d = 0; d < inputs[i].nbDims; ++d)
            {
                known[i].d[d] = inputs[i].d[d]->isConstant() ? inputs[i].d[d]->getConstantValue() : -1;
            }
        }
        checkInputDims(known);
        // o [B, T, Hv, Dv] is v's shape; final_state is initial_state's shape.
        outputs[IO::kO] = inputs[IO::kV];
        outputs[IO::kFINAL_STATE] = inputs[IO::kINITIAL_STATE];
        return 0;
    }
    GDN_PLUGIN_CATCH("GatedDeltaRulePlugin::getOutputShapes")
    return -1;
}

bool GatedDeltaRulePlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    GDN_PLUGIN_TRY
    {
        checkCounts(nbInputs, nbOutputs);
        PluginTensorDesc const& desc = inOut[pos].desc;
        if (desc.format != TensorFormat::kLINEAR)
        {
            return false;
        }
        int32_t const oPos = nbInputs + IO::kO;
        int32_t const statePos = nbInputs + IO::kFINAL_STATE;
        if (pos == IO::kG)
        {
            return desc.type == DataType::kFLOAT;
        }
        if (pos == IO::kINITIAL_STATE)
        {
            return isKernelFloat(desc.type);
        }
        if (pos == statePos)
        {
            return desc.type == inOut[IO::kINITIAL_STATE].desc.type;
        }
        if (pos == IO::kQ)
        {
            return isKernelFloat(desc.type);
        }
        // k, v, beta and o follow q (decided at pos 0).
        GDN_PLUGIN_CHECK(pos == IO::kK || pos == IO::kV || pos == IO::kBETA || pos == oPos,
            kGDR_PLUGIN_NAME << ": supportsFormatCombination asked about position " << pos);
        return desc.type == inOut[IO::kQ].desc.type;
    }
    GDN_PLUGIN_CATCH("GatedDeltaRulePlugin::supportsFormatCombination")
    return false;
}

int32_t GatedDeltaRulePlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* /* out */,
    int32_t nbOutputs) noexcept
{
    GDN_PLUGIN_TRY
    {
        checkCounts(nbInputs, nbOutputs);
        Dims dims[IO::kNB_INPUTS];
        for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
        {
            dims[i] = in[i].desc.dims;
        }
        checkInputDims(dims);
        return 0;
    }
    GDN_PLUGIN_CATCH("GatedDeltaRulePlugin::configurePlugin")
    return -1;
}

size_t GatedDeltaRulePlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    DynamicPluginTensorDesc const* /* outputs */, int32_t nbOutputs) const noexcept
{
    GDN_PLUGIN_TRY
    {
        checkCounts(nbInputs, nbOutputs);
        // Sized for the profile's largest shapes, which covers every smaller one.
        Dims maxDims[IO::kNB_INPUTS];
        for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
        {
            maxDims[i] = inputs[i].max;
        }
        GatedDeltaRuleParams p = makeParams(maxDims, inputs[IO::kQ].desc.type, mScale, mUseQkL2norm);
        return gatedDeltaRuleWorkspaceSize(p);
    }
    GDN_PLUGIN_CATCH("GatedDeltaRulePlugin::getWorkspaceSize")
    return 0;
}

char const* GatedDeltaRulePlugin::getTimingCacheID() noexcept
{
    return mDescription.c_str();
}

char const* GatedDeltaRulePlugin::getMetadataString() noexcept
{
    return mDescription.c_str();
}

int32_t GatedDeltaRulePlugin::getAliasedInput(int32_t outputIndex) noexcept
{
    // The recurrent state is updated in place; the kernels allow initialState == finalState.
    return outputIndex == IO::kFINAL_STATE ? IO::kINITIAL_STATE : -1;
}

// ---------------------------------------------------------------------- IPluginV3OneRuntime

int32_t GatedDeltaRulePlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* /* out */, int32_t nbOutputs) noexcept
{
    GDN_PLUGIN_TRY
    {
        checkCounts(nbInputs, nbOutputs);
        Dims dims[IO::kNB_INPUTS];
        checkInputDims(collectDims(in, dims));
        return 0;
    }
    GDN_PLUGIN_CATCH("GatedDeltaRulePlugin::onShapeChange")
    return -1;
}

int32_t GatedDeltaRulePlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* outputDesc,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    GDN_PLUGIN_TRY
    {
        Dims dims[IO::kNB_INPUTS];
        GatedDeltaRuleParams p
            = makeParams(collectDims(inputDesc, dims), inputDesc[IO::kQ].type, mScale, mUseQkL2norm);
        p.q = inputs[IO::kQ];
        p.k = inputs[IO::kK];
        p.v = inputs[IO::kV];
        p.g = static_cast<float const*>(inputs[IO::kG]);
        p.beta = inputs[IO::kBETA];
        p.initialState = inputs[IO::kINITIAL_STATE];
        p.o = outputs[IO::kO];
        p.finalState = outputs[IO::kFINAL_STATE];
        p.stateType = toKernelDataType(inputDesc[IO::kINITIAL_STATE].type, "GatedDeltaRule initial_state");
        if (p.batch == 0)
        {
            return 0;
        }
        if (p.seqLen == 0)
        {
            // No tokens: the state passes through unchanged.
            if (p.finalState != p.initialState)
            {
                size_t const bytes = static_cast<size_t>(volume(outputDesc[IO::kFINAL_STATE].dims))
                    * (p.stateType == gdn::DataType::kFLOAT32 ? sizeof(float) : sizeof(uint16_t));
                cudaError_t const err
                    = cudaMemcpyAsync(p.finalState, p.initialState, bytes, cudaMemcpyDeviceToDevice, stream);
                GDN_PLUGIN_CHECK(err == cudaSuccess,
                    kGDR_PLUGIN_NAME << ": copying the state for T = 0 failed: " << cudaGetErrorString(err));
            }
            return 0;
        }
        cudaError_t const err = launchGatedDeltaRule(p, workspace, stream);
        GDN_PLUGIN_CHECK(err == cudaSuccess,
            kGDR_PLUGIN_NAME << ": launchGatedDeltaRule(" << paramsToString(p) << ") failed: " << cudaGetErrorName(err)
                             << " (" << cudaGetErrorString(err) << ")");
        return 0;
    }
    GDN_PLUGIN_CATCH("GatedDeltaRulePlugin::enqueue")
    return -1;
}

nvinfer1::IPluginV3* GatedDeltaRulePlugin::attachToContext(nvinfer1::IPluginResourceContext* /* context */) noexcept
{
    // No per-context resources: the workspace comes from TensorRT.
    return clone();
}

PluginFieldCollection const* GatedDeltaRulePlugin::getFieldsToSerialize() noexcept
{
    mFieldsToSerialize.clear();
    mFieldsToSerialize.emplace_back(kGDR_FIELD_SCALE, &mScale, PluginFieldType::kFLOAT32, 1);
    mFieldsToSerialize.emplace_back(kGDR_FIELD_USE_QK_L2NORM, &mUseQkL2norm, PluginFieldType::kINT32, 1);
    mFieldCollection.nbFields = static_cast<int32_t>(mFieldsToSerialize.size());
    mFieldCollection.fields = mFieldsToSerialize.data();
    return &mFieldCollection;
}

// ==================================================================== GatedDeltaRulePluginCreator

GatedDeltaRulePluginCreator::GatedDeltaRulePluginCreator()
{
    mFieldNames.emplace_back(kGDR_FIELD_SCALE, nullptr, PluginFieldType::kFLOAT32, 1);
    mFieldNames.emplace_back(kGDR_FIELD_USE_QK_L2NORM, nullptr, PluginFieldType::kINT32, 1);
    mFieldCollection.nbFields = static_cast<int32_t>(mFieldNames.size());
    mFieldCollection.fields = mFieldNames.data();
}

char const* GatedDeltaRulePluginCreator::getPluginName() const noexcept
{
    return kGDR_PLUGIN_NAME;
}

char const* GatedDeltaRulePluginCreator::getPluginVersion() const noexcept
{
    return kGDR_PLUGIN_VERSION;
}

char const* GatedDeltaRulePluginCreator::getPluginNamespace() const noexcept
{
    return kGDR_PLUGIN_NAMESPACE;
}

PluginFieldCollection const* GatedDeltaRulePluginCreator::getFieldNames() noexcept
{
    return &mFieldCollection;
}

nvinfer1::IPluginV3* GatedDeltaRulePluginCreator::createPlugin(
    char const* name, PluginFieldCollection const* fc, nvinfer1::TensorRTPhase /* phase */) noexcept
{
    GDN_PLUGIN_TRY
    {
        // Both phases get the same fields: the ONNX attributes at build time, getFieldsToSerialize() at run time.
        std::string const who = std::string(kGDR_PLUGIN_NAME) + " '" + (name != nullptr ? name : "") + "'";
        FieldReader const fields(who.c_str(), fc);
        float const scale = fields.getFloat32(kGDR_FIELD_SCALE);
        int32_t const useQkL2norm = fields.getInt32(kGDR_FIELD_USE_QK_L2NORM);
        return new GatedDeltaRulePlugin(scale, useQkL2norm);
    }
    GDN_PLUGIN_CATCH("GatedDeltaRulePluginCreator::createPlugin")
    return nullptr;
}

} // namespace plugin
} // namespace gdn
