#include "gatedDeltaRulePlugin.h"

#include "gated_delta_rule/cuda/gatedDeltaRuleKernels.h"

#include <cmath>
#include <sstream>

namespace gdn
{
namespace plugin
{

using nvinfer1::DataType;
using nvinfer1::Dims;
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::PluginTensorDesc;
using IO = GatedDeltaRuleIO;

char const* GatedDeltaRuleInputs::inputName(int32_t i) noexcept
{
    static char const* const kNames[kNB_INPUTS] = {"q", "k", "v", "g", "beta", "initial_state"};
    return i >= 0 && i < kNB_INPUTS ? kNames[i] : "(no such input)";
}

char const* GatedDeltaRuleIO::outputName(int32_t i) noexcept
{
    static char const* const kNames[kNB_OUTPUTS] = {"o", "final_state"};
    return i >= 0 && i < kNB_OUTPUTS ? kNames[i] : "(no such output)";
}

char const* GatedDeltaRuleStepsIO::outputName(int32_t i) noexcept
{
    static char const* const kNames[kNB_OUTPUTS] = {"o", "states"};
    return i >= 0 && i < kNB_OUTPUTS ? kNames[i] : "(no such output)";
}

namespace
{

constexpr int32_t kINPUT_RANKS[IO::kNB_INPUTS] = {4, 4, 4, 3, 3, 4};

//! Every dim two of the six inputs share (both plugins); same(a, da, b, db, what) checks one pair.
//! A dim < 0 (unknown at build time) matches anything.
template <typename Same>
void checkSharedDims(Dims const* in, char const* plugin, Same&& same)
{
    for (int32_t d = 0; d < 4; ++d)
    {
        same(IO::kQ, d, IO::kK, d, "q and k shape");
    }
    for (int32_t i : {IO::kV, IO::kG, IO::kBETA})
    {
        same(IO::kQ, 0, i, 0, "batch B");
        same(IO::kQ, 1, i, 1, "sequence length T");
    }
    same(IO::kV, 2, IO::kG, 2, "value heads Hv");
    same(IO::kV, 2, IO::kBETA, 2, "value heads Hv");
    same(IO::kQ, 0, IO::kINITIAL_STATE, 0, "batch B");
    same(IO::kV, 2, IO::kINITIAL_STATE, 1, "value heads Hv");
    same(IO::kQ, 3, IO::kINITIAL_STATE, 2, "key dim Dk");
    same(IO::kV, 3, IO::kINITIAL_STATE, 3, "value dim Dv");
    int64_t const hk = in[IO::kQ].d[2];
    int64_t const hv = in[IO::kV].d[2];
    GDN_PLUGIN_CHECK(hk < 0 || hv < 0 || (hk > 0 && hv % hk == 0),
        plugin << ": value heads Hv = " << hv << " must be a multiple of key heads Hk = " << hk);
}

void checkFields(GatedDeltaRuleFields const& fields, char const* plugin)
{
    GDN_PLUGIN_CHECK(std::isfinite(fields.scale), plugin << ": field 'scale' must be finite, got " << fields.scale);
    GDN_PLUGIN_CHECK(fields.useQkL2norm == 0 || fields.useQkL2norm == 1,
        plugin << ": field 'use_qk_l2norm' must be 0 or 1, got " << fields.useQkL2norm);
}

//! Kernel parameters (no pointers) for concrete input dims.
GatedDeltaRuleParams makeParams(Dims const* in, DataType type, GatedDeltaRuleFields const& fields)
{
    GatedDeltaRuleParams p;
    p.dtype = toKernelDataType(type, "GatedDeltaRule q/k/v/beta");
    p.batch = dimAsInt32(in[IO::kQ], 0, "q");
    p.seqLen = dimAsInt32(in[IO::kQ], 1, "q");
    p.numKeyHeads = dimAsInt32(in[IO::kQ], 2, "q");
    p.keyDim = dimAsInt32(in[IO::kQ], 3, "q");
    p.numValueHeads = dimAsInt32(in[IO::kV], 2, "v");
    p.valueDim = dimAsInt32(in[IO::kV], 3, "v");
    p.numSeqs = p.batch;
    p.cuSeqlens = nullptr;
    p.scale = fields.scale;
    p.useQkL2norm = fields.useQkL2norm != 0;
    return p;
}

//! The parameters of an enqueue: the shapes, the six input pointers and the state's storage dtype
//! (the outputs are each plugin's own).
GatedDeltaRuleParams launchParams(PluginTensorDesc const* inputDesc, void const* const* inputs,
    GatedDeltaRuleFields const& fields, char const* plugin)
{
    Dims dims[IO::kNB_INPUTS];
    for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
    {
        dims[i] = inputDesc[i].dims;
    }
    GatedDeltaRuleParams p = makeParams(dims, inputDesc[IO::kQ].type, fields);
    p.q = inputs[IO::kQ];
    p.k = inputs[IO::kK];
    p.v = inputs[IO::kV];
    p.g = static_cast<float const*>(inputs[IO::kG]);
    p.beta = inputs[IO::kBETA];
    p.initialState = inputs[IO::kINITIAL_STATE];
    p.stateType = toKernelDataType(inputDesc[IO::kINITIAL_STATE].type, plugin);
    return p;
}

std::string paramsToString(GatedDeltaRuleParams const& p)
{
    std::ostringstream os;
    os << "B=" << p.batch << " T=" << p.seqLen << " Hk=" << p.numKeyHeads << " Hv=" << p.numValueHeads
       << " Dk=" << p.keyDim << " Dv=" << p.valueDim << " dtype=" << static_cast<int32_t>(p.dtype)
       << " stateType=" << static_cast<int32_t>(p.stateType);
    return os.str();
}

} // namespace

// ==================================================================== GatedDeltaRulePlugin

GatedDeltaRulePlugin::GatedDeltaRulePlugin(Fields const& fields)
    : PluginBase(fields)
{
    checkFields(fields, kGDR_PLUGIN_NAME);
}

void GatedDeltaRulePlugin::checkInputDims(Dims const* in)
{
    checkRanks(in, kINPUT_RANKS);
    checkSharedDims(in, kGDR_PLUGIN_NAME, [in](int32_t a, int32_t da, int32_t b, int32_t db, char const* what) {
        checkSameDim(in, a, da, b, db, what);
    });
}

//! The dtype rules, all of them: g is fp32; k, v, beta and o follow q; final_state keeps
//! initial_state's storage dtype (fp32 / fp16 / bf16, chosen freely: IO::kFREE_TYPES).
DataType GatedDeltaRulePlugin::typeAt(int32_t pos, DataType const* types) const
{
    switch (pos)
    {
    case IO::kG: return DataType::kFLOAT;
    case IO::kNB_INPUTS + IO::kFINAL_STATE: return types[IO::kINITIAL_STATE];
    default: return types[IO::kQ];
    }
}

void GatedDeltaRulePlugin::inferOutputShapes(DimsExprs const* in, DimsExprs* out, nvinfer1::IExprBuilder& /* eb */) const
{
    // o [B, T, Hv, Dv] is v's shape; final_state is initial_state's shape.
    out[IO::kO] = in[IO::kV];
    out[IO::kFINAL_STATE] = in[IO::kINITIAL_STATE];
}

size_t GatedDeltaRulePlugin::workspaceBytes(DynamicPluginTensorDesc const* in, DynamicPluginTensorDesc const* /* out */) const
{
    // Sized for the profile's largest shapes, which covers every smaller one.
    Dims maxDims[IO::kNB_INPUTS];
    for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
    {
        maxDims[i] = in[i].max;
    }
    return gatedDeltaRuleWorkspaceSize(makeParams(maxDims, in[IO::kQ].desc.type, fields()));
}

void GatedDeltaRulePlugin::launch(PluginTensorDesc const* inputDesc, PluginTensorDesc const* outputDesc,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) const
{
    GatedDeltaRuleParams p = launchParams(inputDesc, inputs, fields(), "GatedDeltaRule initial_state");
    p.o = outputs[IO::kO];
    p.finalState = outputs[IO::kFINAL_STATE];
    if (p.batch == 0)
    {
        return;
    }
    if (p.seqLen == 0)
    {
        // No tokens: the state passes through unchanged.
        size_t const bytes = static_cast<size_t>(volume(outputDesc[IO::kFINAL_STATE].dims))
            * (p.stateType == gdn::DataType::kFLOAT32 ? sizeof(float) : sizeof(uint16_t));
        copyThrough(p.finalState, p.initialState, bytes, stream, kGDR_PLUGIN_NAME);
        return;
    }
    cudaError_t const err = launchGatedDeltaRule(p, workspace, stream);
    GDN_PLUGIN_CHECK(err == cudaSuccess,
        kGDR_PLUGIN_NAME << ": launchGatedDeltaRule(" << paramsToString(p) << ") failed: " << cudaGetErrorName(err)
                         << " (" << cudaGetErrorString(err) << ")");
}

// ==================================================================== GatedDeltaRuleSteps

using StepsIO = GatedDeltaRuleStepsIO;

GatedDeltaRuleStepsPlugin::GatedDeltaRuleStepsPlugin(Fields const& fields)
    : PluginBase(fields)
{
    checkFields(fields, kGDRS_PLUGIN_NAME);
}

void GatedDeltaRuleStepsPlugin::checkInputDims(Dims const* in)
{
    checkRanks(in, kINPUT_RANKS);
    checkSharedDims(in, kGDRS_PLUGIN_NAME, [in](int32_t a, int32_t da, int32_t b, int32_t db, char const* what) {
        checkSameDim(in, a, da, b, db, what);
    });
}

//! GatedDeltaRule's rules: g fp32, k, v, beta and o follow q, states keep initial_state's dtype.
DataType GatedDeltaRuleStepsPlugin::typeAt(int32_t pos, DataType const* types) const
{
    switch (pos)
    {
    case IO::kG: return DataType::kFLOAT;
    case StepsIO::kNB_INPUTS + StepsIO::kSTATES: return types[IO::kINITIAL_STATE];
    default: return types[IO::kQ];
    }
}

void GatedDeltaRuleStepsPlugin::inferOutputShapes(
    DimsExprs const* in, DimsExprs* out, nvinfer1::IExprBuilder& /* eb */) const
{
    // o [B, T, Hv, Dv] is v's shape; states [B, T, Hv, Dk, Dv] are q's B, T and the state's Hv, Dk, Dv.
    out[StepsIO::kO] = in[IO::kV];
    DimsExprs& states = out[StepsIO::kSTATES];
    states.nbDims = 5;
    states.d[0] = in[IO::kQ].d[0];
    states.d[1] = in[IO::kQ].d[1];
    for (int32_t d = 1; d < 4; ++d)
    {
        states.d[d + 1] = in[IO::kINITIAL_STATE].d[d];
    }
}

void GatedDeltaRuleStepsPlugin::launch(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /* outputDesc */,
    void const* const* inputs, void* const* outputs, void* /* workspace */, cudaStream_t stream) const
{
    GatedDeltaRuleParams p = launchParams(inputDesc, inputs, fields(), "GatedDeltaRuleSteps initial_state");
    p.o = outputs[StepsIO::kO];
    p.finalState = nullptr;
    p.stepStates = outputs[StepsIO::kSTATES];
    if (p.batch == 0 || p.seqLen == 0)
    {
        return; // no token, no state to write
    }
    // The recurrent kernel, whatever T (stepStates): no workspace.
    cudaError_t const err = launchGatedDeltaRule(p, nullptr, stream);
    GDN_PLUGIN_CHECK(err == cudaSuccess,
        kGDRS_PLUGIN_NAME << ": launchGatedDeltaRule(" << paramsToString(p) << ") failed: " << cudaGetErrorName(err)
                          << " (" << cudaGetErrorString(err) << ")");
}

} // namespace plugin
} // namespace gdn
