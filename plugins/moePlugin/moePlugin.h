/*
 * MoE (version "1", namespace "gdn"): TensorRT IPluginV3 twin of gdn::moe (gdn_export/ops/moe):
 * top-k routed SwiGLU experts; only the routed experts' weights are read.
 *
 *   index  tensor          shape         dtype
 *   in  0  hidden          [N, H]        T
 *   in  1  router_logits   [N, E]        T     softmax over E in fp32, then top-k
 *   in  2  gate_up         [E, 2I, H]    T     rows 0..I-1 gate, I..2I-1 up
 *   in  3  down            [E, H, I]     T
 *   out 0  out             [N, H]        T
 *
 *   T is fp32, fp16 or bf16 (one dtype for all); all tensors linear (row-major, contiguous).
 *   E <= 1024 (kMOE_MAX_EXPERTS), top_k <= 32 (kMOE_MAX_TOP_K).
 *
 *   field           type     meaning
 *   top_k           kINT32   experts per token, 1..E
 *   norm_topk_prob  kINT32   1: renormalise the top-k weights to sum 1; 0: raw softmax weights
 */
#pragma once

#include "../common/pluginBase.h"

#include <NvInferRuntime.h>

namespace gdn
{
namespace plugin
{

constexpr char const* kMOE_PLUGIN_NAME{"MoE"};
constexpr char const* kMOE_PLUGIN_VERSION{"1"};
constexpr char const* kMOE_PLUGIN_NAMESPACE{"gdn"};
constexpr char const* kMOE_FIELD_TOP_K{"top_k"};
constexpr char const* kMOE_FIELD_NORM_TOPK_PROB{"norm_topk_prob"};

//! Named input / output indices of MoE (see the table above).
struct MoEIO
{
    static constexpr int32_t kHIDDEN = 0;
    static constexpr int32_t kROUTER_LOGITS = 1;
    static constexpr int32_t kGATE_UP = 2;
    static constexpr int32_t kDOWN = 3;
    static constexpr int32_t kNB_INPUTS = 4;

    static constexpr int32_t kOUT = 0;
    static constexpr int32_t kNB_OUTPUTS = 1;

    static constexpr int32_t kALIASED_INPUTS[kNB_OUTPUTS] = {-1};
    //! hidden sets T; every other tensor follows it.
    static constexpr int32_t kFREE_TYPES[] = {kHIDDEN};

    //! Name of input `i` / output `i` for messages.
    static char const* inputName(int32_t i) noexcept;
    static char const* outputName(int32_t i) noexcept;
};

//! The fields, by name, in the creator's order.
struct MoEFields
{
    int32_t topK{1};
    int32_t normTopkProb{1};

    template <typename S, typename F>
    static void visit(S& self, F&& f)
    {
        f(kMOE_FIELD_TOP_K, self.topK);
        f(kMOE_FIELD_NORM_TOPK_PROB, self.normTopkProb);
    }
};

class MoEPlugin : public PluginBase<MoEPlugin, MoEIO, MoEFields>
{
public:
    static constexpr char const* kNAME = kMOE_PLUGIN_NAME;
    static constexpr char const* kVERSION = kMOE_PLUGIN_VERSION;
    static constexpr char const* kNAMESPACE = kMOE_PLUGIN_NAMESPACE;

    explicit MoEPlugin(Fields const& fields);

    // ---------------------------------------------------------------- hooks called by PluginBase
    //! A member, not static: top_k is checked against E.
    void checkInputDims(nvinfer1::Dims const* in) const;
    nvinfer1::DataType typeAt(int32_t pos, nvinfer1::DataType const* types) const;
    void inferOutputShapes(
        nvinfer1::DimsExprs const* in, nvinfer1::DimsExprs* out, nvinfer1::IExprBuilder& exprBuilder) const;
    size_t workspaceBytes(
        nvinfer1::DynamicPluginTensorDesc const* in, nvinfer1::DynamicPluginTensorDesc const* out) const;
    void launch(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) const;
};

using MoEPluginCreator = PluginCreator<MoEPlugin>;

} // namespace plugin
} // namespace gdn
