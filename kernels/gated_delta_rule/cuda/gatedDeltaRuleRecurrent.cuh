/*
 * Recurrent gated delta rule kernel: decode (T == 1) and short sequences.
 *
 * One block owns a [Dk, BV] column tile of one (sequence, value head) state and keeps it in
 * registers for the whole sequence, so the state is read once and written once (RecurrentTile: an
 * fp32 state takes 128 threads x 4 columns, BV = 32; a 16-bit state 256 threads x 8 columns, BV = 64,
 * so that a block moves as many bytes either way: the per-token fixed cost of a block, not its
 * bytes, bounded the 16-bit step when it used the fp32 tile). Columns of
 * the state are independent, so tiles need no communication. Per token, with the decayed state
 * S' = a S, one reduction over Dk gives both S'^T k and S'^T q:
 *     u = beta (v - S'^T k),  o = S'^T q~ + u (k . q~)  (q~ = scale q),  S = S' + k u^T.
 * Works for any Dk <= kDK and any Dv (edges masked), and for varlen packs.
 * S is the state's storage type (float, __half, __nv_bfloat16): loaded once into fp32 registers and
 * rounded once at the final store, so a 16-bit state moves half the bytes of an fp32 one.
 * A decode step (T = 1) of a 16-bit state has its own kernel, gatedDeltaRuleDecode16Kernel (the
 * tile staged in shared memory in its storage form), at the end of this file.
 */
#pragma once

#include "../../cuda_common/mmaSync.cuh"
#include "gatedDeltaRuleCommon.cuh"
#include "gatedDeltaRuleKernels.h"

