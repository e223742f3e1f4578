/*
 * Grouped GEMM over the MoE row blocks on CUDA cores (fp32 FMA), used for fp32 activations: a CTA
 * owns kSIMT_M rows of one expert and kSIMT_N output columns, stages the gathered rows and the weight
 * tile in shared memory (weights read along their contiguous K axis) and loops over K.
 */
#pragma once

#include "moeCommon.cuh"

namespace gdn
{
namespace moe
{

constexpr int32_t kSIMT_M = 16;
constexpr int32_t kSIMT_N = 64;
constexpr int32_t kSIMT_K = 32;
constexpr int32_t kSIMT_THREADS = 256; // 64 columns x 4 row groups
constexpr int32_t kSIMT_ROWS = kSIMT_M / (kSIMT_THREADS / kSIMT_N);
static_assert(kSIMT_ROWS * (kSIMT_THREADS / kSIMT_N) == kSIMT_M, "thread layout covers the tile");

// GATE_UP: A = hidden rows of the pairs' tokens, B = gate and up rows of gateUp[e] (K = H),
// act = silu(A Bg^T) * (A Bu^T). Otherwise: A = act rows of the pairs, B = down[e] (K = I),
// y = weight * (A B^T). Row blocks come from moeAlignKernel with blockM = kSIMT_M.
template <typename T, bool GATE_UP>
__global__ void __launch_bounds__(kSIMT_THREADS) moeGemmSimtKernel(MoEParams const p, Workspace const w)
{
    constexpr int32_t kHALVES = GATE_UP ? 2 : 1;
    __shared__ float aTile[kSIMT_M][kSIMT_K];
    __shared__ float bTile[kHALVES][kSIMT_K][kSIMT_N + 1];
    __shared__ int32_t pairOf[kSIMT_M];
    int32_t const expert = w.blockExpert[blockIdx.x];
    if (expert < 0)
    {
        return;
    }
    int32_t const row0 = w.blockRow0[blockIdx.x];
    int32_t const count = w.counts[expert];
    int32_t const K = GATE_UP ? p.hiddenSize : p.interSize;
    int32_t const cols = GATE_UP ? p.interSize : p.hiddenSize;
    int32_t const col0 = blockIdx.y * kSIMT_N;
    if (threadIdx.x < kSIMT_M)
    {
        int32_t const r = row0 + threadIdx.x;
        pairOf[threadIdx.x] = r < count ? w.rows[static_cast<int64_t>(expert) * p.numTokens + r] : -1;
    }
    __syncthreads();
    T const* weight = static_cast<T const*>(GATE_UP ? p.gateUp : p.down)
        + static_cast<int64_t>(expert) * kHALVES * cols * K;
    T const* a = static_cast<T const*>(GATE_UP ? p.hidden : w.act);
    int32_t const tx = threadIdx.x % kSIMT_N, ty = threadIdx.x / kSIMT_N;
    float acc[kHALVES][kSIMT_ROWS] = {};
    for (int32_t k0 = 0; k0 < K; k0 += kSIMT_K)
    {
        for (int32_t i = threadIdx.x; i < kSIMT_M * kSIMT_K; i += kSIMT_THREADS)
        {
            int32_t const m = i / kSIMT_K, k = k0 + i % kSIMT_K;
            int32_t const pair = pairOf[m];
            int64_t const row = GATE_UP ? pair / p.topK : pair;
            aTile[m][i % kSIMT_K] = (pair >= 0 && k < K) ? toFloat(a[row * K + k]) : 0.F;
        }
        for (int32_t i = threadIdx.x; i < kHALVES * kSIMT_N * kSIMT_K; i += kSIMT_THREADS)
        {
            int32_t const h = i / (kSIMT_N * kSIMT_K), n = (i / kSIMT_K) % kSIMT_N, k = i % kSIMT_K;
            int32_t const c = col0 + n;
            bTile[h][k][n]
                = (c < cols && k0 + k < K) ? toFloat(weight[(static_cast<int64_t>(h) * cols + c) * K + k0 + k]) : 0.F;
        }
        __syncthreads();
#pragma unroll 8
        for (int32_t k = 0; k < kSIMT_K; ++k)
        {
#pragma unroll
            for (int32_t h = 0; h < kHALVES; ++h)
            {
                float const b = bTile[h][k][tx];
#pragma unroll
                for (int32_t r = 0; r < kSIMT_ROWS; ++r)
                {
                    acc[h][r] += aTile[ty * kSIMT_ROWS + r][k] * b;
                }
            }
        }
        __syncthreads();
    }
    int32_t const c = col0 + tx;
    if (c >= cols)
    {
        return;
    }
#pragma unroll
    for (int32_t r = 0; r < kSIMT_ROWS; ++r)
    {
        int32_t const pair = pairOf[ty * kSIMT_ROWS + r];
        if (pair < 0)
        {
            continue;
        }
        if (GATE_UP)
        {
            static_cast<T*>(w.act)[static_cast<int64_t>(pair) * cols + c]
                = fromFloat<T>(silu(acc[0][r]) * acc[kHALVES - 1][r]);
        }
        else
        {
            w.y[static_cast<int64_t>(pair) * cols + c] = w.weights[pair] * acc[0][r];
        }
    }
}

} // namespace moe
} // namespace gdn
