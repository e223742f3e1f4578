#include "causalConv1dPlugin.h"

#include "causal_conv1d/cuda/causalConv1dKernels.h"

namespace gdn
{
namespace plugin
{

using nvinfer1::DataType;
using nvinfer1::Dims;
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::PluginTensorDesc;
using IO = CausalConv1dIO;

char const* CausalConv1dIO::inputName(int32_t i) noexcept
{
    static char const* const kNames[kNB_INPUTS] = {"x", "weight", "bias", "conv_state", "seq_lens"};
    return i >= 0 && i < kNB_INPUTS ? kNames[i] : "(no such input)";
}

char const* CausalConv1dIO::outputName(int32_t i) noexcept
{
    static char const* const kNames[kNB_OUTPUTS] = {"y", "new_conv_state"};
    return i >= 0 && i < kNB_OUTPUTS ? kNames[i] : "(no such output)";
}

namespace
{

constexpr int32_t kINPUT_RANKS[IO::kNB_INPUTS] = {3, 2, 1, 3, 1};

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

CausalConv1dPlugin::CausalConv1dPlugin(Fields const& fields)
    : PluginBase(fields)
{
    GDN_PLUGIN_CHECK(fields.activation == kCONV_ACTIVATION_NONE || fields.activation == kCONV_ACTIVATION_SILU,
        kCONV_PLUGIN_NAME << ": field 'activation' must be 0 (none) or 1 (SiLU), got " << fields.activation);
}

//! Checks ranks and shared dims; a dim < 0 (unknown at build time) matches anything.
void CausalConv1dPlugin::checkInputDims(Dims const* in)
{
    checkRanks(in, kINPUT_RANKS);
    checkSameDim(in, IO::kX, 2, IO::kWEIGHT, 0, "channels C");
    checkSameDim(in, IO::kX, 2, IO::kBIAS, 0, "channels C");
    checkSameDim(in, IO::kX, 2, IO::kCONV_STATE, 1, "channels C");
    checkSameDim(in, IO::kX, 0, IO::kCONV_STATE, 0, "batch B");
    checkSameDim(in, IO::kX, 0, IO::kSEQ_LENS, 0, "batch B");
    int64_t const k = in[IO::kWEIGHT].d[1];
    int64_t const w = in[IO::kCONV_STATE].d[2];
    GDN_PLUGIN_CHECK(k < 0 || k >= 1, kCONV_PLUGIN_NAME << ": weight " << dimsToString(in[IO::kWEIGHT])
                                                        << " needs a kernel size K >= 1");
    GDN_PLUGIN_CHECK(k < 0 || w < 0 || w == k - 1,
        kCONV_PLUGIN_NAME << ": conv_state " << dimsToString(in[IO::kCONV_STATE]) << " must be [B, C, K-1] with K = "
                          << k << " from weight " << dimsToString(in[IO::kWEIGHT]));
}

//! The dtype rules, all of them: seq_lens is int32, every other tensor has x's dtype.
DataType CausalConv1dPlugin::typeAt(int32_t pos, DataType const* types) const
{
    return pos == IO::kSEQ_LENS ? DataType::kINT32 : types[IO::kX];
}

void CausalConv1dPlugin::inferOutputShapes(DimsExprs const* in, DimsExprs* out, nvinfer1::IExprBuilder& /* eb */) const
{
    out[IO::kY] = in[IO::kX];
    out[IO::kNEW_CONV_STATE] = in[IO::kCONV_STATE];
}

void CausalConv1dPlugin::launch(PluginTensorDesc const* inputDesc, PluginTensorDesc const* outputDesc,
    void const* const* inputs, void* const* outputs, void* /* workspace */, cudaStream_t stream) const
{
    CausalConv1dParams p = makeParams(inputDesc, fields().activation);
    p.x = inputs[IO::kX];
    p.weight = inputs[IO::kWEIGHT];
    p.bias = inputs[IO::kBIAS];
    p.convState = inputs[IO::kCONV_STATE];
    p.seqLens = static_cast<int32_t const*>(inputs[IO::kSEQ_LENS]);
    p.y = outputs[IO::kY];
    p.newConvState = outputs[IO::kNEW_CONV_STATE];
    if (p.batch == 0 || p.channels == 0)
    {
        return;
    }
    if (p.seqLen == 0)
    {
        // No tokens: the state passes through unchanged.
        size_t const bytes = static_cast<size_t>(volume(outputDesc[IO::kNEW_CONV_STATE].dims))
            * elementSize(inputDesc[IO::kX].type);
        copyThrough(p.newConvState, p.convState, bytes, stream, kCONV_PLUGIN_NAME);
        return;
    }
    cudaError_t const err = launchCausalConv1d(p, stream);
    GDN_PLUGIN_CHECK(err == cudaSuccess,
        kCONV_PLUGIN_NAME << ": launchCausalConv1d(B=" << p.batch << " T=" << p.seqLen << " C=" << p.channels
                          << " K=" << p.kernelSize << ") failed: " << cudaGetErrorName(err) << " ("
                          << cudaGetErrorString(err) << ")");
}

} // namespace plugin
} // namespace gdn
