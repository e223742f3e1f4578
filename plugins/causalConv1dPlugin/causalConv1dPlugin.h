/*
 * CausalConv1d (version "1", namespace "gdn"): TensorRT IPluginV3 twin of gdn::causal_conv1d
 * (gdn_export/ops/causal_conv1d): a depthwise causal convolution over time with a rolling state.
 *
 *   index  tensor           shape          dtype
 *   in  0  x                [B, T, C]      T
 *   in  1  weight           [C, K]         T
 *   in  2  bias             [C]            T
 *   in  3  conv_state       [B, C, K-1]    T     the K-1 inputs before x
 *   in  4  seq_lens         [B]            int32 real tokens per row (right padding), 0 <= L_b <= T
 *   out 0  y                [B, T, C]      T     unspecified (finite) at padded positions t >= L_b
 *   out 1  new_conv_state   [B, C, K-1]    T     last K-1 columns of [conv_state | x[b, :L_b]];
 *                                                aliases in 3 (in place) with ALIASED_PLUGIN_IO
 *
 *   T is fp32, fp16 or bf16 (one dtype for all but seq_lens); all tensors linear (row-major,
 *   contiguous). Lengths outside [0, T] are clamped by the kernel.
 *
 *   field       type     meaning
 *   activation  kINT32   0 = none, 1 = SiLU
 */
#pragma once

#include "../common/pluginBase.h"

#include <NvInferRuntime.h>

namespace gdn
{
namespace plugin
{

constexpr char const* kCONV_PLUGIN_NAME{"CausalConv1d"};
constexpr char const* kCONV_PLUGIN_VERSION{"1"};
constexpr char const* kCONV_PLUGIN_NAMESPACE{"gdn"};
constexpr char const* kCONV_FIELD_ACTIVATION{"activation"};
constexpr int32_t kCONV_ACTIVATION_NONE{0};
constexpr int32_t kCONV_ACTIVATION_SILU{1};

//! Named input / output indices of CausalConv1d (see the table above).
struct CausalConv1dIO
{
    static constexpr int32_t kX = 0;
    static constexpr int32_t kWEIGHT = 1;
    static constexpr int32_t kBIAS = 2;
    static constexpr int32_t kCONV_STATE = 3;
    static constexpr int32_t kSEQ_LENS = 4;
    static constexpr int32_t kNB_INPUTS = 5;

    static constexpr int32_t kY = 0;
    static constexpr int32_t kNEW_CONV_STATE = 1;
    static constexpr int32_t kNB_OUTPUTS = 2;

    //! The rolling state is updated in place; the kernels allow convState == newConvState.
    static constexpr int32_t kALIASED_INPUTS[kNB_OUTPUTS] = {-1, kCONV_STATE};
    static constexpr int32_t kFREE_TYPES[] = {kX};

    //! Name of input `i` / output `i` for messages.
    static char const* inputName(int32_t i) noexcept;
    static char const* outputName(int32_t i) noexcept;
};

//! The fields, by name, in the creator's order.
struct CausalConv1dFields
{
    int32_t activation{kCONV_ACTIVATION_NONE};

    template <typename S, typename F>
    static void visit(S& self, F&& f)
    {
        f(kCONV_FIELD_ACTIVATION, self.activation);
    }
};

class CausalConv1dPlugin : public PluginBase<CausalConv1dPlugin, CausalConv1dIO, CausalConv1dFields>
{
public:
    static constexpr char const* kNAME = kCONV_PLUGIN_NAME;
    static constexpr char const* kVERSION = kCONV_PLUGIN_VERSION;
    static constexpr char const* kNAMESPACE = kCONV_PLUGIN_NAMESPACE;

    explicit CausalConv1dPlugin(Fields const& fields);

    // ---------------------------------------------------------------- hooks called by PluginBase
    static void checkInputDims(nvinfer1::Dims const* in);
    nvinfer1::DataType typeAt(int32_t pos, nvinfer1::DataType const* types) const;
    void inferOutputShapes(
        nvinfer1::DimsExprs const* in, nvinfer1::DimsExprs* out, nvinfer1::IExprBuilder& exprBuilder) const;
    void launch(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) const;
};

using CausalConv1dPluginCreator = PluginCreator<CausalConv1dPlugin>;

} // namespace plugin
} // namespace gdn
