/*
 * GatedDeltaRule (version "1", namespace "gdn"): TensorRT IPluginV3 twin of gdn::gated_delta_rule
 * (gdn_export/ops/gated_delta_rule). One plugin serves prefill (T > 1) and decode (T == 1).
 *
 *   index  tensor          shape             dtype
 *   in  0  q               [B, T, Hk, Dk]    T
 *   in  1  k               [B, T, Hk, Dk]    T
 *   in  2  v               [B, T, Hv, Dv]    T      Hv % Hk == 0
 *   in  3  g               [B, T, Hv]        fp32   log decay (<= 0)
 *   in  4  beta            [B, T, Hv]        T      write strength in (0, 2) (allow_neg_eigval: > 1)
 *   in  5  initial_state   [B, Hv, Dk, Dv]   S
 *   out 0  o               [B, T, Hv, Dv]    T
 *   out 1  final_state     [B, Hv, Dk, Dv]   S      aliases in 5 (in place) with ALIASED_PLUGIN_IO
 *
 *   T is fp32, fp16 or bf16; all tensors linear (row-major, contiguous). S, the state's storage
 *   dtype, is fp32, fp16 or bf16 independently of T (the same for in 5 and out 1): the kernels
 *   compute in fp32 and round the state once per enqueue, where they store it.
 *   Right padding is g = 0 and beta = 0 at padded positions: the state passes them unchanged.
 *
 *   field          type      meaning
 *   scale          kFLOAT32  multiplies q (usually Dk ** -0.5)
 *   use_qk_l2norm  kINT32    0/1: L2-normalise q and k over Dk first
 *
 * GatedDeltaRuleSteps (version "1", namespace "gdn"): the same op keeping the state after every
 * token (gdn::gated_delta_rule_steps; the verify step of speculative decoding keeps the state of
 * each row's accepted prefix). Inputs and fields as GatedDeltaRule; nothing aliased:
 *
 *   out 0  o               [B, T, Hv, Dv]      T
 *   out 1  states          [B, T, Hv, Dk, Dv]  S      states[:, t] = the state after token t, rounded
 *                                                     to S, the next token started from it
 */
#pragma once

#include "../common/pluginBase.h"

#include <NvInferRuntime.h>

namespace gdn
{
namespace plugin
{

constexpr char const* kGDR_PLUGIN_NAME{"GatedDeltaRule"};
constexpr char const* kGDR_PLUGIN_VERSION{"1"};
constexpr char const* kGDR_PLUGIN_NAMESPACE{"gdn"};
constexpr char const* kGDRS_PLUGIN_NAME{"GatedDeltaRuleSteps"};
constexpr char const* kGDR_FIELD_SCALE{"scale"};
constexpr char const* kGDR_FIELD_USE_QK_L2NORM{"use_qk_l2norm"};

//! The inputs GatedDeltaRule and GatedDeltaRuleSteps share (see the table above).
struct GatedDeltaRuleInputs
{
    static constexpr int32_t kQ = 0;
    static constexpr int32_t kK = 1;
    static constexpr int32_t kV = 2;
    static constexpr int32_t kG = 3;
    static constexpr int32_t kBETA = 4;
    static constexpr int32_t kINITIAL_STATE = 5;
    static constexpr int32_t kNB_INPUTS = 6;

    static char const* inputName(int32_t i) noexcept;
};

//! Named input / output indices of GatedDeltaRule (see the table above).
struct GatedDeltaRuleIO : GatedDeltaRuleInputs
{
    static constexpr int32_t kO = 0;
    static constexpr int32_t kFINAL_STATE = 1;
    static constexpr int32_t kNB_OUTPUTS = 2;

    //! The recurrent state is updated in place; the kernels allow initialState == finalState.
    static constexpr int32_t kALIASED_INPUTS[kNB_OUTPUTS] = {-1, kINITIAL_STATE};
    //! q sets T; the recurrent state's storage dtype S is its own choice (final_state follows it).
    static constexpr int32_t kFREE_TYPES[] = {kQ, kINITIAL_STATE};

    //! Name of output `i` for messages.
    static char const* outputName(int32_t i) noexcept;
};

//! Named output indices of GatedDeltaRuleSteps; its inputs are GatedDeltaRule's.
struct GatedDeltaRuleStepsIO : GatedDeltaRuleInputs
{
    static constexpr int32_t kO = 0;
    static constexpr int32_t kSTATES = 1;
    static constexpr int32_t kNB_OUTPUTS = 2;

    //! Nothing in place: initial_state is read, every step's state written to its own output.
    static constexpr int32_t kALIASED_INPUTS[kNB_OUTPUTS] = {-1, -1};
    static constexpr int32_t kFREE_TYPES[] = {kQ, kINITIAL_STATE};

    static char const* outputName(int32_t i) noexcept;
};

//! The fields, by name, in the creator's order.
struct GatedDeltaRuleFields
{
    float scale{0.F};
    int32_t useQkL2norm{0};

    template <typename S, typename F>
    static void visit(S& self, F&& f)
    {
        f(kGDR_FIELD_SCALE, self.scale);
        f(kGDR_FIELD_USE_QK_L2NORM, self.useQkL2norm);
    }
};

class GatedDeltaRulePlugin : public PluginBase<GatedDeltaRulePlugin, GatedDeltaRuleIO, GatedDeltaRuleFields>
{
public:
    static constexpr char const* kNAME = kGDR_PLUGIN_NAME;
    static constexpr char const* kVERSION = kGDR_PLUGIN_VERSION;
    static constexpr char const* kNAMESPACE = kGDR_PLUGIN_NAMESPACE;

    explicit GatedDeltaRulePlugin(Fields const& fields);

    // ---------------------------------------------------------------- hooks called by PluginBase
    static void checkInputDims(nvinfer1::Dims const* in);
    nvinfer1::DataType typeAt(int32_t pos, nvinfer1::DataType const* types) const;
    void inferOutputShapes(
        nvinfer1::DimsExprs const* in, nvinfer1::DimsExprs* out, nvinfer1::IExprBuilder& exprBuilder) const;
    size_t workspaceBytes(
        nvinfer1::DynamicPluginTensorDesc const* in, nvinfer1::DynamicPluginTensorDesc const* out) const;
    void launch(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) const;
};

using GatedDeltaRulePluginCreator = PluginCreator<GatedDeltaRulePlugin>;

class GatedDeltaRuleStepsPlugin
    : public PluginBase<GatedDeltaRuleStepsPlugin, GatedDeltaRuleStepsIO, GatedDeltaRuleFields>
{
public:
    static constexpr char const* kNAME = kGDRS_PLUGIN_NAME;
    static constexpr char const* kVERSION = kGDR_PLUGIN_VERSION;
    static constexpr char const* kNAMESPACE = kGDR_PLUGIN_NAMESPACE;

    explicit GatedDeltaRuleStepsPlugin(Fields const& fields);

    // ---------------------------------------------------------------- hooks called by PluginBase
    static void checkInputDims(nvinfer1::Dims const* in);
    nvinfer1::DataType typeAt(int32_t pos, nvinfer1::DataType const* types) const;
    void inferOutputShapes(
        nvinfer1::DimsExprs const* in, nvinfer1::DimsExprs* out, nvinfer1::IExprBuilder& exprBuilder) const;
    void launch(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) const;
};

using GatedDeltaRuleStepsPluginCreator = PluginCreator<GatedDeltaRuleStepsPlugin>;

} // namespace plugin
} // namespace gdn
