/*
 * Routed-experts (sparse MoE) CUDA kernels: the launcher API shared by the TensorRT plugin
 * (moePlugin.cpp) and the PyTorch extension (gdn_export/cuda). No TensorRT types here.
 *
 * Contract (same argument order as gdn::moe, see gdn_export/ops/moe):
 *   hidden        [N, H]       dtype
 *   routerLogits  [N, E]       dtype   softmax over E in fp32, top-k, renormalised if normTopkProb
 *   gateUp        [E, 2I, H]   dtype   rows 0..I-1 gate, I..2I-1 up
 *   down          [E, H, I]    dtype
 *   out           [N, H]       dtype   out[n] = sum_j w[n,j] down[e_j] (silu(gate x_n) * up x_n)
 *
 * Work: route (one warp per token; pairs appended to their expert's row list by atomics), align
 * (one CTA: row blocks of 16 or 64 rows per expert), grouped GEMMs over the row blocks (gate_up with
 * the SwiGLU fused, then down with the routing weight fused; tensor cores for fp16 / bf16), combine
 * (sum of the k rows, fp32).
 * Only experts with rows are read: at decode, the routed experts' weights only.
 */
#pragma once

#include "../../gated_delta_rule/cuda/gatedDeltaRuleKernels.h" // gdn::DataType

#include <cstddef>
#include <cstdint>

namespace gdn
{

constexpr int32_t kMOE_MAX_EXPERTS = 1024; // one align CTA of 1024 threads scans the experts
constexpr int32_t kMOE_MAX_TOP_K = 32;

struct MoEParams
{
    DataType dtype{DataType::kFLOAT32};
    int32_t numTokens{0};  // N (0 is allowed: nothing runs)
    int32_t hiddenSize{0}; // H
    int32_t numExperts{0}; // E, 1..kMOE_MAX_EXPERTS
    int32_t interSize{0};  // I
    int32_t topK{0};       // 1..min(E, kMOE_MAX_TOP_K)
    bool normTopkProb{true};
    void const* hidden{nullptr};
    void const* routerLogits{nullptr};
    void const* gateUp{nullptr};
    void const* down{nullptr};
    void* out{nullptr};
};

//! Bytes of scratch launchMoE needs (256-byte aligned pieces); depends on N, H, E, I, topK only.
size_t moeWorkspaceSize(MoEParams const& params);

//! Checks the parameters (cudaErrorInvalidValue when wrong) and runs the kernels on `stream`.
//! `workspace` holds at least moeWorkspaceSize(params) bytes.
cudaError_t launchMoE(MoEParams const& params, void* workspace, cudaStream_t stream);

} // namespace gdn
