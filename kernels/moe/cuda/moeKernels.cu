/*
 * Routed experts: routing, per-expert row lists, grouped SwiGLU GEMMs, combine (see moeKernels.h).
 *
 * fp16 / bf16 run the grouped GEMMs on tensor cores (moeGemmWmma.cuh) with 16-row blocks while
 * experts get few rows (decode) and 64-row blocks otherwise; fp32 runs them on CUDA cores
 * (moeGemmSimt.cuh). Either way a CTA reads one expert's weight tile once for all its rows.
 */
#include "moeKernels.h"

#include "moeCommon.cuh"
#include "moeGemmSimt.cuh"
#include "moeGemmWmma.cuh"

#include <cfloat>
#include <type_traits>

namespace gdn
{
namespace moe
{
namespace
{

constexpr int32_t kMIN_BLOCK_M = 16;  // smallest row block of any GEMM: sizes the block table
constexpr int32_t kROUTE_WARPS = 4;   // tokens per routing CTA
constexpr int32_t kALIGN_THREADS = kMOE_MAX_EXPERTS;
constexpr int32_t kWIDE_ROWS = 32;    // mean rows per expert from which 64-row blocks pay off

size_t align256(size_t bytes)
{
    return (bytes + 255) / 256 * 256;
}

int64_t maxBlocks(MoEParams const& p, int32_t blockM)
{
    // every hit expert wastes at most one partial block; at most min(N k, E) experts are hit
    int64_t const pairs = static_cast<int64_t>(p.numTokens) * p.topK;
    return (pairs + blockM - 1) / blockM + (pairs < p.numExperts ? pairs : p.numExperts);
}

Workspace carve(MoEParams const& p, void* base)
{
    int64_t const n = p.numTokens, e = p.numExperts, pairs = n * p.topK, blocks = maxBlocks(p, kMIN_BLOCK_M);
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
    w.act = take(sizeof(float) * pairs * p.interSize);
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

// One CTA: row blocks per expert (exclusive scan of ceil(counts / blockM)), then the block table.
__global__ void __launch_bounds__(kALIGN_THREADS)
    moeAlignKernel(MoEParams const p, Workspace const w, int32_t blockM, int32_t blocks)
{
    __shared__ int32_t scan[kALIGN_THREADS];
    int32_t const e = threadIdx.x;
    int32_t const nb = e < p.numExperts ? (w.counts[e] + blockM - 1) / blockM : 0;
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
        w.blockRow0[start + b] = b * blockM;
    }
    for (int32_t b = scan[kALIGN_THREADS - 1] + e; b < blocks; b += kALIGN_THREADS)
    {
        w.blockExpert[b] = -1;
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

template <typename T, bool GATE_UP>
void launchGemm(MoEParams const& p, Workspace const& w, int32_t blockM, int32_t blocks, cudaStream_t stream)
{
    int32_t const cols = GATE_UP ? p.interSize : p.hiddenSize;
    if constexpr (std::is_same_v<T, float>)
    {
        dim3 const grid(blocks, (cols + kSIMT_N - 1) / kSIMT_N);
        moeGemmSimtKernel<T, GATE_UP><<<grid, kSIMT_THREADS, 0, stream>>>(p, w);
    }
    else
    {
        dim3 const grid(blocks, (cols + kWMMA_N - 1) / kWMMA_N);
        if (blockM == 64)
        {
            moeGemmWmmaKernel<T, GATE_UP, 64, 64><<<grid, kWMMA_WARPS * 32, 0, stream>>>(p, w);
        }
        else
        {
            moeGemmWmmaKernel<T, GATE_UP, 16, 128><<<grid, kWMMA_WARPS * 32, 0, stream>>>(p, w);
        }
    }
}

template <typename T>
cudaError_t launchTyped(MoEParams const& p, Workspace const& w, cudaStream_t stream)
{
    int64_t const pairs = static_cast<int64_t>(p.numTokens) * p.topK;
    bool const wide = !std::is_same_v<T, float> && pairs >= static_cast<int64_t>(kWIDE_ROWS) * p.numExperts;
    int32_t const blockM = wide ? 64 : kMIN_BLOCK_M;
    int32_t const blocks = static_cast<int32_t>(maxBlocks(p, blockM));
    cudaError_t err = cudaMemsetAsync(w.counts, 0, sizeof(int32_t) * p.numExperts, stream);
    if (err != cudaSuccess)
    {
        return err;
    }
    size_t const routeSmem = sizeof(float) * kROUTE_WARPS * p.numExperts;
    moeRouteKernel<T><<<(p.numTokens + kROUTE_WARPS - 1) / kROUTE_WARPS, kROUTE_WARPS * 32, routeSmem, stream>>>(p, w);
    moeAlignKernel<<<1, kALIGN_THREADS, 0, stream>>>(p, w, blockM, blocks);
    launchGemm<T, true>(p, w, blockM, blocks, stream);
    launchGemm<T, false>(p, w, blockM, blocks, stream);
    int64_t const total = static_cast<int64_t>(p.numTokens) * p.hiddenSize;
    moeCombineKernel<T><<<static_cast<uint32_t>((total + 255) / 256), 256, 0, stream>>>(p, w);
    return cudaGetLastError();
}

bool valid(MoEParams const& p)
{
    int64_t const pairs = static_cast<int64_t>(p.numTokens) * p.topK;
    return p.numTokens >= 0 && p.hiddenSize > 0 && p.interSize > 0 && p.numExperts > 0
        && p.numExperts <= kMOE_MAX_EXPERTS && p.topK >= 1 && p.topK <= p.numExperts && p.topK <= kMOE_MAX_TOP_K
        && maxBlocks(p, kMIN_BLOCK_M) <= INT32_MAX && pairs * p.hiddenSize / 256 < UINT32_MAX
        && (p.numTokens == 0
            || (p.hidden != nullptr && p.routerLogits != nullptr && p.gateUp != nullptr && p.down != nullptr
                && p.out != nullptr));
}

} // namespace
} // namespace moe

size_t moeWorkspaceSize(MoEParams const& p)
{
    using moe::align256;
    int64_t const n = p.numTokens, e = p.numExperts, pairs = n * p.topK, blocks = moe::maxBlocks(p, moe::kMIN_BLOCK_M);
    return align256(sizeof(int32_t) * e) + align256(sizeof(int32_t) * e * n) + 2 * align256(sizeof(int32_t) * blocks)
        + align256(sizeof(float) * pairs) + align256(sizeof(float) * pairs * p.interSize)
        + align256(sizeof(float) * pairs * p.hiddenSize);
}

cudaError_t launchMoE(MoEParams const& p, void* workspace, cudaStream_t stream)
{
    using namespace moe;
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
