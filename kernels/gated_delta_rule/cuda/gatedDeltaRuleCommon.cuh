/*
 * Device helpers shared by the gated delta rule kernels: element conversion, warp reductions,
 * cp.async and a thin wmma wrapper that hides the fp32 (tf32) / fp16 / bf16 differences.
 * Needs sm_80 or newer (bf16 and tf32 wmma, cp.async).
 */
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <type_traits>

#include "../../cuda_common/floatConvert.cuh"
#include "gatedDeltaRuleKernels.h"

namespace gdn
{
namespace kernels
{

constexpr int32_t kWARP = 32;
constexpr int32_t kCHUNK = 64; // tokens per chunk of the WY prefill

//! N consecutive elements of a state stored as S (fp32, fp16 or bf16), aligned to N elements: one
//! vector load / store (16 bytes for 4 fp32 or 8 16-bit elements, 8 bytes for 4 16-bit ones).
template <typename S, int32_t N>
struct alignas(N * sizeof(S)) VecN
{
    S x[N];
};

template <typename S, int32_t N>
__device__ __forceinline__ void loadVec(S const* src, float (&out)[N])
{
    VecN<S, N> const x = *reinterpret_cast<VecN<S, N> const*>(src);
#pragma unroll
    for (int32_t c = 0; c < N; ++c)
    {
        out[c] = toFloat(x.x[c]);
    }
}

//! The one rounding of a stored state (round to nearest even), as one vector store.
template <typename S, int32_t N>
__device__ __forceinline__ void storeVec(S* dst, float const (&in)[N])
{
    VecN<S, N> x;
#pragma unroll
    for (int32_t c = 0; c < N; ++c)
    {
        x.x[c] = fromFloat<S>(in[c]);
    }
    *reinterpret_cast<VecN<S, N>*>(dst) = x;
}

//! Element i of a state stored in `type`, as fp32 (the chunked kernel reads and writes its state
//! once per launch, so a uniform runtime switch costs nothing there and saves template copies).
__device__ __forceinline__ float loadStateElem(void const* base, size_t i, DataType type)
{
    switch (type)
    {
    case DataType::kFLOAT16: return __half2float(static_cast<__half const*>(base)[i]);
    case DataType::kBFLOAT16: return __bfloat162float(static_cast<__nv_bfloat16 const*>(base)[i]);
    default: return static_cast<float const*>(base)[i];
    }
}

__device__ __forceinline__ void storeStateElem(void* base, size_t i, DataType type, float x)
{
    switch (type)
    {
    case DataType::kFLOAT16: static_cast<__half*>(base)[i] = __float2half_rn(x); break;
    case DataType::kBFLOAT16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x); break;
    default: static_cast<float*>(base)[i] = x; break;
    }
}

__device__ __forceinline__ float warpSum(float x)
{
#pragma unroll
    for (int32_t o = kWARP / 2; o > 0; o >>= 1)
    {
        x += __shfl_xor_sync(0xffffffffU, x, o);
    }
    return x;
}

//! 16-byte asynchronous global -> shared copy; srcBytes == 0 zero-fills the destination.
__device__ __forceinline__ void cpAsync16(void* smemDst, void const* gmemSrc, int32_t srcBytes)
{
    auto const dst = static_cast<uint32_t>(__cvta_generic_to_shared(smemDst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmemSrc), "r"(srcBytes));
}

//! 4-byte asynchronous copy (for per-token scalars such as g), zero-filling when srcBytes == 0.
__device__ __forceinline__ void cpAsync4(void* smemDst, void const* gmemSrc, int32_t srcBytes)
{
    auto const dst = static_cast<uint32_t>(__cvta_generic_to_shared(smemDst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmemSrc), "r"(srcBytes));
}

__device__ __forceinline__ void cpAsyncCommit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

__device__ __forceinline__ void cpAsyncWaitAll()
{
    asm volatile("cp.async.wait_group 0;\n" ::);
}

//! Copies a [rows, cols] tile of T from global (row stride srcStride elements) to shared memory
//! (row stride dstStride) with 16-byte cp.async. Rows >= validRows and columns >= validCols read as
//! zeros; cols and validCols must be multiples of the 16-byte vector (8 halves or 4 floats).
template <typename T, int32_t kROWS, int32_t kCOLS, int32_t kTHREADS>
__device__ __forceinline__ void loadTileAsync(T* dst, int32_t dstStride, T const* src, int64_t srcStride,
    int32_t validRows, int32_t validCols)
{
    constexpr int32_t kVEC = 16 / sizeof(T);
    constexpr int32_t kVECS_PER_ROW = kCOLS / kVEC;
    constexpr int32_t kTOTAL = kROWS * kVECS_PER_ROW;
    for (int32_t i = threadIdx.x; i < kTOTAL; i += kTHREADS)
    {
        int32_t const r = i / kVECS_PER_ROW;
        int32_t const c = (i % kVECS_PER_ROW) * kVEC;
        bool const valid = r < validRows && c < validCols;
        // An invalid vector still needs a mapped address: use the tile's base.
        T const* s = valid ? src + r * srcStride + c : src;
        cpAsync16(dst + r * dstStride + c, s, valid ? 16 : 0);
    }
}

namespace wmma = nvcuda::wmma;

//! wmma shapes per element type: 16x16x16 for fp16 / bf16, 16x16x8 tf32 for fp32 operands.
template <typename T>
struct MmaTraits;

template <>
struct MmaTraits<__half>
{
    using Elem = __half;
    static constexpr int32_t kK = 16;
};

template <>
struct MmaTraits<__nv_bfloat16>
{
    using Elem = __nv_bfloat16;
    static constexpr int32_t kK = 16;
};

template <>
struct MmaTraits<float>
{
    using Elem = wmma::precision::tf32;
    static constexpr int32_t kK = 8;
};

//! 16-bit inputs: products with an fp32 factor (the chunk inverse, P, v_new, the state) use two
//! operands x = hi + lo, hi = T(x), lo = T(x - hi), i.e. two products accumulated in fp32 (about 16
//! mantissa bits for bf16, better than tf32). One rounding to bf16 there costs ~1e-2 of o on nearly
//! parallel keys (large inverse entries, cancellation in v_new and P v_new). fp32 inputs keep their
//! fp32 values in shared memory and split inside mmaTile instead (3xTF32).
template <typename T>
constexpr bool kSPLIT = !std::is_same<T, float>::value;

//! *hi = T(x) and, where kSPLIT<T>, *lo = T(x - hi).
template <typename T>
__device__ __forceinline__ void splitStore(T* hi, T* lo, float x)
{
    T const h = fromFloat<T>(x);
    *hi = h;
    if constexpr (kSPLIT<T>)
    {
        *lo = fromFloat<T>(x - toFloat(h));
    }
}

using AccFrag = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <typename T>
using AccFragT = wmma::fragment<wmma::accumulator, 16, 16, MmaTraits<T>::kK, float>;

//! f = tf32(f) and lo = tf32(f - tf32(f)), element by element (one fragment layout for both).
template <typename Frag>
__device__ __forceinline__ void splitTf32(Frag& f, Frag& lo)
{
#pragma unroll
    for (int32_t i = 0; i < f.num_elements; ++i)
    {
        float const x = f.x[i];
        float const hi = wmma::__float_to_tf32(x);
        f.x[i] = hi;
        lo.x[i] = wmma::__float_to_tf32(x - hi);
    }
}

//! acc += A[16, kLen] * B[kLen, 16] from shared memory. LayoutA / LayoutB are wmma::row_major or
//! wmma::col_major; for a col_major operand the pointer and stride describe its transpose stored
//! row-major (so B = X^T is read straight from X [16, kLen]). kLen is a multiple of kK.
template <typename T, typename LayoutA, typename LayoutB>
__device__ __forceinline__ void mmaTile(AccFragT<T>& acc, T const* a, int32_t lda, T const* b, int32_t ldb, int32_t kLen)
{
    using Traits = MmaTraits<T>;
    constexpr int32_t kK = Traits::kK;
    wmma::fragment<wmma::matrix_a, 16, 16, kK, typename Traits::Elem, LayoutA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, kK, typename Traits::Elem, LayoutB> fb;
    constexpr bool kACOL = std::is_same<LayoutA, wmma::col_major>::value;
    constexpr bool kBCOL = std::is_same<LayoutB, wmma::col_major>::value;
    for (int32_t k0 = 0; k0 < kLen; k0 += kK)
    {
        // row_major A: element (m, k) at a[m * lda + k]; col_major A: at a[k * lda + m].
        wmma::load_matrix_sync(fa, kACOL ? a + k0 * lda : a + k0, lda);
        // row_major B: element (k, n) at b[k * ldb + n]; col_major B: at b[n * ldb + k].
        wmma::load_matrix_sync(fb, kBCOL ? b + k0 : b + k0 * ldb, ldb);
        if constexpr (std::is_same<T, float>::value)
        {
            // 3xTF32: a b = a_hi b_hi + a_hi b_lo + a_lo b_hi (+ a_lo b_lo, below fp32 rounding). One
            // TF32 product keeps 10 mantissa bits, which put a whole tiny fp32 model over its 2e-3
            // bound on model-shaped keys (H200); fp32 inputs ask for fp32 results.
            decltype(fa) faLo;
            decltype(fb) fbLo;
            splitTf32(fa, faLo);
            splitTf32(fb, fbLo);
            wmma::mma_sync(acc, faLo, fb, acc);
            wmma::mma_sync(acc, fa, fbLo, acc);
        }
        wmma::mma_sync(acc, fa, fb, acc);
    }
}

} // namespace kernels
} // namespace gdn
