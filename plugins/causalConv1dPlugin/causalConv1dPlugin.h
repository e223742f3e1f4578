/*
 * CausalConv1d (version "1", namespace "gdn"): TensorRT IPluginV3 twin of gdn::causal_conv1d
 * (gdn_export/ops/causal_conv1d): a depthwise causal convolution over time with a rolling state.
 *
 *   index  tensor           shape          dtype
 *   in  0  x                [B, T, C]      T
 *   in  1  weight           [C, K]         T
 *   in  2  bias             [C]            T
 *   in  3  conv_state       [B, C, K-1]    T     the K-1 inputs before x
 *   out 0  y                [B, T, C]      T
 *   out 1  new_conv_state   [B, C, K-1]    T     aliases in 3 (in place) with ALIASED_PLUGIN_IO
 *
 *   T is fp32, fp16 or bf16 (one dtype for all); all tensors linear (row-major, contiguous).
 *
 *   field       type     meaning
 *   activation  kINT32   0 = none, 1 = SiLU
 */
#pragma once

#include <NvInferRuntime.h>

#include <string>
#include <vector>

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
    static constexpr int32_t kNB_INPUTS = 4;

    static constexpr int32_t kY = 0;
    static constexpr int32_t kNEW_CONV_STATE = 1;
    static constexpr int32_t kNB_OUTPUTS = 2;

    //! Name of input `i` / output `i` for messages.
    static char const* inputName(int32_t i) noexcept;
    static char const* outputName(int32_t i) noexcept;
};

class CausalConv1dPlugin : public nvinfer1::IPluginV3,
                           public nvinfer1::IPluginV3OneCore,
                           public nvinfer1::IPluginV3OneBuildV2,
                           public nvinfer1::IPluginV3OneRuntime
{
public:
    explicit CausalConv1dPlugin(int32_t activation);
    ~CausalConv1dPlugin() override = default;

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
    int32_t getAliasedInput(int32_t outputIndex) noexcept override;

    // ---------------------------------------------------------------- IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

private:
    int32_t mActivation;
    std::string mDescription; // "activation=..." for the timing cache and metadata

    std::vector<nvinfer1::PluginField> mFieldsToSerialize;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

class CausalConv1dPluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    CausalConv1dPluginCreator();
    ~CausalConv1dPluginCreator() override = default;

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
