/*
 * Shared pieces of the MoE kernels (moeKernels.cu and the two grouped GEMMs): SiLU and the workspace
 * layout (dtype conversions: kernels/cuda_common/floatConvert.cuh).
 */
#pragma once

#include "../../cuda_common/floatConvert.cuh"
#include "moeKernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace gdn
{
namespace moe
{

__device__ __forceinline__ float silu(float x)
{
    return x / (1.F + __expf(-x));
}

struct Workspace
{
    int32_t* counts;      // [E] rows per expert
    int32_t* rows;        // [E, N] pair ids (n * k + j) per expert, first counts[e] valid
    int32_t* blockExpert; // [maxBlocks] expert of each row block, -1 past the last
    int32_t* blockRow0;   // [maxBlocks] first row of the block in its expert's list
    float* weights;       // [N * k] routing weights
    void* act;            // [N * k, I] silu(gate) * up per pair, in the activation dtype
    float* y;             // [N * k, H] weighted expert output per pair
};

} // namespace moe
} // namespace gdn
