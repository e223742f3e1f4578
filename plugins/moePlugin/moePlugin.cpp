#include "moePlugin.h"

#include "moeKernels.h"

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
using IO = MoEIO;

char const* MoEIO::inputName(int32_t i) noexcept
{
    static char const* const kNames[kNB_INPUTS] = {"hidden", "router_logits", "gate_up", "down"};
    return i >= 0 && i < kNB_INPUTS ? kNames[i] : "(no such input)";
}

namespace
{

constexpr int32_t kINPUT_RANKS[IO::kNB_INPUTS] = {2, 2, 3, 3};

void checkCounts(int32_t nbInputs, int32_t nbOutputs)
{
    GDN_PLUGIN_CHECK(nbInputs == IO::kNB_INPUTS && nbOutputs == IO::kNB_OUTPUTS,
        kMOE_PLUGIN_NAME << " takes " << IO::kNB_INPUTS << " inputs (hidden, router_logits, gate_up, down) and gives "
                         << IO::kNB_OUTPUTS << " output (out), got " << nbInputs << " and " << nbOutputs);
}

//! Checks ranks, shared dims and top_k against E; a dim < 0 (unknown at build time) matches anything.
void checkInputDims(Dims const* in, int32_t topK)
{
    for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
    {
        GDN_PLUGIN_CHECK(in[i].nbDims == kINPUT_RANKS[i], kMOE_PLUGIN_NAME << ": " << IO::inputName(i)
                                                          << " must have rank " << kINPUT_RANKS[i] << ", got "
                                                          << dimsToString(in[i]));
    }
    auto same = [&](int32_t a, int32_t da, int32_t b, int32_t db, int64_t factor, char const* what) {
        int64_t const x = in[a].d[da];
        int64_t const y = in[b].d[db];
        GDN_PLUGIN_CHECK(x < 0 || y < 0 || x == factor * y,
            kMOE_PLUGIN_NAME << ": " << what << " differs: " << IO::inputName(a) << " " << dimsToString(in[a])
                             << " vs " << IO::inputName(b) << " " << dimsToString(in[b]));
    };
    same(IO::kHIDDEN, 0, IO::kROUTER_LOGITS, 0, 1, "tokens N");
    same(IO::kROUTER_LOGITS, 1, IO::kGATE_UP, 0, 1, "experts E");
    same(IO::kROUTER_LOGITS, 1, IO::kDOWN, 0, 1, "experts E");
    same(IO::kHIDDEN, 1, IO::kGATE_UP, 2, 1, "hidden size H");
    same(IO::kHIDDEN, 1, IO::kDOWN, 1, 1, "hidden size H");
    same(IO::kGATE_UP, 1, IO::kDOWN, 2, 2, "intermediate size (gate_up has 2I rows)");
    int64_t const e = in[IO::kROUTER_LOGITS].d[1];
    GDN_PLUGIN_CHECK(e < 0 || (e >= 1 && e <= kMOE_MAX_EXPERTS),
        kMOE_PLUGIN_NAME << ": " << e << " experts; 1.." << kMOE_MAX_EXPERTS << " are supported");
    GDN_PLUGIN_CHECK(e < 0 || topK <= e, kMOE_PLUGIN_NAME << ": top_k = " << topK << " exceeds the " << e << " experts");
}

MoEParams makeParams(PluginTensorDesc const* in, int32_t topK, int32_t normTopkProb)
{
    MoEParams p;
    p.dtype = toKernelDataType(in[IO::kHIDDEN].type, "MoE hidden");
    p.numTokens = dimAsInt32(in[IO::kHIDDEN].dims, 0, "hidden");
    p.hiddenSize = dimAsInt32(in[IO::kHIDDEN].dims, 1, "hidden");
    p.numExperts = dimAsInt32(in[IO::kROUTER_LOGITS].dims, 1, "router_logits");
    p.interSize = dimAsInt32(in[IO::kDOWN].dims, 2, "down");
    p.topK = topK;
    p.normTopkProb = normTopkProb != 0;
    return p;
}

} // namespace

// ==================================================================== MoEPlugin

MoEPlugin::MoEPlugin(int32_t topK, int32_t normTopkProb)
    : mTopK(topK)
    , mNormTopkProb(normTopkProb)
{
    GDN_PLUGIN_CHECK(topK >= 1 && topK <= kMOE_MAX_TOP_K,
        kMOE_PLUGIN_NAME << ": field 'top_k' must be 1.." << kMOE_MAX_TOP_K << ", got " << topK);
    GDN_PLUGIN_CHECK(normTopkProb == 0 || normTopkProb == 1,
        kMOE_PLUGIN_NAME << ": field 'norm_topk_prob' must be 0 or 1, got " << normTopkProb);
    mDescription = "top_k=" + std::to_string(mTopK) + ",norm_topk_prob=" + std::to_string(mNormTopkProb);
}

