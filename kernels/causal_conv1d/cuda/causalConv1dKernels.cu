/*
 * Causal depthwise conv1d with a rolling state: one kernel for prefill (T > 1) and the single-step
 * update (T == 1).
 *
 * A thread owns one channel of one batch row over a tile of kTILE tokens and slides a register
 * window over time (channels are contiguous in x, so a warp's loads coalesce). The thread of tile 0
 * is the only one that reads convState and the only one that writes newConvState, and it reads the
 * whole old state before writing, so convState may alias newConvState (in-place decode).
 * Ragged rows (seqLens) change only the new state: it ends at the row's last real token.
 */
#include "causalConv1dKernels.h"

#include "../../cuda_common/floatConvert.cuh"

namespace gdn
{
namespace
{

constexpr int32_t kTHREADS = 128;
constexpr int32_t kTILE = 64;  // tokens per thread; must be >= kMAX_K - 1
constexpr int32_t kMAX_K = 8;  // longest supported kernel
constexpr int32_t kBATCH = 8;  // tokens loaded together
static_assert(kTILE % kBATCH == 0, "a tile is whole batches");
static_assert(kTILE >= kMAX_K - 1, "tile 0 must be the only reader of the old state");

template <typename T>
__global__ void __launch_bounds__(kTHREADS) causalConv1dKernel(CausalConv1dParams const p)
{
    int32_t const c = blockIdx.x * kTHREADS + threadIdx.x;
    int32_t const tile = blockIdx.y;
    int32_t const b = blockIdx.z;
    int32_t const C = p.channels;
    int32_t const K = p.kernelSize;
    int32_t const seqLen = p.seqLen;
    if (c >= C)
    {
        return;
    }
    T const* __restrict__ x = static_cast<T const*>(p.x) + static_cast<int64_t>(b) * seqLen * C + c;
    T const* w = static_cast<T const*>(p.weight) + static_cast<int64_t>(c) * K;
    T const* state = p.convState == nullptr
        ? nullptr
        : static_cast<T const*>(p.convState) + (static_cast<int64_t>(b) * C + c) * (K - 1);
    T* __restrict__ y = static_cast<T*>(p.y) + static_cast<int64_t>(b) * seqLen * C + c;

    // wr[m] multiplies x_{t - m}; win[kMAX_K - 1 - m] holds x_{t - m}.
    float wr[kMAX_K];
    float win[kMAX_K];
    float oldState[kMAX_K - 1];
#pragma unroll
    for (int32_t m = 0; m < kMAX_K; ++m)
    {
        wr[m] = m < K ? toFloat(w[K - 1 - m]) : 0.F;
    }
    float const bias = p.bias == nullptr ? 0.F : toFloat(static_cast<T const*>(p.bias)[c]);
#pragma unroll
    for (int32_t i = 0; i < kMAX_K - 1; ++i)
    {
        oldState[i] = (tile == 0 && state != nullptr && i < K - 1) ? toFloat(state[i]) : 0.F;
    }

    int32_t const t0 = tile * kTILE;
    int32_t const t1 = min(seqLen, t0 + kTILE);
#pragma unroll
    for (int32_t m = 1; m < kMAX_K; ++m)
    {
        int32_t const tau = t0 - m; // x_tau, or the state entry tau + K - 1 when tau < 0
        float val = 0.F;
        if (m < K)
        {
            if (tau >= 0)
            {
                val = toFloat(x[static_cast<int64_t>(tau) * C]);
            }
            else
            {
#pragma unroll
                for (int32_t i = 0; i < kMAX_K - 1; ++i)
                {
                    val = (i == tau + K - 1) ? oldState[i] : val;
                }
            }
        }
        win[kMAX_K - 1 - m] = val;
    }

    // One output from the window (whose newest entry is x_t), then slide it.
    auto step = [&](float xt, int32_t t) {
        win[kMAX_K - 1] = xt;
        float acc = bias;
#pragma unroll
        for (int32_t m = 0; m < kMAX_K; ++m)
        {
            acc += wr[m] * win[kMAX_K - 1 - m];
        }
        if (p.silu)
        {
            acc = acc / (1.F + __expf(-acc));
        }
        y[static_cast<int64_t>(t) * C] = fromFloat<T>(acc);
#pragma unroll
        for (int32_t m = 0; m < kMAX_K - 1; ++m)
        {
            win[m] = win[m + 1];
        }
    };
    // Whole batches with kBATCH loads in flight before the first use (the loop is latency-bound
    // otherwise), then the remainder one token at a time (all of a decode step).
    int32_t t = t0;
    for (; t + kBATCH <= t1; t += kBATCH)
    {
        float xb[kBATCH];
#pragma unroll
        for (int32_t u = 0; u < kBATCH; ++u)
        {
            xb[u] = toFloat(x[static_cast<int64_t>(t + u) * C]);
        }
#pragma unroll
        for (int32_t u = 0; u < kBATCH; ++u)
        {
            step(xb[u], t + u);
        }
    }
    for (; t < t1; ++t)
    {
        step(toFloat(x[static_cast<int64_t>(t) * C]), t);
    }

    if (tile == 0)
    {
        // Row length, clamped to [0, T]: the state ends after the last real token.
        int32_t const len = p.seqLens == nullptr ? seqLen : max(0, min(seqLen, p.seqLens[b]));
        T* newState = static_cast<T*>(p.newConvState) + (static_cast<int64_t>(b) * C + c) * (K - 1);
#pragma unroll
        for (int32_t i = 0; i < kMAX_K - 1; ++i)
        {
            if (i < K - 1)
            {
                int32_t const tau = len + i - (K - 1); // newState[i] = xs[len + i]
                float val = 0.F;
                if (tau >= 0)
                {
                    val = toFloat(x[static_cast<int64_t>(tau) * C]);
                }
                else
                {
#pragma unroll
                    for (int32_t j = 0; j < kMAX_K - 1; ++j)
                    {
                        val = (j == len + i) ? oldState[j] : val;
                    }
                }
                newState[i] = fromFloat<T>(val);
            }
        }
    }
}

template <typename T>
cudaError_t launchTyped(CausalConv1dParams const& p, cudaStream_t stream)
{
    int32_t const tiles = p.seqLen == 0 ? 1 : (p.seqLen + kTILE - 1) / kTILE;
    dim3 const grid((p.channels + kTHREADS - 1) / kTHREADS, tiles, p.batch);
    causalConv1dKernel<T><<<grid, kTHREADS, 0, stream>>>(p);
    return cudaGetLastError();
}

} // namespace

cudaError_t launchCausalConv1d(CausalConv1dParams const& params, cudaStream_t stream)
{
    CausalConv1dParams const& p = params;
    bool const shapeOk = p.batch >= 0 && p.seqLen >= 0 && p.channels >= 1 && p.kernelSize >= 1
        && p.kernelSize <= kMAX_K && p.batch <= 65535 && (p.seqLen + kTILE - 1) / kTILE <= 65535;
    bool const pointersOk = p.x != nullptr && p.weight != nullptr && p.y != nullptr
        && (p.kernelSize == 1 || p.newConvState != nullptr);
    if (!shapeOk || !pointersOk)
    {
        return cudaErrorInvalidValue;
    }
    if (p.batch == 0)
    {
        return cudaSuccess;
    }
    switch (p.dtype)
    {
    case DataType::kFLOAT32: return launchTyped<float>(p, stream);
    case DataType::kFLOAT16: return launchTyped<__half>(p, stream);
    case DataType::kBFLOAT16: return launchTyped<__nv_bfloat16>(p, stream);
    }
    return cudaErrorInvalidValue;
}

} // namespace gdn
