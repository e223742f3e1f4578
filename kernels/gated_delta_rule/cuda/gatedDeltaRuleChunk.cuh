/*
 * Chunked (WY) gated delta rule prefill: two kernels and a small varlen helper. For fp16 / bf16
 * inputs both are replaced: the prepare kernel by gatedDeltaRulePrepare16Kernel (mma.sync,
 * gatedDeltaRuleChunkPrepare16.cuh: the same results in half the instructions), the sequential
 * pass by the register-resident mma.sync walk of gatedDeltaRuleChunkWalk.cuh where its shared
 * memory fits (the launcher decides). The wmma kernels here stay for fp32 inputs, and the wmma
 * walk for GPUs where no mma.sync walk fits (and as a pinned reference path).
 *
 *   gatedDeltaRuleChunkOffsetsKernel   varlen only: chunkOffsets[n] = sum_{m<n} ceil(L_m / 64)
 *   gatedDeltaRulePrepareKernel        one block per (chunk, value head), all chunks in parallel;
 *       everything that does not depend on the state, written to the workspace:
 *         A = strictly_lower(beta_i k~_i.k~_j exp(G_i - G_j)),  Tm = (I + A)^-1 (fp32, blocked),
 *         w = Tm diag(beta exp(G)) k~,  u = Tm diag(beta) v,
 *         P = causal(q~ k~^T exp(G_i - G_j)),  fq_i = exp(G_i) rq_i scale,  fk_i = exp(G_last - G_i) rk_i
 *       (k~ = rk k, q~ = rq scale q: the L2 norms are row factors rq, rk, so q and k stay raw)
 *   gatedDeltaRuleChunkStateKernel     one block per (sequence, value head, 32 state columns), the
 *       sequential pass over chunks with the state tile in shared memory (fp32), matrix products only:
 *         v_new = u - w S,  o = diag(fq) q S + P v_new,  S = exp(G_last) S + k^T diag(fk) v_new
 *
 * Chunk matrix products run on tensor cores (wmma: bf16 / fp16 operands, or 3xTF32 for fp32 inputs)
 * with fp32 accumulation; the triangular solve and all decays stay in fp32. Needs Dk, Dv multiples
 * of 8 and <= 128 (the launcher falls back to the recurrent kernel otherwise).
 *
 * Rounding with 16-bit inputs (bf16 error on keys with cosines near 1 was ~1e-2 of o, mostly from
 * u, P, v_new and the inverse): fp32 values that meet a 16-bit operand are split into hi + lo
 * 16-bit operands (kSPLIT, two products): the inverse-derived Tk, Tv, P, v_new (both uses) and the
 * state S in w S / q S. u is kept in fp32 in the workspace (it only feeds v_new = u - w S).
 * Rounded once to the activation dtype: w (~1e-3 of o), and o itself.
 */
#pragma once

#include "gatedDeltaRuleCommon.cuh"
#include "gatedDeltaRuleRecurrent.cuh" // sequenceBounds, kL2NORM_EPS

#include <cub/block/block_scan.cuh>

