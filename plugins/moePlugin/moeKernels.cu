/*
 * Routed experts: routing, per-expert row lists, grouped SwiGLU GEMMs, combine (see moeKernels.h).
 *
 * The GEMMs are tiled SIMT kernels with fp32 accumulation: a CTA owns kBLOCK_M rows of one expert
 * and kBLOCK_N output columns, stages the gathered rows and the weight tile in shared memory
 * (weights read along their contiguous K axis, so loads coalesce) and loops over K. At decode the
 * work is bound by reading the routed experts' weights, which every CTA reads exactly once.
 */
#include "moeKernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>

namespace gdn
{
namespace
{

constexpr int32_t kBLOCK_M = 16;      // rows (token, slot pairs) per CTA
constexpr int32_t kBLOCK_N = 64;      // output columns per CTA
constexpr int32_t kBLOCK_K = 32;      // reduction step
constexpr int32_t kGEMM_THREADS = 256; // 64 columns x 4 row groups of 4 rows
constexpr int32_t kROWS_PER_THREAD = kBLOCK_M / (kGEMM_THREADS / kBLOCK_N);
constexpr int32_t kROUTE_WARPS = 4;   // tokens per routing CTA
constexpr int32_t kALIGN_THREADS = kMOE_MAX_EXPERTS;
static_assert(kROWS_PER_THREAD * (kGEMM_THREADS / kBLOCK_N) == kBLOCK_M, "thread layout covers the tile");

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

struct Workspace
{
    int32_t* counts;      // [E] rows per expert
    int32_t* rows;        // [E, N] pair ids (n * k + j) per expert, first counts[e] valid
    int32_t* blockExpert; // [maxBlocks] expert of each row block, -1 past the last
    int32_t* blockRow0;   // [maxBlocks] first row of the block in its expert's list
    float* weights;       // [N * k] routing weights
    float* act;           // [N * k, I] silu(gate) * up per pair
    float* y;             // [N * k, H] weighted expert output per pair
};

size_t align256(size_t bytes)
{
    return (bytes + 255) / 256 * 256;
}

int64_t maxBlocks(MoEParams const& p)
{
    // every hit expert wastes at most one partial block; at most min(N k, E) experts are hit
    int64_t const pairs = static_cast<int64_t>(p.numTokens) * p.topK;
    return (pairs + kBLOCK_M - 1) / kBLOCK_M + (pairs < p.numExperts ? pairs : p.numExperts);
}

Workspace carve(MoEParams const& p, void* base)
{
    int64_t const n = p.numTokens, e = p.numExperts, pairs = n * p.topK, blocks = maxBlocks(p);
    auto* cursor = static_cast<char*>(base);
    auto take = [&cursor](size_t bytes) {
        char* at = cursor;
        cursor += align256(bytes);
        return at;
    };
    Workspace w;
    w.counts = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * e));
    w.rows = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * e * n));
    w.blockExpert = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * blocks));
    w.blockRow0 = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * blocks));
    w.weights = reinterpret_cast<float*>(take(sizeof(float) * pairs));
    w.act = reinterpret_cast<float*>(take(sizeof(float) * pairs * p.interSize));
    w.y = reinterpret_cast<float*>(take(sizeof(float) * pairs * p.hiddenSize));
    return w;
}