// ---------------------------------------------------------------------- IPluginV3

nvinfer1::IPluginCapability* MoEPlugin::getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
    case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuildV2*>(this);
    case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    }
    logError(std::string(kMOE_PLUGIN_NAME) + ": unknown capability type " + std::to_string(static_cast<int32_t>(type)));
    return nullptr;
}

nvinfer1::IPluginV3* MoEPlugin::clone() noexcept
{
    GDN_PLUGIN_TRY
    {
        return new MoEPlugin(mTopK, mNormTopkProb);
    }
    GDN_PLUGIN_CATCH("MoEPlugin::clone")
    return nullptr;
}

// ---------------------------------------------------------------------- IPluginV3OneCore

char const* MoEPlugin::getPluginName() const noexcept
{
    return kMOE_PLUGIN_NAME;
}

char const* MoEPlugin::getPluginVersion() const noexcept
{
    return kMOE_PLUGIN_VERSION;
}

char const* MoEPlugin::getPluginNamespace() const noexcept
{
    return kMOE_PLUGIN_NAMESPACE;
}

// ---------------------------------------------------------------------- IPluginV3OneBuild(V2)

int32_t MoEPlugin::getNbOutputs() const noexcept
{
    return IO::kNB_OUTPUTS;
}

int32_t MoEPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    GDN_PLUGIN_TRY
    {
        checkCounts(nbInputs, nbOutputs);
        DataType const t = inputTypes[IO::kHIDDEN];
        GDN_PLUGIN_CHECK(isKernelFloat(t), kMOE_PLUGIN_NAME << ": hidden has dtype " << dataTypeName(t)
                                                            << "; only kFLOAT, kHALF and kBF16 are supported");
        for (int32_t i = 1; i < IO::kNB_INPUTS; ++i)
        {
            GDN_PLUGIN_CHECK(inputTypes[i] == t, kMOE_PLUGIN_NAME << ": hidden, router_logits, gate_up and down must "
                                                                     "share one dtype, but hidden is "
                                                                  << dataTypeName(t) << " and " << IO::inputName(i)
                                                                  << " is " << dataTypeName(inputTypes[i]));
        }
        outputTypes[IO::kOUT] = t;
        return 0;
    }
    GDN_PLUGIN_CATCH("MoEPlugin::getOutputDataTypes")
    return -1;
}

int32_t MoEPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /* shapeInputs */,
    int32_t /* nbShapeInputs */, DimsExprs* outputs, int32_t nbOutputs, nvinfer1::IExprBuilder& /* exprBuilder */) noexcept
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
        checkInputDims(known, mTopK);
        outputs[IO::kOUT] = inputs[IO::kHIDDEN];
        return 0;
    }
    GDN_PLUGIN_CATCH("MoEPlugin::getOutputShapes")
    return -1;
}

bool MoEPlugin::supportsFormatCombination(
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
        // Everything follows hidden (decided at pos 0).
        return pos == IO::kHIDDEN ? isKernelFloat(desc.type) : desc.type == inOut[IO::kHIDDEN].desc.type;
    }
    GDN_PLUGIN_CATCH("MoEPlugin::supportsFormatCombination")
    return false;
}

int32_t MoEPlugin::configurePlugin(DynamicPluginTensorDesc const* in, int32_t nbInputs,
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
        checkInputDims(dims, mTopK);
        return 0;
    }
    GDN_PLUGIN_CATCH("MoEPlugin::configurePlugin")
    return -1;
}

size_t MoEPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    DynamicPluginTensorDesc const* /* outputs */, int32_t nbOutputs) const noexcept
{
    GDN_PLUGIN_TRY
    {
        checkCounts(nbInputs, nbOutputs);
        // The largest N of the profile sizes the per-pair buffers.
        MoEParams p;
        p.numTokens = dimAsInt32(inputs[IO::kHIDDEN].max, 0, "hidden (max)");
        p.hiddenSize = dimAsInt32(inputs[IO::kHIDDEN].max, 1, "hidden (max)");
        p.numExperts = dimAsInt32(inputs[IO::kROUTER_LOGITS].max, 1, "router_logits (max)");
        p.interSize = dimAsInt32(inputs[IO::kDOWN].max, 2, "down (max)");
        p.topK = mTopK;
        return moeWorkspaceSize(p);
    }
    GDN_PLUGIN_CATCH("MoEPlugin::getWorkspaceSize")
    return 0;
}

