/*
 * Causal depthwise conv1d CUDA kernels: the launcher API shared by the TensorRT plugin
 * (causalConv1dPlugin.cpp) and the PyTorch extension (gdn_export/cuda). No TensorRT types here.
 *
 * Contract (same argument order as gdn::causal_conv1d, see gdn_export/ops/causal_conv1d):
 *   x             [B, T, C]     dtype
 *   weight        [C, K]        dtype
 *   bias          [C]           dtype   nullptr = none
 *   convState     [B, C, K-1]   dtype   the K-1 inputs before x; nullptr = zeros; may alias newConvState
 *   y             [B, T, C]     dtype   y[b,t,c] = bias[c] + sum_j weight[c,j] * xs[b,c,t+j], xs = [state | x]
 *   seqLens       [B]           int32   device; row b holds seqLens[b] real tokens, then padding (right
 *                                       padding); nullptr = all T real. Clamped to [0, T] here (no error
 *                                       path on the device; the torch op checks lengths on the host).
 *   newConvState  [B, C, K-1]   dtype   last K-1 columns of [convState[b] | x[b, :L_b]], L_b = seqLens[b]
 *                                       (L_b = 0 leaves the state as it was)
 *
 * y at padded positions t >= L_b is the plain causal conv of the padding: finite, not meaningful.
 */
#pragma once

#include "../../gated_delta_rule/cuda/gatedDeltaRuleKernels.h" // gdn::DataType

namespace gdn
{

struct CausalConv1dParams
{
    DataType dtype{DataType::kFLOAT32};
    int32_t batch{0};
    int32_t seqLen{0};
    int32_t channels{0};
    int32_t kernelSize{0};
    bool silu{true};
    void const* x{nullptr};
    void const* weight{nullptr};
    void const* bias{nullptr};
    void const* convState{nullptr};
    int32_t const* seqLens{nullptr};
    void* y{nullptr};
    void* newConvState{nullptr};
};

//! Checks the parameters and runs the prefill (T > 1) or single-step update (T == 1) kernel.
cudaError_t launchCausalConv1d(CausalConv1dParams const& params, cudaStream_t stream);

} // namespace gdn
