/*
 * GatedDeltaRule (version "1", namespace "gdn"): TensorRT IPluginV3 twin of gdn::gated_delta_rule
 * (gdn_export/ops/gated_delta_rule). One plugin serves prefill (T > 1) and decode (T == 1).
 *
 *   index  tensor          shape             dtype
 *   in  0  q               [B, T, Hk, Dk]    T
 *   in  1  k               [B, T, Hk, Dk]    T
 *   in  2  v               [B, T, Hv, Dv]    T      Hv % Hk == 0
 *   in  3  g               [B, T, Hv]        fp32   log decay (<= 0)
 *   in  4  beta            [B, T, Hv]        T      write strength in (0, 1)
 *   in  5  initial_state   [B, Hv, Dk, Dv]   S
 *   out 0  o               [B, T, Hv, Dv]    T
 *   out 1  final_state     [B, Hv, Dk, Dv]   S      aliases in 5 (in place) with ALIASED_PLUGIN_IO
 *
 *   T is fp32, fp16 or bf16; all tensors linear (row-major, contiguous). S, the state's storage
 *   dtype, is fp32, fp16 or bf16 independently of T (the same for in 5 and out 1): the kernels
 *   compute in fp32 and round the state once per enqueue, where they store it.
 *
 *   field          type      meaning
 *   scale          kFLOAT32  multiplies q (usually Dk ** -0.5)
 *   use_qk_l2norm  kINT32    0/1: L2-normalise q and k over Dk first
 */
#pragma once

#include <NvInferRuntime.h>

#include <string>
#include <vector>

namespace gdn
{
namespace plugin
{

constexpr char const* kGDR_PLUGIN_NAME{"GatedDeltaRule"};
constexpr char const* kGDR_PLUGIN_VERSION{"1"};
constexpr char const* kGDR_PLUGIN_NAMESPACE{"gdn"};
constexpr char const* kGDR_FIELD_SCALE{"scale"};
constexpr char const* kGDR_FIELD_USE_QK_L2NORM{"use_qk_l2norm"};

//! Named input / output indices of GatedDeltaRule (see the table above).
struct GatedDeltaRuleIO
{
    static constexpr int32_t kQ = 0;
    static constexpr int32_t kK = 1;
    static constexpr int32_t kV = 2;
    static constexpr int32_t kG = 3;
    static constexpr int32_t kBETA = 4;
    static constexpr int32_t kINITIAL_STATE = 5;
    static constexpr int32_t kNB_INPUTS = 6;

    static constexpr int32_t kO = 0;
    static constexpr int32_t kFINAL_STATE = 1;
    static constexpr int32_t kNB_OUTPUTS = 2;

    //! Name of input `i` / output `i` for messages.
    static char const* inputName(int32_t i) noexcept;
    static char const* outputName(int32_t i) noexcept;
};

class GatedDeltaRulePlugin : public nvinfer1::IPluginV3,
                             public nvinfer1::IPluginV3OneCore,
                             public nvinfer1::IPluginV3OneBuildV2,
                             public nvinfer1::IPluginV3OneRuntime
{
public:
    GatedDeltaRulePlugin(float scale, int32_t useQkL2norm);
    ~GatedDeltaRulePlugin() override = default;

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
    float mScale;
    int32_t mUseQkL2norm;
    std::string mDescription; // "scale=...,use_qk_l2norm=..." for the timing cache and metadata

    // Backing store of getFieldsToSerialize(); the fields point into mScale / mUseQkL2norm.
    std::vector<nvinfer1::PluginField> mFieldsToSerialize;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

class GatedDeltaRulePluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    GatedDeltaRulePluginCreator();
    ~GatedDeltaRulePluginCreator() override = default;

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
