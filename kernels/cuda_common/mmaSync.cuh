/*
 * Warp-level tensor-core building blocks (sm_80+): the m16n8k16 mma.sync with fp32 accumulation,
 * ldmatrix, and packing fp32 pairs into 16-bit operand registers.
 *
 * Fragment layouts (g = lane / 4, t = lane % 4), which kernels rely on to keep operands in
 * registers between products:
 *   A [16 x 16] row:  a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
 *   B [16 x 8]  col:  b0 (2t..2t+1, g)  b1 (2t+8.., g)
 *   C [16 x 8]:       c0, c1 (g, 2t..2t+1)  c2, c3 (g+8, 2t..2t+1)
 * Two C tiles side by side (n 0..7, 8..15) therefore hold exactly the A fragment of the same 16 x 16
 * block: an accumulator feeds the next product without leaving registers.
 */
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace gdn
{
namespace mma
{

//! Two fp32 values as one register of two 16-bit T (x in the low half), rounded to nearest even.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float x, float y);

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float x, float y)
{
    __nv_bfloat162 const v = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<uint32_t const*>(&v);
}

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float x, float y)
{
    __half2 const v = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t const*>(&v);
}

//! The two halves of a register as fp32.
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t r);

template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t r)
{
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(&r));
}

template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t r)
{
    return __half22float2(*reinterpret_cast<__half2 const*>(&r));
}

//! hi = T(x, y) and lo = T(x - hi.x, y - hi.y): the pair as two 16-bit operands whose sum carries
//! about twice the mantissa bits.
template <typename T>
__device__ __forceinline__ void split2(float x, float y, uint32_t& hi, uint32_t& lo)
{
    hi = pack2<T>(x, y);
    float2 const h = unpack2<T>(hi);
    lo = pack2<T>(x - h.x, y - h.y);
}

//! c += a b for one 16 x 8 x 16 tile, fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(
    float (&c)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

//! Four 8 x 8 16-bit matrices from shared memory; lane l gives the address of row l % 8 of matrix
//! l / 8 and receives, in r[m], matrix m's row g, columns 2t..2t+1.
__device__ __forceinline__ void ldmatrixX4(uint32_t (&r)[4], void const* smemRow)
{
    auto const a = static_cast<uint32_t>(__cvta_generic_to_shared(smemRow));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

//! Two 8 x 8 16-bit matrices (lanes 0..15 give the row addresses; the others' are not read).
__device__ __forceinline__ void ldmatrixX2(uint32_t (&r)[2], void const* smemRow)
{
    auto const a = static_cast<uint32_t>(__cvta_generic_to_shared(smemRow));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

//! As ldmatrixX4, transposed: r[m] holds matrix m's rows 2t..2t+1 of column g.
__device__ __forceinline__ void ldmatrixX4Trans(uint32_t (&r)[4], void const* smemRow)
{
    auto const a = static_cast<uint32_t>(__cvta_generic_to_shared(smemRow));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

} // namespace mma
} // namespace gdn
