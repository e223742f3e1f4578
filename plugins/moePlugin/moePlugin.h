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

#include <NvInferRuntime.h>

#include <string>
#include <vector>

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

    //! Name of input `i` for messages.
    static char const* inputName(int32_t i) noexcept;
};

class MoEPlugin : public nvinfer1::IPluginV3,
                  public nvinfer1::IPluginV3OneCore,
                  public nvinfer1::IPluginV3OneBuildV2,
                  public nvinfer1::IPluginV3OneRuntime
{
public:
    MoEPlugin(int32_t topK, int32_t normTopkProb);
    ~MoEPlugin() override = default;

    // ---------------------------------------------------------------- IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // ---------------------------------------------------------------- IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // ---------------------------------------------------------------- IPluginV3OneBuild(V2)
    int32_t getNbOutputs() const noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
        int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
        nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;
    char const* getTimingCacheID() noexcept override;
    char const* getMetadataString() noexcept override;

    // ---------------------------------------------------------------- IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

private:
    int32_t mTopK;
    int32_t mNormTopkProb;
    std::string mDescription; // "top_k=...,norm_topk_prob=..." for the timing cache and metadata

    std::vector<nvinfer1::PluginField> mFieldsToSerialize;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

class MoEPluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    MoEPluginCreator();
    ~MoEPluginCreator() override = default;

    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;

private:
    std::vector<nvinfer1::PluginField> mFieldNames;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

} // namespace plugin
} // namespace gdn
