#include "moePlugin.h"

#include "moe/cuda/moeKernels.h"

namespace gdn
{
namespace plugin
{

using nvinfer1::DataType;
using nvinfer1::Dims;
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::PluginTensorDesc;
using IO = MoEIO;

char const* MoEIO::inputName(int32_t i) noexcept
{
    static char const* const kNames[kNB_INPUTS] = {"hidden", "router_logits", "gate_up", "down"};
    return i >= 0 && i < kNB_INPUTS ? kNames[i] : "(no such input)";
}

char const* MoEIO::outputName(int32_t i) noexcept
{
    static char const* const kNames[kNB_OUTPUTS] = {"out"};
    return i >= 0 && i < kNB_OUTPUTS ? kNames[i] : "(no such output)";
}

namespace
{

constexpr int32_t kINPUT_RANKS[IO::kNB_INPUTS] = {2, 2, 3, 3};

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

MoEPlugin::MoEPlugin(Fields const& fields)
    : PluginBase(fields)
{
    GDN_PLUGIN_CHECK(fields.topK >= 1 && fields.topK <= kMOE_MAX_TOP_K,
        kMOE_PLUGIN_NAME << ": field 'top_k' must be 1.." << kMOE_MAX_TOP_K << ", got " << fields.topK);
    GDN_PLUGIN_CHECK(fields.normTopkProb == 0 || fields.normTopkProb == 1,
        kMOE_PLUGIN_NAME << ": field 'norm_topk_prob' must be 0 or 1, got " << fields.normTopkProb);
}

//! Checks ranks, shared dims and top_k against E; a dim < 0 (unknown at build time) matches anything.
void MoEPlugin::checkInputDims(Dims const* in) const
{
    checkRanks(in, kINPUT_RANKS);
    checkSameDim(in, IO::kHIDDEN, 0, IO::kROUTER_LOGITS, 0, "tokens N");
    checkSameDim(in, IO::kROUTER_LOGITS, 1, IO::kGATE_UP, 0, "experts E");
    checkSameDim(in, IO::kROUTER_LOGITS, 1, IO::kDOWN, 0, "experts E");
    checkSameDim(in, IO::kHIDDEN, 1, IO::kGATE_UP, 2, "hidden size H");
    checkSameDim(in, IO::kHIDDEN, 1, IO::kDOWN, 1, "hidden size H");
    int64_t const twoI = in[IO::kGATE_UP].d[1];
    int64_t const i = in[IO::kDOWN].d[2];
    GDN_PLUGIN_CHECK(twoI < 0 || i < 0 || twoI == 2 * i,
        kMOE_PLUGIN_NAME << ": intermediate size (gate_up has 2I rows) differs: gate_up "
                         << dimsToString(in[IO::kGATE_UP]) << " vs down " << dimsToString(in[IO::kDOWN]));
    int64_t const e = in[IO::kROUTER_LOGITS].d[1];
    GDN_PLUGIN_CHECK(e < 0 || (e >= 1 && e <= kMOE_MAX_EXPERTS),
        kMOE_PLUGIN_NAME << ": " << e << " experts; 1.." << kMOE_MAX_EXPERTS << " are supported");
    GDN_PLUGIN_CHECK(e < 0 || fields().topK <= e,
        kMOE_PLUGIN_NAME << ": top_k = " << fields().topK << " exceeds the " << e << " experts");
}

//! The dtype rule, all of it: every tensor has hidden's dtype.
DataType MoEPlugin::typeAt(int32_t /* pos */, DataType const* types) const
{
    return types[IO::kHIDDEN];
}

void MoEPlugin::inferOutputShapes(DimsExprs const* in, DimsExprs* out, nvinfer1::IExprBuilder& /* eb */) const
{
    out[IO::kOUT] = in[IO::kHIDDEN];
}

size_t MoEPlugin::workspaceBytes(DynamicPluginTensorDesc const* in, DynamicPluginTensorDesc const* /* out */) const
{
    // The largest N of the profile sizes the per-pair buffers.
    MoEParams p;
    p.numTokens = dimAsInt32(in[IO::kHIDDEN].max, 0, "hidden (max)");
    p.hiddenSize = dimAsInt32(in[IO::kHIDDEN].max, 1, "hidden (max)");
    p.numExperts = dimAsInt32(in[IO::kROUTER_LOGITS].max, 1, "router_logits (max)");
    p.interSize = dimAsInt32(in[IO::kDOWN].max, 2, "down (max)");
    p.topK = fields().topK;
    return moeWorkspaceSize(p);
}

void MoEPlugin::launch(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /* outputDesc */,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) const
{
    MoEParams p = makeParams(inputDesc, fields().topK, fields().normTopkProb);
    p.hidden = inputs[IO::kHIDDEN];
    p.routerLogits = inputs[IO::kROUTER_LOGITS];
    p.gateUp = inputs[IO::kGATE_UP];
    p.down = inputs[IO::kDOWN];
    p.out = outputs[IO::kOUT];
    if (p.numTokens == 0)
    {
        return;
    }
    cudaError_t const err = launchMoE(p, workspace, stream);
    GDN_PLUGIN_CHECK(err == cudaSuccess,
        kMOE_PLUGIN_NAME << ": launchMoE(N=" << p.numTokens << " H=" << p.hiddenSize << " E=" << p.numExperts
                         << " I=" << p.interSize << " top_k=" << p.topK << ") failed: " << cudaGetErrorName(err)
                         << " (" << cudaGetErrorString(err) << ")");
}

} // namespace plugin
} // namespace gdn