char const* MoEPlugin::getTimingCacheID() noexcept
{
    return mDescription.c_str();
}

char const* MoEPlugin::getMetadataString() noexcept
{
    return mDescription.c_str();
}

// ---------------------------------------------------------------------- IPluginV3OneRuntime

int32_t MoEPlugin::onShapeChange(
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
        checkInputDims(dims, mTopK);
        return 0;
    }
    GDN_PLUGIN_CATCH("MoEPlugin::onShapeChange")
    return -1;
}

int32_t MoEPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /* outputDesc */,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    GDN_PLUGIN_TRY
    {
        MoEParams p = makeParams(inputDesc, mTopK, mNormTopkProb);
        p.hidden = inputs[IO::kHIDDEN];
        p.routerLogits = inputs[IO::kROUTER_LOGITS];
        p.gateUp = inputs[IO::kGATE_UP];
        p.down = inputs[IO::kDOWN];
        p.out = outputs[IO::kOUT];
        if (p.numTokens == 0)
        {
            return 0;
        }
        cudaError_t const err = launchMoE(p, workspace, stream);
        GDN_PLUGIN_CHECK(err == cudaSuccess,
            kMOE_PLUGIN_NAME << ": launchMoE(N=" << p.numTokens << " H=" << p.hiddenSize << " E=" << p.numExperts
                             << " I=" << p.interSize << " top_k=" << p.topK << ") failed: " << cudaGetErrorName(err)
                             << " (" << cudaGetErrorString(err) << ")");
        return 0;
    }
    GDN_PLUGIN_CATCH("MoEPlugin::enqueue")
    return -1;
}

nvinfer1::IPluginV3* MoEPlugin::attachToContext(nvinfer1::IPluginResourceContext* /* context */) noexcept
{
    return clone();
}

PluginFieldCollection const* MoEPlugin::getFieldsToSerialize() noexcept
{
    mFieldsToSerialize.clear();
    mFieldsToSerialize.emplace_back(kMOE_FIELD_TOP_K, &mTopK, PluginFieldType::kINT32, 1);
    mFieldsToSerialize.emplace_back(kMOE_FIELD_NORM_TOPK_PROB, &mNormTopkProb, PluginFieldType::kINT32, 1);
    mFieldCollection.nbFields = static_cast<int32_t>(mFieldsToSerialize.size());
    mFieldCollection.fields = mFieldsToSerialize.data();
    return &mFieldCollection;
}

// ==================================================================== MoEPluginCreator

MoEPluginCreator::MoEPluginCreator()
{
    mFieldNames.emplace_back(kMOE_FIELD_TOP_K, nullptr, PluginFieldType::kINT32, 1);
    mFieldNames.emplace_back(kMOE_FIELD_NORM_TOPK_PROB, nullptr, PluginFieldType::kINT32, 1);
    mFieldCollection.nbFields = static_cast<int32_t>(mFieldNames.size());
    mFieldCollection.fields = mFieldNames.data();
}

char const* MoEPluginCreator::getPluginName() const noexcept
{
    return kMOE_PLUGIN_NAME;
}

char const* MoEPluginCreator::getPluginVersion() const noexcept
{
    return kMOE_PLUGIN_VERSION;
}

char const* MoEPluginCreator::getPluginNamespace() const noexcept
{
    return kMOE_PLUGIN_NAMESPACE;
}

PluginFieldCollection const* MoEPluginCreator::getFieldNames() noexcept
{
    return &mFieldCollection;
}

nvinfer1::IPluginV3* MoEPluginCreator::createPlugin(
    char const* name, PluginFieldCollection const* fc, nvinfer1::TensorRTPhase /* phase */) noexcept
{
    GDN_PLUGIN_TRY
    {
        std::string const who = std::string(kMOE_PLUGIN_NAME) + " '" + (name != nullptr ? name : "") + "'";
        FieldReader const fields(who.c_str(), fc);
        return new MoEPlugin(fields.getInt32(kMOE_FIELD_TOP_K), fields.getInt32(kMOE_FIELD_NORM_TOPK_PROB));
    }
    GDN_PLUGIN_CATCH("MoEPluginCreator::createPlugin")
    return nullptr;
}

} // namespace plugin
} // namespace gdn