namespace gdn
{
namespace kernels
{

constexpr int32_t kCHUNK_THREADS = 256;
constexpr int32_t kCHUNK_WARPS = kCHUNK_THREADS / kWARP;
constexpr int32_t kSTATE_BV = 32; // state columns per block of the sequential pass
constexpr int32_t kOFFSETS_THREADS = 1024;

//! Where the prepare kernel leaves its results, per value head and chunk slot (maxChunks slots):
//! w [64, Dk] in the activation dtype, u [64, Dv] fp32, P as kP_TILES<T> [64, 64] tiles in the
//! activation dtype (hi, then lo where kSPLIT), and kSCALARS fp32 (fq, fk, exp(G_last)).
struct ChunkWorkspace
{
    int32_t const* chunkOffsets{nullptr}; // varlen: [numSeqs + 1]; else nullptr
    int32_t chunksPerSeq{0};              // non-varlen: ceil(T / 64)
    int64_t maxChunks{0};                 // chunk slots per value head
    void* w{nullptr};
    float* u{nullptr};
    void* p{nullptr};
    float* scalars{nullptr};
};

//! Where the sequential pass of sequence n and value head h finds its chunks: tokens [bos, bos + len)
//! and the workspace slot of its first chunk (a sequence's chunks take consecutive slots).
struct SequenceChunks
{
    int64_t bos;
    int32_t len;
    int32_t numChunks;
    size_t slot0;
};

__device__ __forceinline__ SequenceChunks sequenceChunks(
    GatedDeltaRuleParams const& p, ChunkWorkspace const& ws, int32_t n, int32_t h)
{
    SequenceChunks sc;
    sequenceBounds(p, n, sc.bos, sc.len);
    sc.numChunks = (sc.len + kCHUNK - 1) / kCHUNK;
    int64_t const chunkBase
        = ws.chunkOffsets != nullptr ? ws.chunkOffsets[n] : static_cast<int64_t>(n) * ws.chunksPerSeq;
    sc.slot0 = static_cast<size_t>(h) * ws.maxChunks + chunkBase;
    return sc;
}

constexpr int32_t kSCALARS = 3 * kCHUNK; // fq[64], fk[64], exp(G_last) and padding
constexpr int32_t kSCALAR_DECAY = 2 * kCHUNK;

template <typename T>
constexpr int32_t kP_TILES = kSPLIT<T> ? 2 : 1; // hi (+ lo) copies of P, v_new and the state operand

__host__ __device__ constexpr size_t alignUp(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

//! Shared memory of the fp32 prepare kernel (offsets in bytes from a 128-byte aligned base).
template <typename T, int32_t kDK, int32_t kDV>
struct PrepareSmem
{
    static constexpr int32_t kPAD = 16 / sizeof(T);
    static constexpr int32_t kLDK = kDK + kPAD;
    static constexpr int32_t kLDV = kDV + kPAD;
    static constexpr int32_t kLDC = kCHUNK + kPAD;
    static constexpr int32_t kLDCF = kCHUNK + 4;
    static constexpr int32_t kMAXD = kDK > kDV ? kDK : kDV;
    static constexpr int32_t kLDSTAGE = kMAXD + 4;
    static constexpr size_t kK = 0;
    static constexpr size_t kQ = alignUp(kK + sizeof(T) * kCHUNK * kLDK, 128);
    static constexpr size_t kV = alignUp(kQ + sizeof(T) * kCHUNK * kLDK, 128);
    // fp32 A and Tm (Tm's bytes first hold q k^T); once Tm has been turned into the two operand
    // matrices, the same bytes stage the w / u results on their way to global memory.
    static constexpr size_t kA32 = alignUp(kV + sizeof(T) * kCHUNK * kLDV, 128);
    static constexpr size_t kT32 = alignUp(kA32 + sizeof(float) * kCHUNK * kLDCF, 128);
    static constexpr size_t kREGION_END = alignUp(
        (kT32 + sizeof(float) * kCHUNK * kLDCF) > (kA32 + sizeof(float) * kCHUNK * kLDSTAGE)
            ? (kT32 + sizeof(float) * kCHUNK * kLDCF)
            : (kA32 + sizeof(float) * kCHUNK * kLDSTAGE),
        128);
    // Tk takes q's bytes where they suffice (Dk >= 64): q is dead once q k^T is in Tm's bytes.
    static constexpr size_t kTILE_C = sizeof(T) * kCHUNK * kLDC;
    static constexpr bool kTK_IN_Q = sizeof(T) * kCHUNK * kLDK >= kTILE_C;
    static constexpr size_t kTK = kTK_IN_Q ? kQ : kREGION_END;
    static constexpr size_t kTV = kTK_IN_Q ? kREGION_END : alignUp(kTK + kTILE_C, 128);
    static constexpr size_t kM = alignUp(kTV + kTILE_C, 128);
    static constexpr size_t kVEC = alignUp(kM + sizeof(float) * 3 * 16 * 16, 128); // G raw, G, beta, rk, rq
    static constexpr size_t kBYTES = kVEC + sizeof(float) * 5 * kCHUNK;
};

//! Shared memory of the sequential state kernel; k, P and the chunk scalars have kSTAGES buffers.
//! The state operand S (hi, lo) and the v_new operands (Vop hi, lo, Vk hi, lo) share one region:
//! S's copies are dead between the w S / q S products and their rebuild at the end of the chunk.
//! X first receives u (fp32, from the workspace), then holds v_new = u - w S.
template <typename T, int32_t kDK, int32_t kSTAGES>
struct StateSmem
{
    static constexpr int32_t kPAD = 16 / sizeof(T);
    static constexpr int32_t kLDK = kDK + kPAD;
    static constexpr int32_t kLDV = kSTATE_BV + kPAD;
    static constexpr int32_t kLDC = kCHUNK + kPAD;
    static constexpr int32_t kLDVF = kSTATE_BV + 4;
    static constexpr int32_t kSPLITS = kP_TILES<T>;
    static constexpr size_t kKBYTES = alignUp(sizeof(T) * kCHUNK * kLDK, 128);
    static constexpr size_t kPTILE = alignUp(sizeof(T) * kCHUNK * kLDC, 128);
    static constexpr size_t kPBYTES = kSPLITS * kPTILE;
    static constexpr size_t kSCALAR_BYTES = alignUp(sizeof(float) * kSCALARS, 128);
    static constexpr size_t kVTILE = alignUp(sizeof(T) * kCHUNK * kLDV, 128);
    static constexpr size_t kSTILE = alignUp(sizeof(T) * kDK * kLDV, 128);
    static constexpr size_t kOPS_BYTES
        = kSPLITS * kSTILE > 2 * kSPLITS * kVTILE ? kSPLITS * kSTILE : 2 * kSPLITS * kVTILE;
    static constexpr size_t kQ = 0;
    static constexpr size_t kW = kQ + kKBYTES;
    static constexpr size_t kK = kW + kKBYTES;
    static constexpr size_t kP = kK + kSTAGES * kKBYTES;
    static constexpr size_t kSC = kP + kSTAGES * kPBYTES;
    static constexpr size_t kOPS = kSC + kSTAGES * kSCALAR_BYTES; // S hi, S lo | Vop hi, lo, Vk hi, lo
    static constexpr size_t kS32 = kOPS + kOPS_BYTES;
    static constexpr size_t kX32 = alignUp(kS32 + sizeof(float) * kDK * kLDVF, 128);
    static constexpr size_t kY32 = alignUp(kX32 + sizeof(float) * kCHUNK * kLDVF, 128);
    static constexpr size_t kBYTES = kY32 + sizeof(float) * kCHUNK * kLDVF;
};

//! chunkOffsets[n] = number of 64-token chunks in sequences 0 .. n-1 (one block).
__global__ void __launch_bounds__(kOFFSETS_THREADS) gatedDeltaRuleChunkOffsetsKernel(
    int32_t const* cuSeqlens, int32_t numSeqs, int32_t* chunkOffsets)
{
    using Scan = cub::BlockScan<int32_t, kOFFSETS_THREADS>;
    __shared__ typename Scan::TempStorage temp;
    __shared__ int32_t carry;
    if (threadIdx.x == 0)
    {
        carry = 0;
    }
    __syncthreads();
    for (int32_t base = 0; base < numSeqs; base += kOFFSETS_THREADS)
    {
        int32_t const n = base + threadIdx.x;
        int32_t const chunks = n < numSeqs ? (cuSeqlens[n + 1] - cuSeqlens[n] + kCHUNK - 1) / kCHUNK : 0;
        int32_t prefix;
        int32_t total;
        Scan(temp).ExclusiveSum(chunks, prefix, total);
        int32_t const c0 = carry;
        if (n < numSeqs)
        {
            chunkOffsets[n] = c0 + prefix;
        }
        __syncthreads();
        if (threadIdx.x == 0)
        {
            carry = c0 + total;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
    {
        chunkOffsets[numSeqs] = carry;
    }
}

//! Inclusive prefix sum of src[0..63] into dst, by one warp.
__device__ __forceinline__ void warpCumsum64(float const* src, float* dst, int32_t lane)
{
    float const g0 = src[2 * lane];
    float const g1 = src[2 * lane + 1];
    float const pair = g0 + g1;
    float incl = pair;
#pragma unroll
    for (int32_t o = 1; o < kWARP; o <<= 1)
    {
        float const other = __shfl_up_sync(0xffffffffU, incl, o);
        if (lane >= o)
        {
            incl += other;
        }
    }
    float const excl = incl - pair;
    dst[2 * lane] = excl + g0;
    dst[2 * lane + 1] = incl;
}

//! rNorm[r] = factor * (l2norm ? rsqrt(sum_d x[r, d]^2 + eps) : 1) for the 64 rows, 8 rows a warp
//! (the rows' loads and shuffles interleave, so a warp pays one reduction latency, not eight).
template <typename T, int32_t kD>
__device__ __forceinline__ void rowNorms(T const* x, int32_t ld, bool l2norm, float factor, float* rNorm)
{
    constexpr int32_t kROWS = kCHUNK / kCHUNK_WARPS;
    constexpr int32_t kPER_LANE = (kD + kWARP - 1) / kWARP;
    int32_t const warp = threadIdx.x / kWARP;
    int32_t const lane = threadIdx.x % kWARP;
    if (!l2norm)
    {
        if (lane < kROWS)
        {
            rNorm[warp * kROWS + lane] = factor;
        }
        return;
    }
    float ss[kROWS];
#pragma unroll
    for (int32_t i = 0; i < kROWS; ++i)
    {
        ss[i] = 0.F;
#pragma unroll
        for (int32_t j = 0; j < kPER_LANE; ++j)
        {
            int32_t const d = lane + j * kWARP;
            if (d < kD)
            {
                float const e = toFloat(x[(warp * kROWS + i) * ld + d]);
                ss[i] += e * e;
            }
        }
    }
#pragma unroll
    for (int32_t o = kWARP / 2; o > 0; o >>= 1)
    {
#pragma unroll
        for (int32_t i = 0; i < kROWS; ++i)
        {
            ss[i] += __shfl_xor_sync(0xffffffffU, ss[i], o);
        }
    }
    if (lane == 0)
    {
#pragma unroll
        for (int32_t i = 0; i < kROWS; ++i)
        {
            rNorm[warp * kROWS + i] = factor * rsqrtf(ss[i] + kL2NORM_EPS);
        }
    }
}

//! Converts rows [0, validRows) x columns [0, validCols) of a [64, kCOLS] fp32 shared tile to T and
//! stores them with 16-byte writes (validCols and the row strides are multiples of the vector).
template <typename T, int32_t kCOLS>
__device__ __forceinline__ void storeTile(
    T* dst, int64_t dstStride, float const* src, int32_t srcStride, int32_t validRows, int32_t validCols)
{
    constexpr int32_t kVEC = 16 / sizeof(T);
    constexpr int32_t kPER_ROW = kCOLS / kVEC;
    constexpr int32_t kITERS = kCHUNK * kPER_ROW / kCHUNK_THREADS;
    static_assert(kCHUNK * kPER_ROW % kCHUNK_THREADS == 0, "tile must split evenly over the block");
#pragma unroll
    for (int32_t it = 0; it < kITERS; ++it)
    {
        int32_t const e = threadIdx.x + it * kCHUNK_THREADS;
        int32_t const r = e / kPER_ROW;
        int32_t const c = (e % kPER_ROW) * kVEC;
        if (r < validRows && c < validCols)
        {
            alignas(16) T packed[kVEC];
#pragma unroll
            for (int32_t v = 0; v < kVEC; ++v)
            {
                packed[v] = fromFloat<T>(src[r * srcStride + c + v]);
            }
            *reinterpret_cast<uint4*>(dst + r * dstStride + c) = *reinterpret_cast<uint4 const*>(packed);
        }
    }
}

//! Where the prepare kernels' chunk lies: sequence n, its chunk c, first token t0 and valid rows.
struct ChunkInputs
{
    bool inRange;
    int32_t n;
    int32_t c;
    int64_t t0;
    int32_t valid;
};

//! The chunk of workspace slot chunkId (varlen: a binary search of chunkOffsets; slots past the
//! last chunk of a pack are out of range).
__device__ __forceinline__ ChunkInputs locateChunk(GatedDeltaRuleParams const& p, ChunkWorkspace const& ws, int64_t chunkId)
{
    ChunkInputs in{true, 0, 0, 0, 0};
    if (ws.chunkOffsets != nullptr)
    {
        int32_t const numSeqs = p.numSeqs;
        if (chunkId >= ws.chunkOffsets[numSeqs])
        {
            in.inRange = false;
            return in;
        }
        int32_t lo = 0; // largest n with chunkOffsets[n] <= chunkId
        int32_t hi = numSeqs - 1;
        while (lo < hi)
        {
            int32_t const mid = (lo + hi + 1) / 2;
            if (ws.chunkOffsets[mid] <= chunkId)
            {
                lo = mid;
            }
            else
            {
                hi = mid - 1;
            }
        }
        in.n = lo;
        in.c = static_cast<int32_t>(chunkId - ws.chunkOffsets[lo]);
    }
    else
    {
        in.n = static_cast<int32_t>(chunkId / ws.chunksPerSeq);
        in.c = static_cast<int32_t>(chunkId % ws.chunksPerSeq);
    }
    int64_t bos;
    int32_t len;
    sequenceBounds(p, in.n, bos, len);
    in.t0 = bos + static_cast<int64_t>(in.c) * kCHUNK;
    in.valid = min(kCHUNK, len - in.c * kCHUNK);
    return in;
}

//! The chunk's k, q [64, Dk] (key head of value head h) and v [64, Dv] tiles, raw g and beta
//! (padded rows read 0), then a block barrier.
template <typename T, int32_t kDK, int32_t kDV>
__device__ __forceinline__ void loadChunkInputs(GatedDeltaRuleParams const& p, ChunkInputs const& in, int32_t h,
    T* sK, T* sQ, int32_t ldk, T* sV, int32_t ldv, float* sGraw, float* sBeta)
{
    int32_t const dk = p.keyDim;
    int32_t const dv = p.valueDim;
    int32_t const hv = p.numValueHeads;
    int32_t const hk = p.numKeyHeads;
    int32_t const kh = h / (hv / hk);
    int64_t const t0 = in.t0;
    int64_t const qkStride = int64_t{hk} * dk;
    loadTileAsync<T, kCHUNK, kDK, kCHUNK_THREADS>(
        sK, ldk, static_cast<T const*>(p.k) + t0 * qkStride + kh * dk, qkStride, in.valid, dk);
    loadTileAsync<T, kCHUNK, kDK, kCHUNK_THREADS>(
        sQ, ldk, static_cast<T const*>(p.q) + t0 * qkStride + kh * dk, qkStride, in.valid, dk);
    loadTileAsync<T, kCHUNK, kDV, kCHUNK_THREADS>(
        sV, ldv, static_cast<T const*>(p.v) + (t0 * hv + h) * dv, int64_t{hv} * dv, in.valid, dv);
    int32_t const tid = threadIdx.x;
    if (tid < kCHUNK)
    {
        bool const ok = tid < in.valid;
        int64_t const gi = ok ? (t0 + tid) * hv + h : 0;
        cpAsync4(sGraw + tid, p.g + gi, ok ? 4 : 0);
        sBeta[tid] = ok ? toFloat(static_cast<T const*>(p.beta)[gi]) : 0.F;
    }
    cpAsyncCommit();
    cpAsyncWaitAll();
    __syncthreads();
}

//! G = cumsum(g), the key row factors rk and the query row factors rq (scale folded in), then a
//! block barrier.
template <typename T, int32_t kDK>
__device__ __forceinline__ void chunkRowFactors(GatedDeltaRuleParams const& p, T const* sK, T const* sQ,
    int32_t ldk, float const* sGraw, float* sG, float* sRk, float* sRq)
{
    if (threadIdx.x < kWARP)
    {
        warpCumsum64(sGraw, sG, threadIdx.x);
    }
    rowNorms<T, kDK>(sK, ldk, p.useQkL2norm, 1.F, sRk);
    rowNorms<T, kDK>(sQ, ldk, p.useQkL2norm, p.scale, sRq);
    __syncthreads();
}

//! T = (I + A)^-1 for the strictly lower fp32 A [64, 64] (row stride kLD), exactly in fp32: the
//! four 16 x 16 diagonal blocks by forward substitution, one column a thread, then the block rows
//! below, T[bi][bj] = -T[bi][bi] sum_{bj <= bk < bi} A[bi][bk] T[bk][bj] (scratch sM: 3 x 256
//! floats). Reads only A's lower blocks (below the diagonal inside diagonal blocks); writes T's
//! diagonal blocks whole (zeros above the diagonal) and the blocks below them. Starts after a
//! barrier that published A and ends with one.
template <int32_t kLD>
__device__ __forceinline__ void invertUnitLower64(float const* sA, float* sT, float* sM)
{
    int32_t const tid = threadIdx.x;
    if (tid < kCHUNK)
    {
        int32_t const b = tid / 16;
        int32_t const col = tid % 16;
        float const* aBlock = sA + (16 * b) * kLD + 16 * b;
        float x[16];
#pragma unroll
        for (int32_t r = 0; r < 16; ++r)
        {
            float acc = r == col ? 1.F : 0.F;
#pragma unroll
            for (int32_t j = 0; j < r; ++j)
            {
                acc -= aBlock[r * kLD + j] * x[j];
            }
            x[r] = acc;
            sT[(16 * b + r) * kLD + 16 * b + col] = acc;
        }
    }
    __syncthreads();
#pragma unroll
    for (int32_t bi = 1; bi < 4; ++bi)
    {
        int32_t const r = tid / 16;
        int32_t const cc = tid % 16;
#pragma unroll
        for (int32_t bj = 0; bj < bi; ++bj)
        {
            float acc = 0.F;
#pragma unroll
            for (int32_t kk = bj * 16; kk < bi * 16; ++kk)
            {
                acc += sA[(bi * 16 + r) * kLD + kk] * sT[kk * kLD + bj * 16 + cc];
            }
            sM[bj * 256 + r * 16 + cc] = acc;
        }
        __syncthreads();
#pragma unroll
        for (int32_t bj = 0; bj < bi; ++bj)
        {
            float acc = 0.F;
#pragma unroll
            for (int32_t kk = 0; kk < 16; ++kk)
            {
                acc += sT[(bi * 16 + r) * kLD + bi * 16 + kk] * sM[bj * 256 + kk * 16 + cc];
            }
            sT[(bi * 16 + r) * kLD + bj * 16 + cc] = -acc;
        }
        __syncthreads();
    }
}

template <typename T, int32_t kDK, int32_t kDV>
__global__ void __launch_bounds__(kCHUNK_THREADS) gatedDeltaRulePrepareKernel(
    GatedDeltaRuleParams const p, ChunkWorkspace const ws)
{
    static_assert(!kSPLIT<T>, "fp32 inputs only (16-bit inputs take gatedDeltaRulePrepare16Kernel)");
    using L = PrepareSmem<T, kDK, kDV>;
    extern __shared__ __align__(128) unsigned char smem[];
    T* sK = reinterpret_cast<T*>(smem + L::kK);
    T* sQ = reinterpret_cast<T*>(smem + L::kQ);
    T* sV = reinterpret_cast<T*>(smem + L::kV);
    float* sA = reinterpret_cast<float*>(smem + L::kA32);
    float* sT = reinterpret_cast<float*>(smem + L::kT32);
    float* sStage = reinterpret_cast<float*>(smem + L::kA32);
    T* sTk = reinterpret_cast<T*>(smem + L::kTK);
    T* sTv = reinterpret_cast<T*>(smem + L::kTV);
    float* sM = reinterpret_cast<float*>(smem + L::kM);
    float* sGraw = reinterpret_cast<float*>(smem + L::kVEC);
    float* sG = sGraw + kCHUNK;
    float* sBeta = sG + kCHUNK;
    float* sRk = sBeta + kCHUNK;
    float* sRq = sRk + kCHUNK;

    int32_t const dk = p.keyDim;
    int32_t const dv = p.valueDim;
    int32_t const h = blockIdx.y;
    int64_t const chunkId = blockIdx.x;
    int32_t const tid = threadIdx.x;
    int32_t const warp = tid / kWARP;

    ChunkInputs const in = locateChunk(p, ws, blockIdx.x);
    if (!in.inRange)
    {
        return;
    }
    loadChunkInputs<T, kDK, kDV>(p, in, h, sK, sQ, L::kLDK, sV, L::kLDV, sGraw, sBeta);
    chunkRowFactors<T, kDK>(p, sK, sQ, L::kLDK, sGraw, sG, sRk, sRq);

    // k k^T into sA and q k^T into sT, tiles on and below the diagonal.
    for (int32_t t = warp; t < 32; t += kCHUNK_WARPS)
    {
        int32_t const rt = (t % 16) / 4;
        int32_t const ct = t % 4;
        if (ct <= rt)
        {
            T const* lhs = t < 16 ? sK : sQ;
            float* dst = t < 16 ? sA : sT;
            AccFragT<T> acc;
            wmma::fill_fragment(acc, 0.F);
            mmaTile<T, wmma::row_major, wmma::col_major>(
                acc, lhs + rt * 16 * L::kLDK, L::kLDK, sK + ct * 16 * L::kLDK, L::kLDK, kDK);
            wmma::store_matrix_sync(dst + rt * 16 * L::kLDCF + ct * 16, acc, L::kLDCF, wmma::mem_row_major);
        }
    }
    __syncthreads();

    size_t const slot = static_cast<size_t>(h) * ws.maxChunks + chunkId;
    T* pOut = static_cast<T*>(ws.p) + slot * kP_TILES<T> * kCHUNK * kCHUNK; // hi tile, then lo tile
#pragma unroll
    for (int32_t it = 0; it < kCHUNK * kCHUNK / kCHUNK_THREADS; ++it)
    {
        int32_t const e = tid + it * kCHUNK_THREADS;
        int32_t const i = e / kCHUNK;
        int32_t const j = e % kCHUNK;
        float a = 0.F;
        float pv = 0.F;
        if (j < i)
        {
            a = sBeta[i] * sA[i * L::kLDCF + j] * sRk[i] * sRk[j] * __expf(sG[i] - sG[j]);
        }
        if (j <= i)
        {
            pv = sT[i * L::kLDCF + j] * sRq[i] * sRk[j] * __expf(sG[i] - sG[j]);
        }
        sA[i * L::kLDCF + j] = a;
        splitStore(pOut + e, pOut + kCHUNK * kCHUNK + e, pv);
        if (j / 16 > i / 16)
        {
            sT[i * L::kLDCF + j] = 0.F; // above the diagonal blocks of Tm
        }
    }
    if (tid < kCHUNK)
    {
        float const gLast = sG[kCHUNK - 1]; // padded tokens have g = 0: the last real G
        float* sc = ws.scalars + slot * kSCALARS;
        sc[tid] = sRq[tid] * __expf(sG[tid]);
        sc[kCHUNK + tid] = sRk[tid] * __expf(gLast - sG[tid]);
        sc[kSCALAR_DECAY + tid] = tid == 0 ? __expf(gLast) : 0.F;
    }
    __syncthreads();

    invertUnitLower64<L::kLDCF>(sA, sT, sM);

    // Fold the right-hand-side row scalings into Tm so that w and u come straight from raw k and v:
    // Tk = Tm diag(beta exp(G) rk) in sTk, Tv = Tm diag(beta) in sTv (fp32; mmaTile splits them
    // into 3xTF32 operands).
#pragma unroll
    for (int32_t it = 0; it < kCHUNK * kCHUNK / kCHUNK_THREADS; ++it)
    {
        int32_t const e = tid + it * kCHUNK_THREADS;
        int32_t const i = e / kCHUNK;
        int32_t const j = e % kCHUNK;
        float const t = sT[i * L::kLDCF + j];
        float const tk = t * sBeta[j] * __expf(sG[j]) * sRk[j];
        float const tv = t * sBeta[j];
        sTk[i * L::kLDC + j] = tk;
        sTv[i * L::kLDC + j] = tv;
    }
    // Each warp keeps its kDK / 32 tiles of w and kDV / 32 of u in registers until sT is dead (the
    // staging buffer overlaps it). Tk, Tv are lower triangular: row tile rt needs (rt + 1) * 16 columns.
    constexpr int32_t kWT = 4 * (kDK / 16) / kCHUNK_WARPS;
    constexpr int32_t kUT = 4 * (kDV / 16) / kCHUNK_WARPS;
    static_assert(kWT * kCHUNK_WARPS == 4 * (kDK / 16) && kUT * kCHUNK_WARPS == 4 * (kDV / 16), "tile split");
    AccFragT<T> wAcc[kWT];
    AccFragT<T> uAcc[kUT];
    auto products = [&](AccFragT<T>* acc, int32_t tiles, T const* x, int32_t ldx, T const* lhs) {
#pragma unroll
        for (int32_t i = 0; i < tiles; ++i)
        {
            int32_t const t = warp + i * kCHUNK_WARPS;
            int32_t const rt = t % 4;
            int32_t const ct = t / 4;
            wmma::fill_fragment(acc[i], 0.F);
            mmaTile<T, wmma::row_major, wmma::row_major>(
                acc[i], lhs + rt * 16 * L::kLDC, L::kLDC, x + ct * 16, ldx, (rt + 1) * 16);
        }
    };
    __syncthreads();
    products(wAcc, kWT, sK, L::kLDK, sTk);
    products(uAcc, kUT, sV, L::kLDV, sTv);
    // sT's last reads were before the __syncthreads above: the staging buffer is free.
    auto stage = [&](AccFragT<T> const* acc, int32_t tiles) {
#pragma unroll
        for (int32_t i = 0; i < tiles; ++i)
        {
            int32_t const t = warp + i * kCHUNK_WARPS;
            int32_t const rt = t % 4;
            int32_t const ct = t / 4;
            wmma::store_matrix_sync(
                sStage + rt * 16 * L::kLDSTAGE + ct * 16, acc[i], L::kLDSTAGE, wmma::mem_row_major);
        }
    };
    stage(wAcc, kWT);
    __syncthreads();
    storeTile<T, kDK>(static_cast<T*>(ws.w) + slot * kCHUNK * dk, dk, sStage, L::kLDSTAGE, kCHUNK, dk);
    __syncthreads();
    stage(uAcc, kUT);
    __syncthreads();
    // u stays fp32: it only enters v_new = u - w S, where one rounding cost ~5e-3 of o.
    storeTile<float, kDV>(ws.u + slot * kCHUNK * dv, dv, sStage, L::kLDSTAGE, kCHUNK, dv);
}

template <typename T, int32_t kDK, int32_t kSTAGES>
__global__ void __launch_bounds__(kCHUNK_THREADS) gatedDeltaRuleChunkStateKernel(
    GatedDeltaRuleParams const p, ChunkWorkspace const ws)
{
    using L = StateSmem<T, kDK, kSTAGES>;
    extern __shared__ __align__(128) unsigned char smem[];
    T* sQ = reinterpret_cast<T*>(smem + L::kQ);
    T* sW = reinterpret_cast<T*>(smem + L::kW);
    // hi / lo operand copies (the lo ones are used only where kSPLIT); S's alias the v_new ones.
    T* sSop = reinterpret_cast<T*>(smem + L::kOPS);
    T* sSopLo = reinterpret_cast<T*>(smem + L::kOPS + L::kSTILE);
    T* sVop = reinterpret_cast<T*>(smem + L::kOPS);
    T* sVopLo = reinterpret_cast<T*>(smem + L::kOPS + L::kVTILE);
    T* sVk = reinterpret_cast<T*>(smem + L::kOPS + L::kSPLITS * L::kVTILE);
    T* sVkLo = reinterpret_cast<T*>(smem + L::kOPS + (L::kSPLITS + 1) * L::kVTILE);
    float* sS = reinterpret_cast<float*>(smem + L::kS32);
    float* sX = reinterpret_cast<float*>(smem + L::kX32);
    float* sY = reinterpret_cast<float*>(smem + L::kY32);

    int32_t const dk = p.keyDim;
    int32_t const dv = p.valueDim;
    int32_t const hv = p.numValueHeads;
    int32_t const hk = p.numKeyHeads;
    int32_t const col0 = blockIdx.x * kSTATE_BV;
    int32_t const h = blockIdx.y;
    int32_t const n = blockIdx.z;
    int32_t const kh = h / (hv / hk);
    int32_t const tid = threadIdx.x;
    int32_t const warp = tid / kWARP;
    int32_t const validV = min(kSTATE_BV, dv - col0);

    SequenceChunks const sc = sequenceChunks(p, ws, n, h);
    int64_t const bos = sc.bos;
    int32_t const len = sc.len;
    int32_t const numChunks = sc.numChunks;
    size_t const slot0 = sc.slot0;

    T const* q = static_cast<T const*>(p.q);
    T const* k = static_cast<T const*>(p.k);
    T const* wAll = static_cast<T const*>(ws.w);
    float const* uAll = ws.u;
    T const* pAll = static_cast<T const*>(ws.p);
    T* o = static_cast<T*>(p.o);
    int64_t const qkStride = int64_t{hk} * dk;

    // Three load groups, each issued as soon as its buffers are free: q and w (free after the
    // w S / q S products), u (into X, free after v_new), and k, P and the scalars (double-buffered).
    auto issueQW = [&](int32_t c) {
        int64_t const t0 = bos + static_cast<int64_t>(c) * kCHUNK;
        int32_t const valid = min(kCHUNK, len - c * kCHUNK);
        loadTileAsync<T, kCHUNK, kDK, kCHUNK_THREADS>(sQ, L::kLDK, q + t0 * qkStride + kh * dk, qkStride, valid, dk);
        loadTileAsync<T, kCHUNK, kDK, kCHUNK_THREADS>(
            sW, L::kLDK, wAll + (slot0 + c) * kCHUNK * dk, dk, valid, dk);
    };
    auto issueU = [&](int32_t c) {
        int32_t const valid = min(kCHUNK, len - c * kCHUNK);
        loadTileAsync<float, kCHUNK, kSTATE_BV, kCHUNK_THREADS>(
            sX, L::kLDVF, uAll + (slot0 + c) * kCHUNK * dv + col0, dv, valid, validV);
    };
    auto issueKPS = [&](int32_t c, int32_t stage) {
        int64_t const t0 = bos + static_cast<int64_t>(c) * kCHUNK;
        int32_t const valid = min(kCHUNK, len - c * kCHUNK);
        T* sK = reinterpret_cast<T*>(smem + L::kK + stage * L::kKBYTES);
        T* sP = reinterpret_cast<T*>(smem + L::kP + stage * L::kPBYTES);
        float* sSc = reinterpret_cast<float*>(smem + L::kSC + stage * L::kSCALAR_BYTES);
        loadTileAsync<T, kCHUNK, kDK, kCHUNK_THREADS>(sK, L::kLDK, k + t0 * qkStride + kh * dk, qkStride, valid, dk);
#pragma unroll
        for (int32_t sp = 0; sp < L::kSPLITS; ++sp)
        {
            loadTileAsync<T, kCHUNK, kCHUNK, kCHUNK_THREADS>(sP + sp * (L::kPTILE / sizeof(T)), L::kLDC,
                pAll + ((slot0 + c) * L::kSPLITS + sp) * kCHUNK * kCHUNK, kCHUNK, kCHUNK, kCHUNK);
        }
        if (tid < kSCALARS / 4)
        {
            cpAsync16(sSc + 4 * tid, ws.scalars + (slot0 + c) * kSCALARS + 4 * tid, 16);
        }
    };

    if (numChunks > 0)
    {
        issueQW(0);
        issueKPS(0, 0);
        issueU(0);
        cpAsyncCommit();
    }

    // The state is read once here and stored once at the end in p.stateType; in between it stays
    // fp32 in shared memory (the op's rounding rule: one rounding per call).
    void const* init = p.initialState;
    size_t const stateOffset = (static_cast<size_t>(n) * hv + h) * static_cast<size_t>(dk) * dv;
    for (int32_t e = tid; e < kDK * kSTATE_BV; e += kCHUNK_THREADS)
    {
        int32_t const r = e / kSTATE_BV;
        int32_t const cc = e % kSTATE_BV;
        float s = 0.F;
        if (init != nullptr && r < dk && cc < validV)
        {
            s = loadStateElem(init, stateOffset + static_cast<size_t>(r) * dv + col0 + cc, p.stateType);
        }
        sS[r * L::kLDVF + cc] = s;
        splitStore(sSop + r * L::kLDV + cc, sSopLo + r * L::kLDV + cc, s);
    }

    for (int32_t c = 0; c < numChunks; ++c)
    {
        int32_t const stage = kSTAGES == 2 ? (c & 1) : 0;
        T const* sK = reinterpret_cast<T const*>(smem + L::kK + stage * L::kKBYTES);
        T const* sP = reinterpret_cast<T const*>(smem + L::kP + stage * L::kPBYTES);
        T const* sPLo = reinterpret_cast<T const*>(smem + L::kP + stage * L::kPBYTES + L::kPTILE);
        float const* sSc = reinterpret_cast<float const*>(smem + L::kSC + stage * L::kSCALAR_BYTES);
        bool const hasNext = c + 1 < numChunks;
        int32_t const valid = min(kCHUNK, len - c * kCHUNK);
        cpAsyncWaitAll();
        __syncthreads();
        if (kSTAGES == 2 && hasNext)
        {
            issueKPS(c + 1, stage ^ 1);
            cpAsyncCommit();
        }

        // X = v_new = u - w S (u already in X) and Y = q S, one 16 x 16 tile of each per warp;
        // S enters as hi + lo where kSPLIT.
        {
            int32_t const rt = warp / 2;
            int32_t const ct = warp % 2;
            float* xTile = sX + rt * 16 * L::kLDVF + ct * 16;
            AccFragT<T> acc;
            AccFragT<T> vNew;
            wmma::load_matrix_sync(vNew, xTile, L::kLDVF, wmma::mem_row_major);
            wmma::fill_fragment(acc, 0.F);
            mmaTile<T, wmma::row_major, wmma::row_major>(
                acc, sW + rt * 16 * L::kLDK, L::kLDK, sSop + ct * 16, L::kLDV, kDK);
            if constexpr (kSPLIT<T>)
            {
                mmaTile<T, wmma::row_major, wmma::row_major>(
                    acc, sW + rt * 16 * L::kLDK, L::kLDK, sSopLo + ct * 16, L::kLDV, kDK);
            }
#pragma unroll
            for (int32_t i = 0; i < vNew.num_elements; ++i)
            {
                vNew.x[i] -= acc.x[i];
            }
            wmma::store_matrix_sync(xTile, vNew, L::kLDVF, wmma::mem_row_major);
            wmma::fill_fragment(acc, 0.F);
            mmaTile<T, wmma::row_major, wmma::row_major>(
                acc, sQ + rt * 16 * L::kLDK, L::kLDK, sSop + ct * 16, L::kLDV, kDK);
            if constexpr (kSPLIT<T>)
            {
                mmaTile<T, wmma::row_major, wmma::row_major>(
                    acc, sQ + rt * 16 * L::kLDK, L::kLDK, sSopLo + ct * 16, L::kLDV, kDK);
            }
            wmma::store_matrix_sync(sY + rt * 16 * L::kLDVF + ct * 16, acc, L::kLDVF, wmma::mem_row_major);
        }
        __syncthreads();
        if (hasNext)
        {
            issueQW(c + 1);
            cpAsyncCommit();
        }

        // The operands of v_new (overwriting S's copies): the output takes v_new, the state update
        // diag(fk) v_new, both as hi + lo where kSPLIT; the output's q S part is diag(fq) Y.
        float const decayLast = sSc[kSCALAR_DECAY];
#pragma unroll
        for (int32_t it = 0; it < kCHUNK * kSTATE_BV / kCHUNK_THREADS; ++it)
        {
            int32_t const e = tid + it * kCHUNK_THREADS;
            int32_t const i = e / kSTATE_BV;
            int32_t const j = e % kSTATE_BV;
            float const vNew = sX[i * L::kLDVF + j];
            splitStore(sVop + i * L::kLDV + j, sVopLo + i * L::kLDV + j, vNew);
            splitStore(sVk + i * L::kLDV + j, sVkLo + i * L::kLDV + j, vNew * sSc[kCHUNK + i]);
            sY[i * L::kLDVF + j] *= sSc[i];
        }
        __syncthreads();
        if (hasNext)
        {
            issueU(c + 1);
            cpAsyncCommit();
        }

        // o = Y + P v_new (P is causal: row tile rt needs (rt + 1) * 16 columns);
        // S = exp(G_last) S + k^T (diag(fk) v_new).
        {
            int32_t const rt = warp / 2;
            int32_t const ct = warp % 2;
            AccFragT<T> acc;
            wmma::load_matrix_sync(acc, sY + rt * 16 * L::kLDVF + ct * 16, L::kLDVF, wmma::mem_row_major);
            mmaTile<T, wmma::row_major, wmma::row_major>(
                acc, sP + rt * 16 * L::kLDC, L::kLDC, sVop + ct * 16, L::kLDV, (rt + 1) * 16);
            if constexpr (kSPLIT<T>)
            {
                // P_hi v_lo + P_lo v_hi (P_lo v_lo is below the fp32 accumulation error)
                mmaTile<T, wmma::row_major, wmma::row_major>(
                    acc, sP + rt * 16 * L::kLDC, L::kLDC, sVopLo + ct * 16, L::kLDV, (rt + 1) * 16);
                mmaTile<T, wmma::row_major, wmma::row_major>(
                    acc, sPLo + rt * 16 * L::kLDC, L::kLDC, sVop + ct * 16, L::kLDV, (rt + 1) * 16);
            }
            wmma::store_matrix_sync(sY + rt * 16 * L::kLDVF + ct * 16, acc, L::kLDVF, wmma::mem_row_major);
        }
        for (int32_t t = warp; t < (kDK / 16) * 2; t += kCHUNK_WARPS)
        {
            int32_t const rt = t / 2;
            int32_t const ct = t % 2;
            AccFragT<T> acc;
            wmma::load_matrix_sync(acc, sS + rt * 16 * L::kLDVF + ct * 16, L::kLDVF, wmma::mem_row_major);
#pragma unroll
            for (int32_t i = 0; i < acc.num_elements; ++i)
            {
                acc.x[i] *= decayLast;
            }
            mmaTile<T, wmma::col_major, wmma::row_major>(
                acc, sK + rt * 16, L::kLDK, sVk + ct * 16, L::kLDV, kCHUNK);
            if constexpr (kSPLIT<T>)
            {
                mmaTile<T, wmma::col_major, wmma::row_major>(
                    acc, sK + rt * 16, L::kLDK, sVkLo + ct * 16, L::kLDV, kCHUNK);
            }
            wmma::store_matrix_sync(sS + rt * 16 * L::kLDVF + ct * 16, acc, L::kLDVF, wmma::mem_row_major);
        }
        __syncthreads();
        if (kSTAGES == 1 && hasNext)
        {
            issueKPS(c + 1, 0);
            cpAsyncCommit();
        }

        int64_t const t0 = bos + static_cast<int64_t>(c) * kCHUNK;
        storeTile<T, kSTATE_BV>(o + (t0 * hv + h) * dv + col0, int64_t{hv} * dv, sY, L::kLDVF, valid, validV);
#pragma unroll
        for (int32_t it = 0; it < kDK * kSTATE_BV / kCHUNK_THREADS; ++it)
        {
            int32_t const e = tid + it * kCHUNK_THREADS;
            int32_t const r = e / kSTATE_BV;
            int32_t const cc = e % kSTATE_BV;
            splitStore(sSop + r * L::kLDV + cc, sSopLo + r * L::kLDV + cc, sS[r * L::kLDVF + cc]);
        }
    }
    cpAsyncWaitAll();
    __syncthreads();

    for (int32_t e = tid; e < kDK * kSTATE_BV; e += kCHUNK_THREADS)
    {
        int32_t const r = e / kSTATE_BV;
        int32_t const cc = e % kSTATE_BV;
        if (r < dk && cc < validV)
        {
            storeStateElem(p.finalState, stateOffset + static_cast<size_t>(r) * dv + col0 + cc, p.stateType,
                sS[r * L::kLDVF + cc]);
        }
    }
}

} // namespace kernels
} // namespace gdn
