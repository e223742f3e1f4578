/*
 * Element conversions of the plugin kernels: fp32 / fp16 / bf16 to fp32 and back (round to nearest
 * even). Device code only; the kernels of every plugin include this one copy.
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace gdn
{

template <typename T>
__device__ __forceinline__ float toFloat(T x);
template <>
__device__ __forceinline__ float toFloat<float>(float x)
{
    return x;
}
template <>
__device__ __forceinline__ float toFloat<__half>(__half x)
{
    return __half2float(x);
}
template <>
__device__ __forceinline__ float toFloat<__nv_bfloat16>(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T fromFloat(float x);
template <>
__device__ __forceinline__ float fromFloat<float>(float x)
{
    return x;
}
template <>
__device__ __forceinline__ __half fromFloat<__half>(float x)
{
    return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

} // namespace gdn
