/*
 * Recurrent gated delta rule kernel: decode (T == 1) and short sequences.
 *
 * One block of 128 threads owns a [Dk, 32] column tile of one (sequence, value head) state and keeps
 * it in registers for the whole sequence, so the state is read once and written once. Columns of
 * the state are independent, so tiles need no communication. Per token, with the decayed state
 * S' = a S, one reduction over Dk gives both S'^T k and S'^T q:
 *     u = beta (v - S'^T k),  o = S'^T q~ + u (k . q~)  (q~ = scale q),  S = S' + k u^T.
 * Works for any Dk <= kDK and any Dv (edges masked), and for varlen packs.
 * S is the state's storage type (float, __half, __nv_bfloat16): loaded once into fp32 registers and
 * rounded once at the final store, so a 16-bit state moves half the bytes of an fp32 one.
 */
#pragma once

#include "gatedDeltaRuleCommon.cuh"
#include "gatedDeltaRuleKernels.h"

namespace gdn
{
namespace kernels
{

constexpr int32_t kREC_THREADS = 128;
constexpr int32_t kREC_BV = 32;      // state columns per block: 8 lanes x 4 columns
constexpr int32_t kREC_KGROUPS = 16; // row groups: 4 per warp x 4 warps
constexpr float kL2NORM_EPS = 1e-6F;

//! Token range [bos, bos + len) of sequence n (flattened over B * T).
__device__ __forceinline__ void sequenceBounds(GatedDeltaRuleParams const& p, int32_t n, int64_t& bos, int32_t& len)
{
    if (p.cuSeqlens != nullptr)
    {
        int32_t const start = p.cuSeqlens[n];
        bos = start;
        len = p.cuSeqlens[n + 1] - start;
    }
    else
    {
        bos = static_cast<int64_t>(n) * p.seqLen;
        len = p.seqLen;
    }
}

// At most 64 registers up to Dk = 128: eight blocks per multiprocessor keep enough state loads in
// flight for a bandwidth-bound decode step.
template <typename T, typename S, int32_t kDK>
__global__ void __launch_bounds__(kREC_THREADS, kDK <= 128 ? 8 : 3) gatedDeltaRuleRecurrentKernel(GatedDeltaRuleParams const p)
{
    constexpr int32_t kROWS = kDK / kREC_KGROUPS;
    constexpr int32_t kLANE_ELEMS = (kDK + kWARP - 1) / kWARP;
    static_assert(kDK % kREC_KGROUPS == 0, "kDK must be a multiple of 16");

    __shared__ float sQ[kDK];
    __shared__ float sK[kDK];
    __shared__ float sV[kREC_BV];
    __shared__ float sScalar[3]; // exp(g), beta, scale * (q . k) after normalisation
    __shared__ float sRed[kREC_THREADS / kWARP][2][kREC_BV];

    int32_t const dk = p.keyDim;
    int32_t const dv = p.valueDim;
    int32_t const hv = p.numValueHeads;
    int32_t const hk = p.numKeyHeads;
    int32_t const h = blockIdx.y;
    int32_t const n = blockIdx.z;
    int32_t const kh = h / (hv / hk);
    int32_t const warp = threadIdx.x / kWARP;
    int32_t const lane = threadIdx.x % kWARP;
    int32_t const vl = lane % 8;
    int32_t const kl = lane / 8;
    int32_t const kg = warp * 4 + kl;
    int32_t const col0 = blockIdx.x * kREC_BV + vl * 4;
    bool const vecCols = (dv % 4 == 0) && (col0 < dv);

    int64_t bos;
    int32_t len;
    sequenceBounds(p, n, bos, len);

    size_t const stateOffset = (static_cast<size_t>(n) * hv + h) * static_cast<size_t>(dk) * dv;
    S const* init = static_cast<S const*>(p.initialState);
    float s[kROWS][4];
#pragma unroll
    for (int32_t i = 0; i < kROWS; ++i)
    {
        int32_t const r = kg + kREC_KGROUPS * i;
        S const* src = init + stateOffset + static_cast<size_t>(r) * dv + col0;
        if (init != nullptr && r < dk && vecCols)
        {
            loadVec4(src, s[i]);
        }
        else
        {
#pragma unroll
            for (int32_t c = 0; c < 4; ++c)
            {
                bool const ok = init != nullptr && r < dk && col0 + c < dv;
                s[i][c] = ok ? toFloat(src[c]) : 0.F;
            }
        }
    }

    T const* q = static_cast<T const*>(p.q);
    T const* k = static_cast<T const*>(p.k);
    T const* v = static_cast<T const*>(p.v);
    T const* beta = static_cast<T const*>(p.beta);
    T* o = static_cast<T*>(p.o);

    for (int32_t t = 0; t < len; ++t)
    {
        int64_t const tok = bos + t;
        if (warp == 0)
        {
            float qa[kLANE_ELEMS];
            float ka[kLANE_ELEMS];
            float ssq = 0.F;
            float ssk = 0.F;
            float sqk = 0.F;
            int64_t const qkBase = (tok * hk + kh) * dk;
#pragma unroll
            for (int32_t j = 0; j < kLANE_ELEMS; ++j)
            {
                int32_t const d = lane + j * kWARP;
                qa[j] = d < dk ? toFloat(q[qkBase + d]) : 0.F;
                ka[j] = d < dk ? toFloat(k[qkBase + d]) : 0.F;
                ssq += qa[j] * qa[j];
                ssk += ka[j] * ka[j];
                sqk += qa[j] * ka[j];
            }
            float rq = 1.F;
            float rk = 1.F;
            if (p.useQkL2norm)
            {
                rq = rsqrtf(warpSum(ssq) + kL2NORM_EPS);
                rk = rsqrtf(warpSum(ssk) + kL2NORM_EPS);
            }
            sqk = warpSum(sqk);
#pragma unroll
            for (int32_t j = 0; j < kLANE_ELEMS; ++j)
            {
                int32_t const d = lane + j * kWARP;
                if (d < kDK)
                {
                    sQ[d] = qa[j] * rq * p.scale;
                    sK[d] = ka[j] * rk;
                }
            }
            if (lane == 0)
            {
                int64_t const gi = tok * hv + h;
                sScalar[0] = __expf(p.g[gi]);
                sScalar[1] = toFloat(beta[gi]);
                sScalar[2] = sqk * rq * rk * p.scale;
            }
        }
        else if (warp == 1)
        {
            int32_t const c = blockIdx.x * kREC_BV + lane;
            sV[lane] = c < dv ? toFloat(v[(tok * hv + h) * dv + c]) : 0.F;
        }
        __syncthreads();

        float const a = sScalar[0];
        float pk[4] = {0.F, 0.F, 0.F, 0.F};
        float pq[4] = {0.F, 0.F, 0.F, 0.F};
#pragma unroll
        for (int32_t i = 0; i < kROWS; ++i)
        {
            int32_t const r = kg + kREC_KGROUPS * i;
            float const kr = sK[r];
            float const qr = sQ[r];
#pragma unroll
            for (int32_t c = 0; c < 4; ++c)
            {
                s[i][c] *= a;
                pk[c] += s[i][c] * kr;
                pq[c] += s[i][c] * qr;
            }
        }
#pragma unroll
        for (int32_t c = 0; c < 4; ++c)
        {
            // lanes differing in bits 3 and 4 hold the other row groups of this warp
            pk[c] += __shfl_xor_sync(0xffffffffU, pk[c], 8);
            pk[c] += __shfl_xor_sync(0xffffffffU, pk[c], 16);
            pq[c] += __shfl_xor_sync(0xffffffffU, pq[c], 8);
            pq[c] += __shfl_xor_sync(0xffffffffU, pq[c], 16);
        }
        if (kl == 0)
        {
#pragma unroll
            for (int32_t c = 0; c < 4; ++c)
            {
                sRed[warp][0][vl * 4 + c] = pk[c];
                sRed[warp][1][vl * 4 + c] = pq[c];
            }
        }
        __syncthreads();

        float const b = sScalar[1];
        float const qk = sScalar[2];
        float u[4];
        float out[4];
#pragma unroll
        for (int32_t c = 0; c < 4; ++c)
        {
            int32_t const cc = vl * 4 + c;
            float const kS = sRed[0][0][cc] + sRed[1][0][cc] + sRed[2][0][cc] + sRed[3][0][cc];
            float const qS = sRed[0][1][cc] + sRed[1][1][cc] + sRed[2][1][cc] + sRed[3][1][cc];
            u[c] = b * (sV[cc] - kS);
            out[c] = qS + u[c] * qk;
        }
        if (warp == 0 && kl == 0)
        {
            T* dst = o + (tok * hv + h) * dv + col0;
#pragma unroll
            for (int32_t c = 0; c < 4; ++c)
            {
                if (col0 + c < dv)
                {
                    dst[c] = fromFloat<T>(out[c]);
                }
            }
        }
#pragma unroll
        for (int32_t i = 0; i < kROWS; ++i)
        {
            float const kr = sK[kg + kREC_KGROUPS * i];
#pragma unroll
            for (int32_t c = 0; c < 4; ++c)
            {
                s[i][c] += kr * u[c];
            }
        }
        __syncthreads(); // the next token overwrites sQ, sK, sV, sScalar and sRed
    }

#pragma unroll
    for (int32_t i = 0; i < kROWS; ++i)
    {
        int32_t const r = kg + kREC_KGROUPS * i;
        if (r >= dk)
        {
            continue;
        }
        S* dst = static_cast<S*>(p.finalState) + stateOffset + static_cast<size_t>(r) * dv + col0;
        if (vecCols)
        {
            storeVec4(dst, s[i]);
        }
        else
        {
#pragma unroll
            for (int32_t c = 0; c < 4; ++c)
            {
                if (col0 + c < dv)
                {
                    dst[c] = fromFloat<S>(s[i][c]);
                }
            }
        }
    }
}

} // namespace kernels
} // namespace gdn