namespace gdn
{
namespace kernels
{

constexpr float kL2NORM_EPS = 1e-6F;

//! The decode kernel's tile for state storage S and key dim kDK: kCW state columns per thread
//! (8 lanes of a warp share a row, 4 rows per warp), kNW warps. A 16-bit state (kDK >= 32) takes
//! 16-byte loads of 8 columns and twice the warps, so that a block moves as many bytes as an fp32 one.
template <typename S, int32_t kDK>
struct RecurrentTile
{
    static constexpr bool kWIDE = sizeof(S) == 2 && kDK >= 32;
    static constexpr int32_t kCW = kWIDE ? 8 : 4;
    static constexpr int32_t kNW = kWIDE ? 8 : 4;
    static constexpr int32_t kTHREADS = kNW * kWARP;
    static constexpr int32_t kBV = 8 * kCW;      // state columns per block
    static constexpr int32_t kKGROUPS = 4 * kNW; // row groups
    //! 1024 threads per multiprocessor (64 registers) up to Dk = 128; wider rows need more registers.
    static constexpr int32_t kMIN_BLOCKS = kDK <= 128 ? 1024 / kTHREADS : (kWIDE ? 1 : 3);
};

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

// At most 64 registers up to Dk = 128: 1024 threads per multiprocessor keep enough state loads in
// flight for a bandwidth-bound decode step.
//! This thread's rows kg + kGROUPS i (i < kROWS) of a [Dk, Dv] state at `base`, columns col0 ..
//! col0 + kCW - 1 (those < dv; 16-byte stores where vecCols), converted to S.
template <int32_t kGROUPS, typename S, int32_t kROWS, int32_t kCW>
__device__ __forceinline__ void storeRows(S* base, float const (&s)[kROWS][kCW], int32_t kg, int32_t dk, int32_t dv,
    int32_t col0, bool vecCols)
{
#pragma unroll
    for (int32_t i = 0; i < kROWS; ++i)
    {
        int32_t const r = kg + kGROUPS * i;
        if (r >= dk)
        {
            continue;
        }
        S* dst = base + static_cast<size_t>(r) * dv + col0;
        if (vecCols)
        {
            storeVec(dst, s[i]);
        }
        else
        {
#pragma unroll
            for (int32_t c = 0; c < kCW; ++c)
            {
                if (col0 + c < dv)
                {
                    dst[c] = fromFloat<S>(s[i][c]);
                }
            }
        }
    }
}

// kSTEPS: also store the state after every token to p.stepStates (rounded to S, and the next token
// starts from the rounded value: T one-token launches' numbers); p.finalState may then be nullptr.
// Half the resident blocks: the stores' addresses under the 64-register cap spill 132 bytes a thread
// (fp32 state, Dk = 128, sm_90, ptxas -v, CUDA 13.0); a verify call is a few tokens, not a stream.
template <typename T, typename S, int32_t kDK, bool kSTEPS = false, typename Tile = RecurrentTile<S, kDK>>
__global__ void __launch_bounds__(Tile::kTHREADS, kSTEPS ? (Tile::kMIN_BLOCKS + 1) / 2 : Tile::kMIN_BLOCKS)
    gatedDeltaRuleRecurrentKernel(GatedDeltaRuleParams const p)
{
    constexpr int32_t kCW = Tile::kCW;
    constexpr int32_t kNW = Tile::kNW;
    constexpr int32_t kBV = Tile::kBV;
    constexpr int32_t kKGROUPS = Tile::kKGROUPS;
    constexpr int32_t kROWS = kDK / kKGROUPS;
    constexpr int32_t kLANE_ELEMS = (kDK + kWARP - 1) / kWARP;
    static_assert(kDK % kKGROUPS == 0, "kDK must be a multiple of the row groups");

    __shared__ float sQ[kDK];
    __shared__ float sK[kDK];
    __shared__ float sV[kBV];
    __shared__ float sScalar[3]; // exp(g), beta, scale * (q . k) after normalisation
    __shared__ float sRed[kNW][2][kBV];
    __shared__ float sSum[Tile::kWIDE ? 2 : 1][kBV]; // wide tile: S'^T k and S'^T q~ per column

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
    int32_t const col0 = blockIdx.x * kBV + vl * kCW;
    bool const vecCols = (dv % kCW == 0) && (col0 < dv);

    int64_t bos;
    int32_t len;
    sequenceBounds(p, n, bos, len);

    size_t const stateOffset = (static_cast<size_t>(n) * hv + h) * static_cast<size_t>(dk) * dv;
    S const* init = static_cast<S const*>(p.initialState);
    float s[kROWS][kCW];
#pragma unroll
    for (int32_t i = 0; i < kROWS; ++i)
    {
        int32_t const r = kg + kKGROUPS * i;
        S const* src = init + stateOffset + static_cast<size_t>(r) * dv + col0;
        if (init != nullptr && r < dk && vecCols)
        {
            loadVec(src, s[i]);
        }
        else
        {
#pragma unroll
            for (int32_t c = 0; c < kCW; ++c)
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
#pragma unroll
            for (int32_t j = lane; j < kBV; j += kWARP)
            {
                int32_t const c = blockIdx.x * kBV + j;
                sV[j] = c < dv ? toFloat(v[(tok * hv + h) * dv + c]) : 0.F;
            }
        }
        __syncthreads();

        float const a = sScalar[0];
        float pk[kCW];
        float pq[kCW];
#pragma unroll
        for (int32_t c = 0; c < kCW; ++c)
        {
            pk[c] = 0.F;
            pq[c] = 0.F;
        }
#pragma unroll
        for (int32_t i = 0; i < kROWS; ++i)
        {
            int32_t const r = kg + kKGROUPS * i;
            float const kr = sK[r];
            float const qr = sQ[r];
#pragma unroll
            for (int32_t c = 0; c < kCW; ++c)
            {
                s[i][c] *= a;
                pk[c] += s[i][c] * kr;
                pq[c] += s[i][c] * qr;
            }
        }
#pragma unroll
        for (int32_t c = 0; c < kCW; ++c)
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
            for (int32_t c = 0; c < kCW; ++c)
            {
                sRed[warp][0][vl * kCW + c] = pk[c];
                sRed[warp][1][vl * kCW + c] = pq[c];
            }
        }
        __syncthreads();
        if constexpr (Tile::kWIDE)
        {
            // Eight warps: one thread per (reduction, column) sums them once, instead of every row
            // group of a column summing them again.
            static_assert(2 * kBV <= Tile::kTHREADS, "one thread per (reduction, column)");
            if (threadIdx.x < 2 * kBV)
            {
                int32_t const which = threadIdx.x / kBV;
                int32_t const cc = threadIdx.x % kBV;
                float acc = 0.F;
#pragma unroll
                for (int32_t w = 0; w < kNW; ++w)
                {
                    acc += sRed[w][which][cc];
                }
                sSum[which][cc] = acc;
            }
            __syncthreads();
        }
        auto columnSum = [&](int32_t which, int32_t cc) {
            if constexpr (Tile::kWIDE)
            {
                return sSum[which][cc];
            }
            float acc = 0.F;
#pragma unroll
            for (int32_t w = 0; w < kNW; ++w)
            {
                acc += sRed[w][which][cc];
            }
            return acc;
        };

        float const b = sScalar[1];
        float const qk = sScalar[2];
        float u[kCW];
        float out[kCW];
#pragma unroll
        for (int32_t c = 0; c < kCW; ++c)
        {
            int32_t const cc = vl * kCW + c;
            u[c] = b * (sV[cc] - columnSum(0, cc));
            out[c] = columnSum(1, cc) + u[c] * qk;
        }
        if (warp == 0 && kl == 0)
        {
            T* dst = o + (tok * hv + h) * dv + col0;
#pragma unroll
            for (int32_t c = 0; c < kCW; ++c)
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
            float const kr = sK[kg + kKGROUPS * i];
#pragma unroll
            for (int32_t c = 0; c < kCW; ++c)
            {
                s[i][c] += kr * u[c];
            }
        }
        if constexpr (kSTEPS)
        {
            // [tokens, Hv, Dk, Dv]: token tok's state, as a one-token launch would store it
            size_t const stepOffset = (static_cast<size_t>(tok) * hv + h) * static_cast<size_t>(dk) * dv;
#pragma unroll
            for (int32_t i = 0; i < kROWS; ++i)
            {
#pragma unroll
                for (int32_t c = 0; c < kCW; ++c)
                {
                    s[i][c] = toFloat(fromFloat<S>(s[i][c]));
                }
            }
            storeRows<kKGROUPS>(static_cast<S*>(p.stepStates) + stepOffset, s, kg, dk, dv, col0, vecCols);
        }
        __syncthreads(); // the next token overwrites sQ, sK, sV, sScalar and sRed
    }

