#include "causalConv1dPlugin.h"

#include "causalConv1dKernels.h"

#include "../common/checks.h"
#include "../common/fields.h"
#include "../common/tensors.h"

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
using IO = CausalConv1dIO;

char const* CausalConv1dIO::inputName(int32_t i) noexcept
{
    static char const* const kNames[kNB_INPUTS] = {"x", "weight", "bias", "conv_state"};
    return i >= 0 && i < kNB_INPUTS ? kNames[i] : "(no such input)";
}

char const* CausalConv1dIO::outputName(int32_t i) noexcept
{
    static char const* const kNames[kNB_OUTPUTS] = {"y", "new_conv_state"};
    return i >= 0 && i < kNB_OUTPUTS ? kNames[i] : "(no such output)";
}

namespace
{

constexpr int32_t kINPUT_RANKS[IO::kNB_INPUTS] = {3, 2, 1, 3};

void checkCounts(int32_t nbInputs, int32_t nbOutputs)
{
    GDN_PLUGIN_CHECK(nbInputs == IO::kNB_INPUTS && nbOutputs == IO::kNB_OUTPUTS,
        kCONV_PLUGIN_NAME << " takes " << IO::kNB_INPUTS << " inputs (x, weight, bias, conv_state) and gives "
                          << IO::kNB_OUTPUTS << " outputs (y, new_conv_state), got " << nbInputs << " and "
                          << nbOutputs);
}

//! Checks ranks and shared dims; a dim < 0 (unknown at build time) matches anything.
void checkInputDims(Dims const* in)
{
    for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
    {
        GDN_PLUGIN_CHECK(in[i].nbDims == kINPUT_RANKS[i], kCONV_PLUGIN_NAME << ": " << IO::inputName(i)
                                                          << " must have rank " << kINPUT_RANKS[i] << ", got "
                                                          << dimsToString(in[i]));
    }
    auto same = [&](int32_t a, int32_t da, int32_t b, int32_t db, char const* what) {
        int64_t const x = in[a].d[da];
        int64_t const y = in[b].d[db];
        GDN_PLUGIN_CHECK(x < 0 || y < 0 || x == y,
            kCONV_PLUGIN_NAME << ": " << what << " differs: " << IO::inputName(a) << " " << dimsToString(in[a])
                              << " vs " << IO::inputName(b) << " " << dimsToString(in[b]));
    };
    same(IO::kX, 2, IO::kWEIGHT, 0, "channels C");
    same(IO::kX, 2, IO::kBIAS, 0, "channels C");
    same(IO::kX, 2, IO::kCONV_STATE, 1, "channels C");
    same(IO::kX, 0, IO::kCONV_STATE, 0, "batch B");
    int64_t const k = in[IO::kWEIGHT].d[1];
    int64_t const w = in[IO::kCONV_STATE].d[2];
    GDN_PLUGIN_CHECK(k < 0 || k >= 1, kCONV_PLUGIN_NAME << ": weight " << dimsToString(in[IO::kWEIGHT])
                                                        << " needs a kernel size K >= 1");
    GDN_PLUGIN_CHECK(k < 0 || w < 0 || w == k - 1,
        kCONV_PLUGIN_NAME << ": conv_state " << dimsToString(in[IO::kCONV_STATE]) << " must be [B, C, K-1] with K = "
                          << k << " from weight " << dimsToString(in[IO::kWEIGHT]));
}

CausalConv1dParams makeParams(PluginTensorDesc const* in, int32_t activation)
{
    CausalConv1dParams p;
    p.dtype = toKernelDataType(in[IO::kX].type, "CausalConv1d x");
    p.batch = dimAsInt32(in[IO::kX].dims, 0, "x");
    p.seqLen = dimAsInt32(in[IO::kX].dims, 1, "x");
    p.channels = dimAsInt32(in[IO::kX].dims, 2, "x");
    p.kernelSize = dimAsInt32(in[IO::kWEIGHT].dims, 1, "weight");
    p.silu = activation == kCONV_ACTIVATION_SILU;
    return p;
}

} // namespace

// ==================================================================== CausalConv1dPlugin

CausalConv1dPlugin::CausalConv1dPlugin(int32_t activation)
    : mActivation(activation)
{
    GDN_PLUGIN_CHECK(activation == kCONV_ACTIVATION_NONE || activation == kCONV_ACTIVATION_SILU,
        kCONV_PLUGIN_NAME << ": field 'activation' must be 0 (none) or 1 (SiLU), got " << activation);
    mDescription = "activation=" + std::to_string(mActivation);
}

// ---------------------------------------------------------------------- IPluginV3

