/*
 * Grouped GEMM over the MoE row blocks on tensor cores (WMMA m16n16k16, fp32 accumulation), used for
 * fp16 / bf16 activations. A CTA of 4 warps owns BM rows (16 or 64) of one expert and kWMMA_N = 64
 * output columns; per K step of BK it stages the gathered A rows and the weight rows (16-byte
 * vector loads along the contiguous K axis when K % 8 == 0) in shared memory. Decode uses BK = 128
 * so that each CTA has 32 KB of weights in flight per step (the loads are synchronous). Weights [n][k] are
 * exactly WMMA's col-major B. The epilogue goes through shared memory: SwiGLU for gate_up (act is
 * rounded to the activation dtype, as transformers does), the routing weight for down.
 */
#pragma once

#include "moeCommon.cuh"

#include <mma.h>

namespace gdn
{
namespace moe
{

constexpr int32_t kWMMA_N = 64;
constexpr int32_t kWMMA_WARPS = 4;
constexpr int32_t kWMMA_PAD = 8; // halves of padding per smem row (keeps 16-byte alignment, spreads banks)

// Copies `rows` rows of BK elements starting at column k0 into smem tile [rows][BK + pad];
// src(r) gives row r's base pointer or nullptr for a zero row.
template <typename T, int32_t BK, typename Src>
__device__ __forceinline__ void stageRows(T (*tile)[BK + kWMMA_PAD], int32_t rows, int32_t k0, int32_t K, bool vec,
    Src src)
{
    constexpr int32_t kVEC = 8; // 16 bytes of 16-bit values
    if (vec)
    {
        for (int32_t i = threadIdx.x; i < rows * (BK / kVEC); i += kWMMA_WARPS * 32)
        {
            int32_t const r = i / (BK / kVEC), k = (i % (BK / kVEC)) * kVEC;
            T const* base = src(r);
            uint4 v = make_uint4(0, 0, 0, 0);
            if (base != nullptr && k0 + k < K)
            {
                v = *reinterpret_cast<uint4 const*>(base + k0 + k);
            }
            *reinterpret_cast<uint4*>(&tile[r][k]) = v;
        }
    }
    else
    {
        for (int32_t i = threadIdx.x; i < rows * BK; i += kWMMA_WARPS * 32)
        {
            int32_t const r = i / BK, k = i % BK;
            T const* base = src(r);
            tile[r][k] = (base != nullptr && k0 + k < K) ? base[k0 + k] : fromFloat<T>(0.F);
        }
    }
}

template <typename T, bool GATE_UP, int32_t BM, int32_t BK>
__global__ void __launch_bounds__(kWMMA_WARPS * 32) moeGemmWmmaKernel(MoEParams const p, Workspace const w)
{
    using namespace nvcuda;
    constexpr int32_t kHALVES = GATE_UP ? 2 : 1;
    constexpr int32_t kSLICES = BM / 16;                     // 16-row slices
    constexpr int32_t kWARPS_PER_SLICE = kWMMA_WARPS / kSLICES;
    constexpr int32_t kFRAGS = (kWMMA_N / 16) / kWARPS_PER_SLICE; // column fragments per warp
    static_assert(kWMMA_WARPS % kSLICES == 0 && kFRAGS >= 1, "warp layout covers the tile");

    // The staged operands and the fp32 result tile share shared memory (48 KB static limit).
    union Smem
    {
        struct
        {
            T a[BM][BK + kWMMA_PAD];
            T b[kHALVES * kWMMA_N][BK + kWMMA_PAD];
        } in;
        float c[kHALVES][BM][kWMMA_N + 4];
    };
    __shared__ __align__(32) unsigned char smemBytes[sizeof(Smem)];
    Smem& smem = *reinterpret_cast<Smem*>(smemBytes);
    auto& aTile = smem.in.a;
    auto& bTile = smem.in.b;
    auto& cTile = smem.c;
    __shared__ int32_t pairOf[BM];

    int32_t const expert = w.blockExpert[blockIdx.x];
    if (expert < 0)
    {
        return;
    }
    int32_t const row0 = w.blockRow0[blockIdx.x];
    int32_t const count = w.counts[expert];
    int32_t const K = GATE_UP ? p.hiddenSize : p.interSize;
    int32_t const cols = GATE_UP ? p.interSize : p.hiddenSize;
    int32_t const col0 = blockIdx.y * kWMMA_N;
    for (int32_t i = threadIdx.x; i < BM; i += kWMMA_WARPS * 32)
    {
        int32_t const r = row0 + i;
        pairOf[i] = r < count ? w.rows[static_cast<int64_t>(expert) * p.numTokens + r] : -1;
    }
    __syncthreads();
    T const* weight = static_cast<T const*>(GATE_UP ? p.gateUp : p.down)
        + static_cast<int64_t>(expert) * kHALVES * cols * K;
    T const* a = static_cast<T const*>(GATE_UP ? p.hidden : w.act);
    bool const vec = K % 8 == 0;

    int32_t const warp = threadIdx.x / 32;
    int32_t const slice = warp / kWARPS_PER_SLICE;
    int32_t const frag0 = (warp % kWARPS_PER_SLICE) * kFRAGS;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kHALVES][kFRAGS];
#pragma unroll
    for (int32_t h = 0; h < kHALVES; ++h)
    {
#pragma unroll
        for (int32_t f = 0; f < kFRAGS; ++f)
        {
            wmma::fill_fragment(acc[h][f], 0.F);
        }
    }
    for (int32_t k0 = 0; k0 < K; k0 += BK)
    {
        stageRows<T, BK>(aTile, BM, k0, K, vec, [&](int32_t r) -> T const* {
            int32_t const pair = pairOf[r];
            return pair < 0 ? nullptr : a + static_cast<int64_t>(GATE_UP ? pair / p.topK : pair) * K;
        });
        stageRows<T, BK>(bTile, kHALVES * kWMMA_N, k0, K, vec, [&](int32_t r) -> T const* {
            int32_t const h = r / kWMMA_N, c = col0 + r % kWMMA_N;
            return c < cols ? weight + (static_cast<int64_t>(h) * cols + c) * K : nullptr;
        });
        __syncthreads();
#pragma unroll
        for (int32_t kk = 0; kk < BK; kk += 16)
        {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
            wmma::load_matrix_sync(fa, &aTile[slice * 16][kk], BK + kWMMA_PAD);
#pragma unroll
            for (int32_t h = 0; h < kHALVES; ++h)
            {
#pragma unroll
                for (int32_t f = 0; f < kFRAGS; ++f)
                {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
                    wmma::load_matrix_sync(fb, &bTile[h * kWMMA_N + (frag0 + f) * 16][kk], BK + kWMMA_PAD);
                    wmma::mma_sync(acc[h][f], fa, fb, acc[h][f]);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int32_t h = 0; h < kHALVES; ++h)
    {
#pragma unroll
        for (int32_t f = 0; f < kFRAGS; ++f)
        {
            wmma::store_matrix_sync(&cTile[h][slice * 16][(frag0 + f) * 16], acc[h][f], kWMMA_N + 4, wmma::mem_row_major);
        }
    }
    __syncthreads();
    for (int32_t i = threadIdx.x; i < BM * kWMMA_N; i += kWMMA_WARPS * 32)
    {
        int32_t const m = i / kWMMA_N, n = i % kWMMA_N, c = col0 + n;
        int32_t const pair = pairOf[m];
        if (pair < 0 || c >= cols)
        {
            continue;
        }
        if (GATE_UP)
        {
            static_cast<T*>(w.act)[static_cast<int64_t>(pair) * cols + c]
                = fromFloat<T>(silu(cTile[0][m][n]) * cTile[kHALVES - 1][m][n]);
        }
        else
        {
            w.y[static_cast<int64_t>(pair) * cols + c] = w.weights[pair] * cTile[0][m][n];
        }
    }
}

} // namespace moe
} // namespace gdn