    if (kSTEPS && p.finalState == nullptr)
    {
        return;
    }
    storeRows<kKGROUPS>(static_cast<S*>(p.finalState) + stateOffset, s, kg, dk, dv, col0, vecCols);
}

//! For the 16-bit decode kernel below. gatedDeltaRuleRecurrentKernel repeats these steps inline on
//! purpose: calling this function there (forceinline, by reference or by value, with the kernel's
//! pointers and dims passed in) makes its sm_90 build of the fp32-state Dk = 128 decode spill (64
//! registers, 0 -> 20 bytes of spill stores and 72 of loads per thread, ptxas -v, CUDA 13.0).
//! The per-token vectors of one (token, value head), in shared memory, from two warps: warp 0 loads
//! q and k of key head kh, L2-normalises them (when asked) and stores q~ = scale q, k and the
//! scalars exp(g), beta, q~ . k; warp 1 loads the block's kBV columns of v.
template <typename T, int32_t kDK, int32_t kBV>
__device__ __forceinline__ void loadToken(GatedDeltaRuleParams const& p, int64_t tok, int32_t h, int32_t kh,
    int32_t warp, int32_t lane, float (&sQ)[kDK], float (&sK)[kDK], float (&sV)[kBV], float (&sScalar)[3])
{
    constexpr int32_t kLANE_ELEMS = (kDK + kWARP - 1) / kWARP;
    int32_t const dk = p.keyDim;
    int32_t const dv = p.valueDim;
    int32_t const hv = p.numValueHeads;
    int32_t const hk = p.numKeyHeads;
    T const* q = static_cast<T const*>(p.q);
    T const* k = static_cast<T const*>(p.k);
    T const* v = static_cast<T const*>(p.v);
    T const* beta = static_cast<T const*>(p.beta);
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
#pragma unroll
        for (int32_t j = lane; j < kBV; j += kWARP)
        {
            int32_t const c = blockIdx.x * kBV + j;
            sV[j] = c < dv ? toFloat(v[(tok * hv + h) * dv + c]) : 0.F;
        }
    }
}