nvinfer1::IPluginCapability* CausalConv1dPlugin::getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
    case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuildV2*>(this);
    case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    }
    logError(std::string(kCONV_PLUGIN_NAME) + ": unknown capability type "
        + std::to_string(static_cast<int32_t>(type)));
    return nullptr;
}

nvinfer1::IPluginV3* CausalConv1dPlugin::clone() noexcept
{
    GDN_PLUGIN_TRY
    {
        return new CausalConv1dPlugin(mActivation);
    }
    GDN_PLUGIN_CATCH("CausalConv1dPlugin::clone")
    return nullptr;
}

// ---------------------------------------------------------------------- IPluginV3OneCore

char const* CausalConv1dPlugin::getPluginName() const noexcept
{
    return kCONV_PLUGIN_NAME;
}

char const* CausalConv1dPlugin::getPluginVersion() const noexcept
{
    return kCONV_PLUGIN_VERSION;
}

char const* CausalConv1dPlugin::getPluginNamespace() const noexcept
{
    return kCONV_PLUGIN_NAMESPACE;
}

// ---------------------------------------------------------------------- IPluginV3OneBuild(V2)

int32_t CausalConv1dPlugin::getNbOutputs() const noexcept
{
    return IO::kNB_OUTPUTS;
}

int32_t CausalConv1dPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    GDN_PLUGIN_TRY
    {
        checkCounts(nbInputs, nbOutputs);
        DataType const t = inputTypes[IO::kX];
        GDN_PLUGIN_CHECK(isKernelFloat(t), kCONV_PLUGIN_NAME << ": x has dtype " << dataTypeName(t)
                                                             << "; only kFLOAT, kHALF and kBF16 are supported");
        for (int32_t i = 1; i < IO::kNB_INPUTS; ++i)
        {
            GDN_PLUGIN_CHECK(inputTypes[i] == t, kCONV_PLUGIN_NAME << ": x, weight, bias and conv_state must share "
                                                                      "one dtype, but x is "
                                                                   << dataTypeName(t) << " and " << IO::inputName(i)
                                                                   << " is " << dataTypeName(inputTypes[i]));
        }
        outputTypes[IO::kY] = t;
        outputTypes[IO::kNEW_CONV_STATE] = t;
        return 0;
    }
    GDN_PLUGIN_CATCH("CausalConv1dPlugin::getOutputDataTypes")
    return -1;
}

int32_t CausalConv1dPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
    DimsExprs const* /* shapeInputs */, int32_t /* nbShapeInputs */, DimsExprs* outputs, int32_t nbOutputs,
    nvinfer1::IExprBuilder& /* exprBuilder */) noexcept
{
    GDN_PLUGIN_TRY
    {
        checkCounts(nbInputs, nbOutputs);
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
        outputs[IO::kY] = inputs[IO::kX];
        outputs[IO::kNEW_CONV_STATE] = inputs[IO::kCONV_STATE];
        return 0;
    }
    GDN_PLUGIN_CATCH("CausalConv1dPlugin::getOutputShapes")
    return -1;
}

bool CausalConv1dPlugin::supportsFormatCombination(
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
        // Everything follows x (decided at pos 0).
        return pos == IO::kX ? isKernelFloat(desc.type) : desc.type == inOut[IO::kX].desc.type;
    }
    GDN_PLUGIN_CATCH("CausalConv1dPlugin::supportsFormatCombination")
    return false;
}

int32_t CausalConv1dPlugin::configurePlugin(DynamicPluginTensorDesc const* in, int32_t nbInputs,
    DynamicPluginTensorDesc const* /* out */, int32_t nbOutputs) noexcept
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
    GDN_PLUGIN_CATCH("CausalConv1dPlugin::configurePlugin")
    return -1;
}

size_t CausalConv1dPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* /* inputs */, int32_t /* nbInputs */,
    DynamicPluginTensorDesc const* /* outputs */, int32_t /* nbOutputs */) const noexcept
{
    return 0;
}

char const* CausalConv1dPlugin::getTimingCacheID() noexcept
{
    return mDescription.c_str();
}

char const* CausalConv1dPlugin::getMetadataString() noexcept
{
    return mDescription.c_str();
}

int32_t CausalConv1dPlugin::getAliasedInput(int32_t outputIndex) noexcept
{
    // The rolling state is updated in place; the kernels allow convState == newConvState.
    return outputIndex == IO::kNEW_CONV_STATE ? IO::kCONV_STATE : -1;
}

// ---------------------------------------------------------------------- IPluginV3OneRuntime

