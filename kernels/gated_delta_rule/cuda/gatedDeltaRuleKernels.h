/*
 * Gated delta rule CUDA kernels: the launcher API shared by the TensorRT plugin
 * (gatedDeltaRulePlugin.cpp) and the PyTorch extension (gdn_export/cuda). No TensorRT types here.
 *
 * Contract (same argument order as gdn::gated_delta_rule, see gdn_export/ops/gated_delta_rule):
 *   q, k          [B, T, Hk, Dk]   dtype           (contiguous)
 *   v             [B, T, Hv, Dv]   dtype           Hv % Hk == 0; value head h reads key head h / (Hv / Hk)
 *   g             [B, T, Hv]       fp32            log decay (<= 0)
 *   beta          [B, T, Hv]       dtype
 *   initialState  [N, Hv, Dk, Dv]  stateType       nullptr = zeros; may alias finalState (in-place)
 *   o             [B, T, Hv, Dv]   dtype
 *   finalState    [N, Hv, Dk, Dv]  stateType
 *   stepStates    [B * T, Hv, Dk, Dv] stateType  optional (nullptr = none): the state after every
 *                 token (token-major as q; packed sequences too), each rounded to stateType where it
 *                 is stored and the next token started from the stored value (T one-token launches'
 *                 numbers; speculative decoding's verify step keeps the state of an accepted prefix).
 *                 Runs the recurrent kernel for any T; finalState may then be nullptr.
 *   N = B, or numSeqs when cuSeqlens [numSeqs + 1] (int32, device) packs sequences (then B == 1).
 *   Per token: S = exp(g) S; u = beta (v - S^T k); S += k u^T; o = scale S^T q.
 *   stateType (fp32, fp16 or bf16, independent of dtype) is storage only: a launch reads the state,
 *   keeps it fp32 on-chip for all its tokens and chunks, and rounds it once (RTNE) where it stores
 *   finalState, as the op's references do (gdn_export/ops/gated_delta_rule).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>

namespace gdn
{

enum class DataType : int32_t
{
    kFLOAT32 = 0,
    kFLOAT16 = 1,
    kBFLOAT16 = 2,
};

struct GatedDeltaRuleParams
{
    DataType dtype{DataType::kFLOAT32}; // of q, k, v, beta and o
    int32_t batch{0};
    int32_t seqLen{0};
    int32_t numKeyHeads{0};
    int32_t numValueHeads{0};
    int32_t keyDim{0};
    int32_t valueDim{0};
    int32_t numSeqs{0};                  // N when cuSeqlens != nullptr
    int32_t const* cuSeqlens{nullptr};   // device, [numSeqs + 1]
    float scale{1.F};
    bool useQkL2norm{false};
    void const* q{nullptr};
    void const* k{nullptr};
    void const* v{nullptr};
    float const* g{nullptr};
    void const* beta{nullptr};
    void const* initialState{nullptr};
    void* o{nullptr};
    void* finalState{nullptr};
    DataType stateType{DataType::kFLOAT32}; // of initialState and finalState (storage only; math is fp32)
    void* stepStates{nullptr};              // [B * T, Hv, Dk, Dv] stateType, optional (see above)
};

//! Bytes of scratch memory launchGatedDeltaRule needs for these shapes (0 allowed).
size_t gatedDeltaRuleWorkspaceSize(GatedDeltaRuleParams const& params);

//! Checks the parameters, then runs the recurrent kernel (T == 1 and short T) or the chunked WY
//! kernels (prefill). Returns cudaErrorInvalidValue for an unsupported shape, else the launch error.
cudaError_t launchGatedDeltaRule(GatedDeltaRuleParams const& params, void* workspace, cudaStream_t stream);

} // namespace gdn