//! Bits of a 16-bit state element, and two of them packed in a word (element 2j in the low half:
//! the order of a vector load). Keeping the state as words keeps it in registers.
template <typename S>
__device__ __forceinline__ uint32_t bits16(S x)
{
    if constexpr (std::is_same_v<S, __half>)
    {
        return __half_as_ushort(x);
    }
    else
    {
        return __bfloat16_as_ushort(x);
    }
}

template <typename S>
__device__ __forceinline__ float widen16(uint32_t word, int32_t half)
{
    uint32_t const b = half == 0 ? (word & 0xFFFFU) : (word >> 16);
    if constexpr (std::is_same_v<S, __half>)
    {
        return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
    }
    else
    {
        return __uint_as_float(b << 16); // bf16 -> fp32 is exact: the high half of the float
    }
}

template <typename S>
__device__ __forceinline__ uint32_t narrowPair16(float lo, float hi)
{
    return bits16(fromFloat<S>(lo)) | (bits16(fromFloat<S>(hi)) << 16);
}

//! The single-token tile of a 16-bit state: kNW warps, each thread kDK / kKGROUPS rows x 8 columns
//! of a [kDK, kBV] tile in the update (kBV / 8 lanes share a row). The block's state tile is copied
//! to shared memory with cp.async in its storage form (16-byte chunks of a row swizzled, so that
//! ldmatrix reads eight rows without bank conflicts; padded rows instead cost a resident block).
//! The reduction S^T [k~ q~] runs on the tensor cores: the tile as the 16-bit A operand, exact,
//! against k~ and q~ each split into three 16-bit parts (hi + mid + lo carry fp32's mantissa), fp32
//! accumulation; the update widens the tile to fp32 (exact) on the CUDA cores. On the CUDA cores
//! the reduction was half the kernel's instructions (H200: 42.6 us at B = 64, Hv 32, where the
//! same grid moving its tiles without arithmetic takes 37.3). (Measured on the H200: a
//! second, prefetched state buffer per block, or stages of rows waited for one by one, were slower
//! or no faster: the bytes in flight bound the loads.)
template <int32_t kDK, int32_t kBV_ = 64, int32_t kNW_ = 4, int32_t kMIN_BLOCKS_ = 1>
struct DecodeTile16
{
    static constexpr int32_t kCW = 8;
    //! Warps per block (>= 2: warp 0 loads q / k, warp 1 v), and the blocks per multiprocessor the
    //! registers are capped for (__launch_bounds__; 8 at 4 warps x 64 columns: 64 registers a
    //! thread, no spills). The launcher picks by grid size (launchRecurrentTile).
    static constexpr int32_t kNW = kNW_;
    static constexpr int32_t kTHREADS = kNW * kWARP;
    static constexpr int32_t kBV = kBV_;
    static constexpr int32_t kLANES_PER_ROW = kBV / kCW;
    static constexpr int32_t kKGROUPS = kNW * (kWARP / kLANES_PER_ROW);
    //! The tile needs at least one row per row group.
    static constexpr bool kFITS = kDK % kKGROUPS == 0;
    //! 16-byte chunks a tile row, and where chunk c of row r is stored: XOR-swizzled so that eight
    //! consecutive rows of one chunk fall in eight distinct bank groups.
    static constexpr int32_t kCPR = kBV / kCW;
    static __device__ __forceinline__ int32_t chunk(int32_t r, int32_t c)
    {
        return c ^ ((r / (8 / kCPR)) % kCPR);
    }
    //! Padded rows of the split vectors (16 bytes: conflict-free ldmatrix).
    static constexpr int32_t kLDB = kDK + 8;
    //! The reduction's products: kMT 16-column slabs, each over kDK / 16 row steps cut into kKSPLIT
    //! parts where the block has more warps than slabs (partial sums added in the update).
    static constexpr int32_t kMT = kBV / 16;
    static constexpr int32_t kWARPS_PER_SLAB = kNW > kMT ? kNW / kMT : 1;
    static constexpr int32_t kKSPLIT = (kDK / 16) % kWARPS_PER_SLAB == 0 ? kWARPS_PER_SLAB : 1;
    static constexpr int32_t kMIN_BLOCKS = kMIN_BLOCKS_;
    static_assert(kBV == 16 || kBV == 32 || kBV == 64, "2, 4 or 8 lanes per row");
    static_assert(kNW >= 2, "warp 0 loads q / k, warp 1 v");
    static_assert(kDK % 16 == 0, "the reduction takes 16 rows a product");
};