// One warp per token: softmax in fp32, k rounds of warp argmax (ties: lower expert), renormalise,
// then lane 0 appends each pair to its expert's row list.
template <typename T>
__global__ void __launch_bounds__(kROUTE_WARPS * 32) moeRouteKernel(MoEParams const p, Workspace const w)
{
    extern __shared__ float probs[]; // [kROUTE_WARPS, E]
    int32_t const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int32_t const token = blockIdx.x * kROUTE_WARPS + warp;
    if (token >= p.numTokens)
    {
        return;
    }
    int32_t const E = p.numExperts;
    float* prob = probs + warp * E;
    T const* logits = static_cast<T const*>(p.routerLogits) + static_cast<int64_t>(token) * E;
    float m = -FLT_MAX;
    for (int32_t e = lane; e < E; e += 32)
    {
        prob[e] = toFloat(logits[e]);
        m = fmaxf(m, prob[e]);
    }
    for (int32_t o = 16; o > 0; o /= 2)
    {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    float s = 0.F;
    for (int32_t e = lane; e < E; e += 32)
    {
        prob[e] = __expf(prob[e] - m);
        s += prob[e];
    }
    for (int32_t o = 16; o > 0; o /= 2)
    {
        s += __shfl_xor_sync(0xffffffffu, s, o);
    }
    __syncwarp();
    float picked[kMOE_MAX_TOP_K];
    int32_t chosen[kMOE_MAX_TOP_K];
    float total = 0.F;
#pragma unroll 1
    for (int32_t j = 0; j < p.topK; ++j)
    {
        float best = -1.F;
        int32_t arg = E;
        for (int32_t e = lane; e < E; e += 32)
        {
            if (prob[e] > best)
            {
                best = prob[e];
                arg = e;
            }
        }
        for (int32_t o = 16; o > 0; o /= 2)
        {
            float const ob = __shfl_xor_sync(0xffffffffu, best, o);
            int32_t const oa = __shfl_xor_sync(0xffffffffu, arg, o);
            if (ob > best || (ob == best && oa < arg))
            {
                best = ob;
                arg = oa;
            }
        }
        __syncwarp();
        if (lane == 0)
        {
            prob[arg] = -2.F; // never picked again
        }
        __syncwarp();
        picked[j] = best / s;
        chosen[j] = arg;
        total += best / s;
    }
    if (lane == 0)
    {
        float const scale = p.normTopkProb ? 1.F / total : 1.F;
        for (int32_t j = 0; j < p.topK; ++j)
        {
            int32_t const pair = token * p.topK + j;
            int32_t const row = atomicAdd(w.counts + chosen[j], 1);
            w.rows[static_cast<int64_t>(chosen[j]) * p.numTokens + row] = pair;
            w.weights[pair] = picked[j] * scale;
        }
    }
}

// One CTA: row blocks per expert (exclusive scan of ceil(counts / kBLOCK_M)), then the block table.
__global__ void __launch_bounds__(kALIGN_THREADS) moeAlignKernel(MoEParams const p, Workspace const w, int32_t blocks)
{
    __shared__ int32_t scan[kALIGN_THREADS];
    int32_t const e = threadIdx.x;
    int32_t const nb = e < p.numExperts ? (w.counts[e] + kBLOCK_M - 1) / kBLOCK_M : 0;
    scan[e] = nb;
    __syncthreads();
    for (int32_t o = 1; o < kALIGN_THREADS; o *= 2)
    {
        int32_t const add = e >= o ? scan[e - o] : 0;
        __syncthreads();
        scan[e] += add;
        __syncthreads();
    }
    int32_t const start = scan[e] - nb;
    for (int32_t b = 0; b < nb; ++b)
    {
        w.blockExpert[start + b] = e;
        w.blockRow0[start + b] = b * kBLOCK_M;
    }
    for (int32_t b = scan[kALIGN_THREADS - 1] + e; b < blocks; b += kALIGN_THREADS)
    {
        w.blockExpert[b] = -1;
    }
}

// Grouped GEMM over one row block of one expert. GATE_UP: A = hidden rows of the pairs' tokens,
// B = gate and up rows of gateUp[e] (K = H), act = silu(A Bg^T) * (A Bu^T).
// Otherwise: A = act rows of the pairs, B = down[e] (K = I), y = weight * (A B^T).
template <typename T, bool GATE_UP>
__global__ void __launch_bounds__(kGEMM_THREADS) moeGemmKernel(MoEParams const p, Workspace const w)
{
    constexpr int32_t kHALVES = GATE_UP ? 2 : 1;
    __shared__ float aTile[kBLOCK_M][kBLOCK_K];
    __shared__ float bTile[kHALVES][kBLOCK_K][kBLOCK_N + 1];
    __shared__ int32_t pairOf[kBLOCK_M];
    int32_t const expert = w.blockExpert[blockIdx.x];
    if (expert < 0)
    {
        return;
    }
    int32_t const row0 = w.blockRow0[blockIdx.x];
    int32_t const count = w.counts[expert];
    int32_t const K = GATE_UP ? p.hiddenSize : p.interSize;
    int32_t const cols = GATE_UP ? p.interSize : p.hiddenSize;
    int32_t const col0 = blockIdx.y * kBLOCK_N;
    if (threadIdx.x < kBLOCK_M)
    {
        int32_t const r = row0 + threadIdx.x;
        pairOf[threadIdx.x] = r < count ? w.rows[static_cast<int64_t>(expert) * p.numTokens + r] : -1;
    }
    __syncthreads();
    T const* weight = static_cast<T const*>(GATE_UP ? p.gateUp : p.down)
        + static_cast<int64_t>(expert) * kHALVES * cols * K;
    int32_t const tx = threadIdx.x % kBLOCK_N, ty = threadIdx.x / kBLOCK_N;
    float acc[kHALVES][kROWS_PER_THREAD] = {};
    for (int32_t k0 = 0; k0 < K; k0 += kBLOCK_K)
    {
        for (int32_t i = threadIdx.x; i < kBLOCK_M * kBLOCK_K; i += kGEMM_THREADS)
        {
            int32_t const m = i / kBLOCK_K, k = k0 + i % kBLOCK_K;
            int32_t const pair = pairOf[m];
            float v = 0.F;
            if (pair >= 0 && k < K)
            {
                v = GATE_UP ? toFloat(static_cast<T const*>(p.hidden)[static_cast<int64_t>(pair / p.topK) * K + k])
                            : w.act[static_cast<int64_t>(pair) * K + k];
            }
            aTile[m][i % kBLOCK_K] = v;
        }
        for (int32_t i = threadIdx.x; i < kHALVES * kBLOCK_N * kBLOCK_K; i += kGEMM_THREADS)
        {
            int32_t const h = i / (kBLOCK_N * kBLOCK_K), n = (i / kBLOCK_K) % kBLOCK_N, k = i % kBLOCK_K;
            int32_t const c = col0 + n;
            bTile[h][k][n] = (c < cols && k0 + k < K)
                ? toFloat(weight[(static_cast<int64_t>(h) * cols + c) * K + k0 + k])
                : 0.F;
        }
        __syncthreads();
#pragma unroll 8
        for (int32_t k = 0; k < kBLOCK_K; ++k)
        {
#pragma unroll
            for (int32_t h = 0; h < kHALVES; ++h)
            {
                float const b = bTile[h][k][tx];
#pragma unroll
                for (int32_t r = 0; r < kROWS_PER_THREAD; ++r)
                {
                    acc[h][r] += aTile[ty * kROWS_PER_THREAD + r][k] * b;
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
    for (int32_t r = 0; r < kROWS_PER_THREAD; ++r)
    {
        int32_t const pair = pairOf[ty * kROWS_PER_THREAD + r];
        if (pair < 0)
        {
            continue;
        }
        if (GATE_UP)
        {
            float const g = acc[0][r];
            w.act[static_cast<int64_t>(pair) * cols + c] = g / (1.F + __expf(-g)) * acc[kHALVES - 1][r];
        }
        else
        {
            w.y[static_cast<int64_t>(pair) * cols + c] = w.weights[pair] * acc[0][r];
        }
    }
}

template <typename T>
__global__ void moeCombineKernel(MoEParams const p, Workspace const w)
{
    int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    int64_t const H = p.hiddenSize;
    if (i >= static_cast<int64_t>(p.numTokens) * H)
    {
        return;
    }
    int64_t const n = i / H, h = i % H;
    float s = 0.F;
    for (int32_t j = 0; j < p.topK; ++j)
    {
        s += w.y[(n * p.topK + j) * H + h];
    }
    static_cast<T*>(p.out)[i] = fromFloat<T>(s);
}

template <typename T>
cudaError_t launchTyped(MoEParams const& p, Workspace const& w, cudaStream_t stream)
{
    int32_t const blocks = static_cast<int32_t>(maxBlocks(p));
    cudaError_t err = cudaMemsetAsync(w.counts, 0, sizeof(int32_t) * p.numExperts, stream);
    if (err != cudaSuccess)
    {
        return err;
    }
    size_t const routeSmem = sizeof(float) * kROUTE_WARPS * p.numExperts;
    moeRouteKernel<T><<<(p.numTokens + kROUTE_WARPS - 1) / kROUTE_WARPS, kROUTE_WARPS * 32, routeSmem, stream>>>(p, w);
    moeAlignKernel<<<1, kALIGN_THREADS, 0, stream>>>(p, w, blocks);
    dim3 const gateGrid(blocks, (p.interSize + kBLOCK_N - 1) / kBLOCK_N);
    moeGemmKernel<T, true><<<gateGrid, kGEMM_THREADS, 0, stream>>>(p, w);
    dim3 const downGrid(blocks, (p.hiddenSize + kBLOCK_N - 1) / kBLOCK_N);
    moeGemmKernel<T, false><<<downGrid, kGEMM_THREADS, 0, stream>>>(p, w);
    int64_t const total = static_cast<int64_t>(p.numTokens) * p.hiddenSize;
    moeCombineKernel<T><<<static_cast<uint32_t>((total + 255) / 256), 256, 0, stream>>>(p, w);
    return cudaGetLastError();
}

bool valid(MoEParams const& p)
{
    int64_t const pairs = static_cast<int64_t>(p.numTokens) * p.topK;
    return p.numTokens >= 0 && p.hiddenSize > 0 && p.interSize > 0 && p.numExperts > 0
        && p.numExperts <= kMOE_MAX_EXPERTS && p.topK >= 1 && p.topK <= p.numExperts && p.topK <= kMOE_MAX_TOP_K
        && maxBlocks(p) <= INT32_MAX && pairs * p.hiddenSize / 256 < UINT32_MAX
        && (p.numTokens == 0
            || (p.hidden != nullptr && p.routerLogits != nullptr && p.gateUp != nullptr && p.down != nullptr
                && p.out != nullptr));
}

} // namespace

size_t moeWorkspaceSize(MoEParams const& p)
{
    int64_t const n = p.numTokens, e = p.numExperts, pairs = n * p.topK, blocks = maxBlocks(p);
    return align256(sizeof(int32_t) * e) + align256(sizeof(int32_t) * e * n) + 2 * align256(sizeof(int32_t) * blocks)
        + align256(sizeof(float) * pairs) + align256(sizeof(float) * pairs * p.interSize)
        + align256(sizeof(float) * pairs * p.hiddenSize);
}

cudaError_t launchMoE(MoEParams const& p, void* workspace, cudaStream_t stream)
{
    if (!valid(p))
    {
        return cudaErrorInvalidValue;
    }
    if (p.numTokens == 0)
    {
        return cudaSuccess;
    }
    if (workspace == nullptr)
    {
        return cudaErrorInvalidValue;
    }
    Workspace const w = carve(p, workspace);
    switch (p.dtype)
    {
    case DataType::kFLOAT32: return launchTyped<float>(p, w, stream);
    case DataType::kFLOAT16: return launchTyped<__half>(p, w, stream);
    case DataType::kBFLOAT16: return launchTyped<__nv_bfloat16>(p, w, stream);
    }
    return cudaErrorInvalidValue;
}

} // namespace gdn