int32_t CausalConv1dPlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* /* out */, int32_t nbOutputs) noexcept
{
    GDN_PLUGIN_TRY
    {
        checkCounts(nbInputs, nbOutputs);
        Dims dims[IO::kNB_INPUTS];
        for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
        {
            dims[i] = in[i].dims;
        }
        checkInputDims(dims);
        return 0;
    }
    GDN_PLUGIN_CATCH("CausalConv1dPlugin::onShapeChange")
    return -1;
}

int32_t CausalConv1dPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* outputDesc,
    void const* const* inputs, void* const* outputs, void* /* workspace */, cudaStream_t stream) noexcept
{
    GDN_PLUGIN_TRY
    {
        CausalConv1dParams p = makeParams(inputDesc, mActivation);
        p.x = inputs[IO::kX];
        p.weight = inputs[IO::kWEIGHT];
        p.bias = inputs[IO::kBIAS];
        p.convState = inputs[IO::kCONV_STATE];
        p.y = outputs[IO::kY];
        p.newConvState = outputs[IO::kNEW_CONV_STATE];
        if (p.batch == 0 || p.channels == 0)
        {
            return 0;
        }
        if (p.seqLen == 0)
        {
            // No tokens: the state passes through unchanged.
            size_t const bytes = static_cast<size_t>(volume(outputDesc[IO::kNEW_CONV_STATE].dims))
                * elementSize(inputDesc[IO::kX].type);
            if (bytes > 0 && p.newConvState != p.convState)
            {
                cudaError_t const err
                    = cudaMemcpyAsync(p.newConvState, p.convState, bytes, cudaMemcpyDeviceToDevice, stream);
                GDN_PLUGIN_CHECK(err == cudaSuccess,
                    kCONV_PLUGIN_NAME << ": copying the state for T = 0 failed: " << cudaGetErrorString(err));
            }
            return 0;
        }
        cudaError_t const err = launchCausalConv1d(p, stream);
        GDN_PLUGIN_CHECK(err == cudaSuccess,
            kCONV_PLUGIN_NAME << ": launchCausalConv1d(B=" << p.batch << " T=" << p.seqLen << " C=" << p.channels
                              << " K=" << p.kernelSize << ") failed: " << cudaGetErrorName(err) << " ("
                              << cudaGetErrorString(err) << ")");
        return 0;
    }
    GDN_PLUGIN_CATCH("CausalConv1dPlugin::enqueue")
    return -1;
}

nvinfer1::IPluginV3* CausalConv1dPlugin::attachToContext(nvinfer1::IPluginResourceContext* /* context */) noexcept
{
    return clone();
}

PluginFieldCollection const* CausalConv1dPlugin::getFieldsToSerialize() noexcept
{
    mFieldsToSerialize.clear();
    mFieldsToSerialize.emplace_back(kCONV_FIELD_ACTIVATION, &mActivation, PluginFieldType::kINT32, 1);
    mFieldCollection.nbFields = static_cast<int32_t>(mFieldsToSerialize.size());
    mFieldCollection.fields = mFieldsToSerialize.data();
    return &mFieldCollection;
}

// ==================================================================== CausalConv1dPluginCreator

CausalConv1dPluginCreator::CausalConv1dPluginCreator()
{
    mFieldNames.emplace_back(kCONV_FIELD_ACTIVATION, nullptr, PluginFieldType::kINT32, 1);
    mFieldCollection.nbFields = static_cast<int32_t>(mFieldNames.size());
    mFieldCollection.fields = mFieldNames.data();
}

char const* CausalConv1dPluginCreator::getPluginName() const noexcept
{
    return kCONV_PLUGIN_NAME;
}

char const* CausalConv1dPluginCreator::getPluginVersion() const noexcept
{
    return kCONV_PLUGIN_VERSION;
}

char const* CausalConv1dPluginCreator::getPluginNamespace() const noexcept
{
    return kCONV_PLUGIN_NAMESPACE;
}

PluginFieldCollection const* CausalConv1dPluginCreator::getFieldNames() noexcept
{
    return &mFieldCollection;
}

nvinfer1::IPluginV3* CausalConv1dPluginCreator::createPlugin(
    char const* name, PluginFieldCollection const* fc, nvinfer1::TensorRTPhase /* phase */) noexcept
{
    GDN_PLUGIN_TRY
    {
        std::string const who = std::string(kCONV_PLUGIN_NAME) + " '" + (name != nullptr ? name : "") + "'";
        FieldReader const fields(who.c_str(), fc);
        return new CausalConv1dPlugin(fields.getInt32(kCONV_FIELD_ACTIVATION));
    }
    GDN_PLUGIN_CATCH("CausalConv1dPluginCreator::createPlugin")
    return nullptr;
}

} // namespace plugin
} // namespace gdn