//! The B operand of the decode reduction, [kDK rows, 8] as 8 rows of kLDB 16-bit values (n major):
//! n = 0, 1, 2 the hi, mid and lo parts of k~, n = 3, 4, 5 those of q~, 6 and 7 zero. Written by
//! warp 0, which wrote sK and sQ (loadToken), lane d for rows d, d + 32, ... The parts take the
//! vectors' own scale: with an fp16 state (fp16 parts) and without the L2 norm, a q~ or k~ whose
//! entries all lie under fp16's normal range (6e-5) keeps only ~1e-2 of its precision, and entries
//! past 65504 overflow. With the L2 norm (every model) q~ and k~ have norms Dk^-1/2 and 1.
template <typename S, int32_t kDK, int32_t kLDB>
__device__ __forceinline__ void splitTokenVectors(
    float const (&sK)[kDK], float const (&sQ)[kDK], S (*sB)[kLDB], int32_t lane)
{
    __syncwarp();
    for (int32_t d = lane; d < kDK; d += kWARP)
    {
#pragma unroll
        for (int32_t which = 0; which < 2; ++which)
        {
            float const x = which == 0 ? sK[d] : sQ[d];
            S const hi = fromFloat<S>(x);
            float const r1 = x - toFloat(hi);
            S const mid = fromFloat<S>(r1);
            sB[3 * which][d] = hi;
            sB[3 * which + 1][d] = mid;
            sB[3 * which + 2][d] = fromFloat<S>(r1 - toFloat(mid));
        }
        sB[6][d] = fromFloat<S>(0.F);
        sB[7][d] = fromFloat<S>(0.F);
    }
}

