/*
 * Shared pieces of the MoE kernels (moeKernels.cu and the two grouped GEMMs): dtype conversions and
 * the workspace layout.
 */
#pragma once

#include "moeKernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace gdn
{
namespace moe
{

template <typename T>
__device__ __forceinline__ float toFloat(T x)
{
    return static_cast<float>(x);
}
template <>
__device__ __forceinline__ float toFloat<__nv_bfloat16>(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float toFloat<__half>(__half x)
{
    return __half2float(x);
}

template <typename T>
__device__ __forceinline__ T fromFloat(float x)
{
    return static_cast<T>(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half fromFloat<__half>(float x)
{
    return __float2half_rn(x);
}

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