//! One decode step (every sequence has exactly one token: seqLen == 1, no cuSeqlens) of a 16-bit
//! state S: gatedDeltaRuleRecurrentKernel's step with len == 1, its reduction S^T [k~ q~] summed by
//! the tensor cores (another order of the fp32 sums), its update in the same order.
template <typename T, typename S, int32_t kDK, typename Tile = DecodeTile16<kDK>>
__global__ void __launch_bounds__(Tile::kTHREADS, Tile::kMIN_BLOCKS) gatedDeltaRuleDecode16Kernel(
    GatedDeltaRuleParams const p)
{
    static_assert(sizeof(S) == 2, "16-bit states only");
    static_assert(Tile::kCW == 8, "one 16-byte vector of 8 columns per row");
    static_assert(Tile::kFITS, "kDK must be a multiple of the row groups");
    constexpr int32_t kCW = Tile::kCW;
    constexpr int32_t kLPR = Tile::kLANES_PER_ROW;
    constexpr int32_t kNW = Tile::kNW;
    constexpr int32_t kBV = Tile::kBV;
    constexpr int32_t kKGROUPS = Tile::kKGROUPS;
    constexpr int32_t kROWS = kDK / kKGROUPS;

    __shared__ alignas(16) S sS[kDK][kBV]; // chunks swizzled: Tile::chunk
    __shared__ alignas(16) S sB[8][Tile::kLDB];
    // q~ until it is split into sB, then a S^T k~ and a S^T q~ per column and row part (sharing the
    // bytes keeps a Dk 128 x 64 block under 20 KB: 11 fit a multiprocessor's shared memory).
    constexpr int32_t kSUMS = Tile::kKSPLIT * 2 * kBV;
    __shared__ float sQSum[kDK > kSUMS ? kDK : kSUMS];
    float(&sQ)[kDK] = *reinterpret_cast<float(*)[kDK]>(sQSum);
    float(*sSum)[2][kBV] = reinterpret_cast<float(*)[2][kBV]>(sQSum); // [part][k~ | q~][column]
    __shared__ float sK[kDK];
    __shared__ float sV[kBV];
    __shared__ float sScalar[3];

    int32_t const dk = p.keyDim;
    int32_t const dv = p.valueDim;
    int32_t const hv = p.numValueHeads;
    int32_t const h = blockIdx.y;
    int32_t const n = blockIdx.z;
    int32_t const kh = h / (hv / p.numKeyHeads);
    int32_t const warp = threadIdx.x / kWARP;
    int32_t const lane = threadIdx.x % kWARP;
    int32_t const vl = lane % kLPR;
    int32_t const kl = lane / kLPR;
    int32_t const kg = warp * (kWARP / kLPR) + kl;
    int32_t const c0 = vl * kCW; // first column of this thread inside the tile
    int32_t const col0 = blockIdx.x * kBV + c0;
    bool const vecCols = (dv % kCW == 0) && (col0 < dv);
    auto rowChunk = [&](int32_t r) { return &sS[r][Tile::chunk(r, vl) * kCW]; }; // this thread's 8 columns

    size_t const stateOffset = (static_cast<size_t>(n) * hv + h) * static_cast<size_t>(dk) * dv;
    S const* init = static_cast<S const*>(p.initialState);
#pragma unroll
    for (int32_t i = 0; i < kROWS; ++i)
    {
        int32_t const r = kg + kKGROUPS * i;
        S const* src = init + stateOffset + static_cast<size_t>(r) * dv + col0;
        bool const inside = init != nullptr && r < dk;
        if (vecCols || !inside)
        {
            // 0 source bytes zero-fill: rows past Dk and a missing initial state read as zeros (the
            // source is then any valid global address; nothing is read from it).
            cpAsync16(rowChunk(r), inside ? static_cast<void const*>(src) : p.q, inside ? 16 : 0);
        }
        else
        {
#pragma unroll
            for (int32_t c = 0; c < kCW; ++c)
            {
                rowChunk(r)[c] = col0 + c < dv ? src[c] : fromFloat<S>(0.F);
            }
        }
    }
    cpAsyncCommit();

    loadToken<T, kDK, kBV>(p, n, h, kh, warp, lane, sQ, sK, sV, sScalar);
    if (warp == 0)
    {
        splitTokenVectors<S, kDK, Tile::kLDB>(sK, sQ, sB, lane);
    }
    cpAsyncWaitAll();
    __syncthreads();

    // S^T [k~ q~] on the tensor cores, one product chain per (16-column slab, row part) and warp:
    // A (column m, row k) = S[k][m] through ldmatrix.trans, B = the split vectors; accumulator
    // column n of lane (g, t) is n = 2t, 2t + 1 (t = 0: k~ hi, mid; 1: k~ lo, q~ hi; 2: q~ mid, lo).
    constexpr int32_t kMT = Tile::kMT;
    constexpr int32_t kSTEPS = kDK / 16 / Tile::kKSPLIT;
    float const a = sScalar[0];
    int32_t const g = lane / 4;
    int32_t const t = lane % 4;
    for (int32_t job = warp; job < kMT * Tile::kKSPLIT; job += kNW)
    {
        int32_t const mt = job % kMT;
        int32_t const part = job / kMT;
        float acc[4] = {0.F, 0.F, 0.F, 0.F};
#pragma unroll
        for (int32_t i = 0; i < kSTEPS; ++i)
        {
            int32_t const k0 = 16 * (part * kSTEPS + i);
            uint32_t bf[2];
            mma::ldmatrixX2(bf, &sB[lane % 8][k0 + ((lane / 8) % 2) * 8]);
            uint32_t af[4];
            int32_t const r = k0 + (lane / 16) * 8 + lane % 8;
            mma::ldmatrixX4Trans(af, &sS[r][Tile::chunk(r, 2 * mt + (lane / 8) % 2) * kCW]);
            mma::mma16816<S>(acc, af, bf[0], bf[1]);
        }
        // k~ = hi + mid + lo (lanes t = 0, 1), q~ likewise (t = 1, 2); rows g and g + 8.
        float const fromRight0 = __shfl_down_sync(0xffffffffU, acc[0], 1);
        float const fromRight2 = __shfl_down_sync(0xffffffffU, acc[2], 1);
        float const fromLeft1 = __shfl_up_sync(0xffffffffU, acc[1], 1);
        float const fromLeft3 = __shfl_up_sync(0xffffffffU, acc[3], 1);
        if (t == 0)
        {
            sSum[part][0][16 * mt + g] = a * ((acc[0] + acc[1]) + fromRight0);
            sSum[part][0][16 * mt + g + 8] = a * ((acc[2] + acc[3]) + fromRight2);
        }
        else if (t == 2)
        {
            sSum[part][1][16 * mt + g] = a * (fromLeft1 + (acc[0] + acc[1]));
            sSum[part][1][16 * mt + g + 8] = a * (fromLeft3 + (acc[2] + acc[3]));
        }
    }
    __syncthreads();

    float const b = sScalar[1];
    float const qk = sScalar[2];
    float u[kCW];
#pragma unroll
    for (int32_t c = 0; c < kCW; ++c)
    {
        float sk = 0.F;
        float sq = 0.F;
#pragma unroll
        for (int32_t part = 0; part < Tile::kKSPLIT; ++part)
        {
            sk += sSum[part][0][c0 + c];
            sq += sSum[part][1][c0 + c];
        }
        u[c] = b * (sV[c0 + c] - sk);
        if (warp == 0 && kl == 0 && col0 + c < dv)
        {
            static_cast<T*>(p.o)[(static_cast<int64_t>(n) * hv + h) * dv + col0 + c] = fromFloat<T>(sq + u[c] * qk);
        }
    }

#pragma unroll
    for (int32_t i = 0; i < kROWS; ++i)
    {
        int32_t const r = kg + kKGROUPS * i;
        if (r >= dk)
        {
            continue;
        }
        float const kr = sK[r];
        uint4 const w = *reinterpret_cast<uint4 const*>(rowChunk(r));
        uint32_t const words[4] = {w.x, w.y, w.z, w.w};
        uint32_t out[4];
#pragma unroll
        for (int32_t j = 0; j < 4; ++j)
        {
            out[j] = narrowPair16<S>(widen16<S>(words[j], 0) * a + kr * u[2 * j],
                                     widen16<S>(words[j], 1) * a + kr * u[2 * j + 1]);
        }
        S* dst = static_cast<S*>(p.finalState) + stateOffset + static_cast<size_t>(r) * dv + col0;
        if (vecCols)
        {
            *reinterpret_cast<uint4*>(dst) = make_uint4(out[0], out[1], out[2], out[3]);
        }
        else
        {
            unsigned short* d16 = reinterpret_cast<unsigned short*>(dst);
#pragma unroll
            for (int32_t c = 0; c < kCW; ++c)
            {
                if (col0 + c < dv)
                {
                    d16[c] = static_cast<unsigned short>(c % 2 == 0 ? out[c / 2] & 0xFFFFU : out[c / 2] >> 16);
                }
            }
        }
    }
}

} // namespace kernels
} // namespace gdn
