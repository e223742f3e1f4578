/*
 * The sequential half of the chunked prefill for 16-bit inputs (fp16 / bf16), on mma.sync with the
 * state in registers: gatedDeltaRuleChunkWalkKernel.
 *
 * One block per (kNW x 16 state columns, value head, sequence); each warp owns 16 columns of the
 * state, held transposed as fp32 accumulators ST [16, Dk] (g = lane / 4, t = lane % 4: ST[g + 8i]
 * [8j + 2t + e] in s[j][2i + e]). Working in the transposed frame keeps every intermediate where
 * the next product wants it (see common/mmaSync.cuh): an accumulator [16, n] is the A operand of
 * the next product without leaving registers, and the chunk's q, k, w and P enter as B operands
 * straight from shared memory (ldmatrix). Per chunk of 64 tokens, with the prepare kernel's w, u,
 * P, fq, fk and exp(G_last) (gatedDeltaRuleChunk.cuh):
 *
 *   X  = ST w^T,  Y = ST q^T                    [16, 64]   (ST as hi + lo 16-bit operands)
 *   Vn = u^T - X                                [16, 64]   v_new, transposed, fp32
 *   O  = Y diag(fq) + Vn P^T                    [16, 64]   Vn hi / lo x P hi / lo, three products
 *   ST = exp(G_last) ST + (Vn diag(fk)) k       [16, Dk]   (Vn diag(fk)) as hi + lo
 *
 * so the products of a chunk need no block barrier; the block shares only the chunk's tiles, loaded
 * with cp.async kSTAGES deep (one barrier per chunk). The precision is the wmma walk's (the same
 * hi + lo splits, fp32 accumulation); only the order of the fp32 sums differs.
 *
 * kSTAGES = 1 (4 warps take 99 KB at Dk 128 single-buffered, 186 KB double-buffered) serves GPUs
 * with 99 KB of shared memory a block (sm_86 / 89 / 120) and, on larger ones, batches that fill
 * more than one wave of double-buffered blocks (two blocks a multiprocessor instead of one; the
 * launcher decides): one copy of the tiles in two load groups, each refilled for the next chunk
 * as soon as the block is done with it: q and w after X and Y (the refill overlaps the rest of the
 * chunk), k, P, u and the scalars at the end of the chunk (their refill overlaps the next chunk's
 * X and Y). Three barriers a chunk.
 *
 * kKS = 2 (the split walk): two warps share each 16 state columns, one holding state rows (dk)
 * [0, Dk/2), the other [Dk/2, Dk). X and Y are then partial sums over half of dk: each warp writes
 * its X and the Y tiles of the other's output tokens to shared memory, and after a barrier adds the
 * other's; both then hold v_new whole, each produces half of the chunk's output tokens (blocks
 * {0, 3} and {1, 2} of 16: five source blocks of the causal P each) and updates its own state rows.
 * A warp's chain of products per chunk is about halved (222 mma.sync instead of 444 at Dk 128) for
 * 8 KB of exchange a warp and one more barrier, and the grid has twice the blocks (32 columns
 * each): the launcher takes it where the 64-column grid leaves half the multiprocessors idle (one
 * long sequence at few heads; H200: 1 x 16K tokens at Hv 32, walk 0.97 -> 0.83 ms).
 */
#pragma once

#include "../../cuda_common/mmaSync.cuh"
#include "gatedDeltaRuleChunk.cuh"

namespace gdn
{
namespace kernels
{

constexpr int32_t kWALK_COLS = 16; // state columns a warp owns

//! Shared memory of the walk: kSTAGES copies of one chunk's tiles, then one output tile per warp,
//! then (split walk, kKS = 2) one exchange buffer per warp for the partial X and Y.
template <typename T, int32_t kDK, int32_t kNW, int32_t kSTAGES, int32_t kKS = 1>
struct WalkSmem
{
    static_assert((kKS == 1 || kKS == 2) && kNW % kKS == 0, "the state rows split in one or two");
    static constexpr int32_t kTHREADS = kNW * kWARP;
    static constexpr int32_t kBV = kNW / kKS * kWALK_COLS;
    // Rows padded by 16 bytes: the eight rows an ldmatrix reads fall in distinct bank groups.
    static constexpr int32_t kLDK = kDK + 8;
    static constexpr int32_t kLDP = kCHUNK + 8;
    // fp32 u, read at (token 2t + e, column g): a pad of 4 puts the 32 lanes in 32 banks.
    static constexpr int32_t kLDU = kBV + 4;
    static constexpr int32_t kLDO = kWALK_COLS + 8;
    static constexpr size_t kKTILE = alignUp(sizeof(T) * kCHUNK * kLDK, 128);
    static constexpr size_t kPTILE = alignUp(sizeof(T) * kCHUNK * kLDP, 128);
    static constexpr size_t kUTILE = alignUp(sizeof(float) * kCHUNK * kLDU, 128);
    static constexpr size_t kQ = 0;
    static constexpr size_t kK = kKTILE;
    static constexpr size_t kW = 2 * kKTILE;
    static constexpr size_t kP = 3 * kKTILE; // hi, then lo
    static constexpr size_t kU = kP + 2 * kPTILE;
    static constexpr size_t kSC = kU + kUTILE;
    static constexpr size_t kSTAGE = alignUp(kSC + sizeof(float) * kSCALARS, 128);
    static constexpr size_t kOUT = kSTAGES * kSTAGE;
    static constexpr size_t kOUT_WARP = alignUp(sizeof(T) * kCHUNK * kLDO, 128);
    static constexpr size_t kEX = kOUT + kNW * kOUT_WARP;
    static constexpr size_t kEX_WARP = kKS == 1 ? 0 : sizeof(float) * 2 * kCHUNK / 8 * 4 * kWARP; // X, Y tiles
    static constexpr size_t kBYTES = kEX + kNW * kEX_WARP;
};

//! Split walk: which of the two warps sharing 16 state columns produces output tokens [16 nb,
//! 16 nb + 16): the first takes blocks 0 and 3, the second 1 and 2 (the causal P gives block nb
//! nb + 1 source blocks, so each warp does five).
template <int32_t kKS>
__device__ __forceinline__ bool ownsOutputBlock(int32_t part, int32_t nb)
{
    return kKS == 1 || ((nb == 0 || nb == 3) == (part == 0));
}

//! Waits until at most kPENDING committed cp.async groups are still in flight.
template <int32_t kPENDING>
__device__ __forceinline__ void cpAsyncWaitPending()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPENDING));
}

//! One thread's share of copying a [64, kCOLS] tile of T to shared memory with 16-byte cp.async:
//! a fixed column and every kROW_STEP-th row, addresses worked out once per call instead of once
//! per vector (the general loadTileAsync doubled the walk's instructions per chunk). Rows >=
//! validRows and columns >= validCols read as zeros.
template <typename T, int32_t kCOLS, int32_t kTHREADS>
struct TileRows
{
    static constexpr int32_t kVEC = 16 / sizeof(T);
    static constexpr int32_t kVPR = kCOLS / kVEC;
    static constexpr int32_t kROW_STEP = kTHREADS / kVPR;
    static_assert(kTHREADS % kVPR == 0 && kCHUNK % kROW_STEP == 0, "threads must tile the rows");
    int32_t row0;
    int32_t col;
    bool colOk;

    __device__ TileRows(int32_t validCols)
        : row0(static_cast<int32_t>(threadIdx.x) / kVPR)
        , col(static_cast<int32_t>(threadIdx.x) % kVPR * kVEC)
        , colOk(col < validCols)
    {
    }

    __device__ __forceinline__ void issue(T* dst, int32_t ldDst, T const* src, int64_t srcStride, int32_t validRows) const
    {
        T const* s = src + row0 * srcStride + col;
        T* d = dst + row0 * ldDst + col;
#pragma unroll
        for (int32_t j = 0; j < kCHUNK / kROW_STEP; ++j)
        {
            bool const ok = colOk && row0 + j * kROW_STEP < validRows;
            // an invalid vector still needs a mapped address: the tile's base
            cpAsync16(d + j * kROW_STEP * ldDst, ok ? s + j * kROW_STEP * srcStride : src, ok ? 16 : 0);
        }
    }
};

//! The A operand (hi, lo) of the 16 x 16 block formed by accumulator tiles c0 (columns 0..7) and c1
//! (8..15), each column scaled by f (f0, f1: this lane's columns 2t, 2t + 1 of c0; f2, f3: of c1).
template <typename T>
__device__ __forceinline__ void splitOperand(float const (&c0)[4], float const (&c1)[4], float f0, float f1,
    float f2, float f3, uint32_t (&hi)[4], uint32_t (&lo)[4])
{
    mma::split2<T>(c0[0] * f0, c0[1] * f1, hi[0], lo[0]);
    mma::split2<T>(c0[2] * f0, c0[3] * f1, hi[1], lo[1]);
    mma::split2<T>(c1[0] * f2, c1[1] * f3, hi[2], lo[2]);
    mma::split2<T>(c1[2] * f2, c1[3] * f3, hi[3], lo[3]);
}

template <typename T, int32_t kDK, int32_t kNW, int32_t kSTAGES, int32_t kKS = 1>
__global__ void __launch_bounds__(kNW * kWARP) gatedDeltaRuleChunkWalkKernel(
    GatedDeltaRuleParams const p, ChunkWorkspace const ws)
{
    static_assert(kDK % (16 * kKS) == 0 && kSTAGES >= 1, "walk: Dk tiles of 16 per part");
    using L = WalkSmem<T, kDK, kNW, kSTAGES, kKS>;
    constexpr int32_t kDKW = kDK / kKS;  // state rows (dk) a warp holds
    constexpr int32_t kDT = kDKW / 8;    // 8-wide dk tiles of a warp's state
    constexpr int32_t kTT = kCHUNK / 8;  // 8-wide token tiles
    extern __shared__ __align__(128) unsigned char smem[];

    int32_t const dk = p.keyDim;
    int32_t const dv = p.valueDim;
    int32_t const hv = p.numValueHeads;
    int32_t const hk = p.numKeyHeads;
    int32_t const warp = threadIdx.x / kWARP;
    int32_t const lane = threadIdx.x % kWARP;
    int32_t const g = lane / 4;
    int32_t const t = lane % 4;
    int32_t const blockCol0 = blockIdx.x * L::kBV;
    int32_t const part = warp % kKS;      // which rows of the state this warp holds
    int32_t const colGroup = warp / kKS;  // which 16 columns
    int32_t const col0 = blockCol0 + colGroup * kWALK_COLS;
    int32_t const dk0 = part * kDKW;
    int32_t const h = blockIdx.y;
    int32_t const n = blockIdx.z;
    int32_t const kh = h / (hv / hk);
    int32_t const validV = min(L::kBV, dv - blockCol0);

    SequenceChunks const sc = sequenceChunks(p, ws, n, h);
    int64_t const bos = sc.bos;
    int32_t const len = sc.len;
    int32_t const numChunks = sc.numChunks;
    size_t const slot0 = sc.slot0;

    T const* q = static_cast<T const*>(p.q);
    T const* k = static_cast<T const*>(p.k);
    T const* wAll = static_cast<T const*>(ws.w);
    T const* pAll = static_cast<T const*>(ws.p);
    int64_t const qkStride = int64_t{hk} * dk;

    TileRows<T, kDK, L::kTHREADS> const rowsK(dk);
    TileRows<T, kCHUNK, L::kTHREADS> const rowsP(kCHUNK);
    TileRows<float, L::kBV, L::kTHREADS> const rowsU(validV);
    // Two load groups of chunk c: q and w (read by X and Y only), then the rest.
    auto issueQW = [&](int32_t c) {
        unsigned char* st = smem + (c % kSTAGES) * L::kSTAGE;
        int64_t const t0 = bos + static_cast<int64_t>(c) * kCHUNK;
        int32_t const valid = min(kCHUNK, len - c * kCHUNK);
        rowsK.issue(reinterpret_cast<T*>(st + L::kQ), L::kLDK, q + t0 * qkStride + kh * dk, qkStride, valid);
        rowsK.issue(reinterpret_cast<T*>(st + L::kW), L::kLDK, wAll + (slot0 + c) * kCHUNK * dk, dk, valid);
    };
    auto issueRest = [&](int32_t c) {
        unsigned char* st = smem + (c % kSTAGES) * L::kSTAGE;
        int64_t const t0 = bos + static_cast<int64_t>(c) * kCHUNK;
        int32_t const valid = min(kCHUNK, len - c * kCHUNK);
        size_t const slot = slot0 + c;
        rowsK.issue(reinterpret_cast<T*>(st + L::kK), L::kLDK, k + t0 * qkStride + kh * dk, qkStride, valid);
        rowsP.issue(reinterpret_cast<T*>(st + L::kP), L::kLDP, pAll + slot * 2 * kCHUNK * kCHUNK, kCHUNK, kCHUNK);
        rowsP.issue(reinterpret_cast<T*>(st + L::kP + L::kPTILE), L::kLDP,
            pAll + (slot * 2 + 1) * kCHUNK * kCHUNK, kCHUNK, kCHUNK);
        rowsU.issue(reinterpret_cast<float*>(st + L::kU), L::kLDU, ws.u + slot * kCHUNK * dv + blockCol0, dv, valid);
        for (int32_t i = threadIdx.x; i < kSCALARS / 4; i += L::kTHREADS)
        {
            cpAsync16(reinterpret_cast<float*>(st + L::kSC) + 4 * i, ws.scalars + slot * kSCALARS + 4 * i, 16);
        }
    };
    auto issue = [&](int32_t c) {
        issueQW(c);
        issueRest(c);
    };

    if constexpr (kSTAGES == 1)
    {
        // Groups in flight at the top of chunk c: its q / w group, then its other group.
        if (numChunks > 0)
        {
            issueQW(0);
        }
        cpAsyncCommit();
        if (numChunks > 0)
        {
            issueRest(0);
        }
        cpAsyncCommit();
    }
    else
    {
#pragma unroll
        for (int32_t c = 0; c < kSTAGES - 1; ++c)
        {
            if (c < numChunks)
            {
                issue(c);
            }
            cpAsyncCommit(); // empty groups keep the wait count uniform
        }
    }

    // The state is read once and stored once, in p.stateType; fp32 in registers in between.
    size_t const stateOffset = (static_cast<size_t>(n) * hv + h) * static_cast<size_t>(dk) * dv;
    // s[j][e] is state row 8j + 2t + (e & 1), column col0 + g + 8 (e >> 1): its element offset, and
    // whether it lies inside [Dk, Dv].
    auto stateElem = [&](int32_t j, int32_t e, size_t& offset) {
        int32_t const r = dk0 + 8 * j + 2 * t + (e & 1);
        int32_t const col = col0 + g + 8 * (e >> 1);
        offset = stateOffset + static_cast<size_t>(r) * dv + col;
        return r < dk && col < dv;
    };
    float s[kDT][4];
#pragma unroll
    for (int32_t j = 0; j < kDT; ++j)
    {
#pragma unroll
        for (int32_t e = 0; e < 4; ++e)
        {
            size_t offset;
            bool const inside = stateElem(j, e, offset);
            s[j][e] = p.initialState != nullptr && inside ? loadStateElem(p.initialState, offset, p.stateType) : 0.F;
        }
    }

    T* sOut = reinterpret_cast<T*>(smem + L::kOUT + warp * L::kOUT_WARP);
    // ldmatrix row addresses: lane l reads row l % 8 of matrix l / 8.
    int32_t const lm = lane / 8;
    int32_t const lr = lane % 8;

    for (int32_t c = 0; c < numChunks; ++c)
    {
        if constexpr (kSTAGES == 1)
        {
            cpAsyncWaitPending<1>();
            __syncthreads(); // chunk c's q and w are in
        }
        else
        {
            cpAsyncWaitPending<kSTAGES - 2>();
            __syncthreads(); // chunk c is in; every warp is done with chunk c - 1's buffer
            if (c + kSTAGES - 1 < numChunks)
            {
                issue(c + kSTAGES - 1);
            }
            cpAsyncCommit();
        }

        unsigned char const* st = smem + (c % kSTAGES) * L::kSTAGE;
        T const* sQ = reinterpret_cast<T const*>(st + L::kQ);
        T const* sK = reinterpret_cast<T const*>(st + L::kK);
        T const* sW = reinterpret_cast<T const*>(st + L::kW);
        T const* sP = reinterpret_cast<T const*>(st + L::kP);
        T const* sPLo = reinterpret_cast<T const*>(st + L::kP + L::kPTILE);
        float const* sU = reinterpret_cast<float const*>(st + L::kU);
        float const* sSc = reinterpret_cast<float const*>(st + L::kSC);

        // X = ST w^T and Y = ST q^T: B operands rows = tokens, columns = dk (as stored).
        float x[kTT][4];
        float y[kTT][4];
#pragma unroll
        for (int32_t i = 0; i < kTT; ++i)
        {
#pragma unroll
            for (int32_t e = 0; e < 4; ++e)
            {
                x[i][e] = 0.F;
                y[i][e] = 0.F;
            }
        }
#pragma unroll
        for (int32_t kb = 0; kb < kDKW / 16; ++kb)
        {
            uint32_t aHi[4];
            uint32_t aLo[4];
            splitOperand<T>(s[2 * kb], s[2 * kb + 1], 1.F, 1.F, 1.F, 1.F, aHi, aLo);
            int32_t const colOff = dk0 + 16 * kb + 8 * (lm & 1);
#pragma unroll
            for (int32_t np = 0; np < kTT / 2; ++np)
            {
                int32_t const row = 16 * np + 8 * (lm >> 1) + lr;
                uint32_t bw[4];
                uint32_t bq[4];
                mma::ldmatrixX4(bw, sW + row * L::kLDK + colOff);
                mma::ldmatrixX4(bq, sQ + row * L::kLDK + colOff);
                mma::mma16816<T>(x[2 * np], aHi, bw[0], bw[1]);
                mma::mma16816<T>(x[2 * np], aLo, bw[0], bw[1]);
                mma::mma16816<T>(x[2 * np + 1], aHi, bw[2], bw[3]);
                mma::mma16816<T>(x[2 * np + 1], aLo, bw[2], bw[3]);
                mma::mma16816<T>(y[2 * np], aHi, bq[0], bq[1]);
                mma::mma16816<T>(y[2 * np], aLo, bq[0], bq[1]);
                mma::mma16816<T>(y[2 * np + 1], aHi, bq[2], bq[3]);
                mma::mma16816<T>(y[2 * np + 1], aLo, bq[2], bq[3]);
            }
        }

        // Split walk: each warp has X and Y over its half of dk; it passes all of X (both need
        // v_new) and the Y tiles of the other's output tokens through shared memory.
        if constexpr (kKS == 2)
        {
            float* exOwn = reinterpret_cast<float*>(smem + L::kEX + warp * L::kEX_WARP);
#pragma unroll
            for (int32_t i = 0; i < kTT; ++i)
            {
#pragma unroll
                for (int32_t e = 0; e < 4; ++e)
                {
                    exOwn[(i * 4 + e) * kWARP + lane] = x[i][e];
                    if (!ownsOutputBlock<kKS>(part, i / 2))
                    {
                        exOwn[((kTT + i) * 4 + e) * kWARP + lane] = y[i][e];
                    }
                }
            }
        }
        if constexpr (kSTAGES == 1)
        {
            cpAsyncWaitPending<0>();
            __syncthreads(); // the rest of chunk c is in; every warp is done with q and w
            if (c + 1 < numChunks)
            {
                issueQW(c + 1);
            }
            cpAsyncCommit();
        }
        else if constexpr (kKS == 2)
        {
            __syncthreads(); // the partial X, Y are in (their buffers are rewritten only after the
                             // next chunk's first barrier, when every warp has read them)
        }
        if constexpr (kKS == 2)
        {
            float const* exOther = reinterpret_cast<float const*>(smem + L::kEX + (warp ^ 1) * L::kEX_WARP);
#pragma unroll
            for (int32_t i = 0; i < kTT; ++i)
            {
#pragma unroll
                for (int32_t e = 0; e < 4; ++e)
                {
                    x[i][e] += exOther[(i * 4 + e) * kWARP + lane];
                    if (ownsOutputBlock<kKS>(part, i / 2))
                    {
                        y[i][e] += exOther[((kTT + i) * 4 + e) * kWARP + lane];
                    }
                }
            }
        }

        // Vn = u^T - X (in x); O = Y diag(fq) (in y).
        int32_t const uCol = colGroup * kWALK_COLS + g;
#pragma unroll
        for (int32_t i = 0; i < kTT; ++i)
        {
            int32_t const tok = 8 * i + 2 * t;
            float const fq0 = sSc[tok];
            float const fq1 = sSc[tok + 1];
            x[i][0] = sU[tok * L::kLDU + uCol] - x[i][0];
            x[i][1] = sU[(tok + 1) * L::kLDU + uCol] - x[i][1];
            x[i][2] = sU[tok * L::kLDU + uCol + 8] - x[i][2];
            x[i][3] = sU[(tok + 1) * L::kLDU + uCol + 8] - x[i][3];
            y[i][0] *= fq0;
            y[i][1] *= fq1;
            y[i][2] *= fq0;
            y[i][3] *= fq1;
        }

        // O += Vn P^T: B operand rows = output tokens, columns = source tokens (P as stored). P is
        // causal, so source block kb meets output tiles from 2 kb on. P_lo Vn_lo is left out (below
        // the fp32 accumulation error), as in the wmma walk.
#pragma unroll
        for (int32_t kb = 0; kb < kCHUNK / 16; ++kb)
        {
            uint32_t aHi[4];
            uint32_t aLo[4];
            splitOperand<T>(x[2 * kb], x[2 * kb + 1], 1.F, 1.F, 1.F, 1.F, aHi, aLo);
            int32_t const colOff = 16 * kb + 8 * (lm & 1);
#pragma unroll
            for (int32_t np = kb; np < kTT / 2; ++np)
            {
                if (!ownsOutputBlock<kKS>(part, np))
                {
                    continue;
                }
                int32_t const row = 16 * np + 8 * (lm >> 1) + lr;
                uint32_t bp[4];
                uint32_t bpLo[4];
                mma::ldmatrixX4(bp, sP + row * L::kLDP + colOff);
                mma::ldmatrixX4(bpLo, sPLo + row * L::kLDP + colOff);
                mma::mma16816<T>(y[2 * np], aHi, bp[0], bp[1]);
                mma::mma16816<T>(y[2 * np], aLo, bp[0], bp[1]);
                mma::mma16816<T>(y[2 * np], aHi, bpLo[0], bpLo[1]);
                mma::mma16816<T>(y[2 * np + 1], aHi, bp[2], bp[3]);
                mma::mma16816<T>(y[2 * np + 1], aLo, bp[2], bp[3]);
                mma::mma16816<T>(y[2 * np + 1], aHi, bpLo[2], bpLo[3]);
            }
        }

        // O (transposed in registers) through this warp's staging tile to [token, column] rows.
#pragma unroll
        for (int32_t i = 0; i < kTT; ++i)
        {
            if (!ownsOutputBlock<kKS>(part, i / 2))
            {
                continue;
            }
            int32_t const tok = 8 * i + 2 * t;
            sOut[tok * L::kLDO + g] = fromFloat<T>(y[i][0]);
            sOut[(tok + 1) * L::kLDO + g] = fromFloat<T>(y[i][1]);
            sOut[tok * L::kLDO + g + 8] = fromFloat<T>(y[i][2]);
            sOut[(tok + 1) * L::kLDO + g + 8] = fromFloat<T>(y[i][3]);
        }
        __syncwarp();
        {
            int32_t const valid = min(kCHUNK, len - c * kCHUNK);
            int64_t const t0 = bos + static_cast<int64_t>(c) * kCHUNK;
            T* o = static_cast<T*>(p.o);
#pragma unroll
            for (int32_t i = 0; i < 2 * kCHUNK / kWARP; ++i)
            {
                int32_t const v = lane + i * kWARP;
                int32_t const row = v / 2;
                int32_t const col = col0 + 8 * (v % 2);
                if (row < valid && col < dv && ownsOutputBlock<kKS>(part, row / 16))
                {
                    *reinterpret_cast<uint4*>(o + ((t0 + row) * hv + h) * dv + col)
                        = *reinterpret_cast<uint4 const*>(sOut + row * L::kLDO + 8 * (v % 2));
                }
            }
        }
        __syncwarp();

        // ST = exp(G_last) ST + (Vn diag(fk)) k: B operand rows = tokens, columns = dk, read
        // transposed by ldmatrix (k as stored).
        float const decay = sSc[kSCALAR_DECAY];
#pragma unroll
        for (int32_t j = 0; j < kDT; ++j)
        {
#pragma unroll
            for (int32_t e = 0; e < 4; ++e)
            {
                s[j][e] *= decay;
            }
        }
        float const* sFk = sSc + kCHUNK;
#pragma unroll
        for (int32_t kb = 0; kb < kCHUNK / 16; ++kb)
        {
            int32_t const tok = 16 * kb + 2 * t;
            uint32_t aHi[4];
            uint32_t aLo[4];
            splitOperand<T>(
                x[2 * kb], x[2 * kb + 1], sFk[tok], sFk[tok + 1], sFk[tok + 8], sFk[tok + 9], aHi, aLo);
            int32_t const row = 16 * kb + 8 * (lm & 1) + lr;
#pragma unroll
            for (int32_t np = 0; np < kDKW / 16; ++np)
            {
                uint32_t bk[4];
                mma::ldmatrixX4Trans(bk, sK + row * L::kLDK + dk0 + 16 * np + 8 * (lm >> 1));
                mma::mma16816<T>(s[2 * np], aHi, bk[0], bk[1]);
                mma::mma16816<T>(s[2 * np], aLo, bk[0], bk[1]);
                mma::mma16816<T>(s[2 * np + 1], aHi, bk[2], bk[3]);
                mma::mma16816<T>(s[2 * np + 1], aLo, bk[2], bk[3]);
            }
        }
        if constexpr (kSTAGES == 1)
        {
            __syncthreads(); // every warp is done with k, P, u and the scalars
            if (c + 1 < numChunks)
            {
                issueRest(c + 1);
            }
            cpAsyncCommit();
        }
    }
    cpAsyncWaitPending<0>();

#pragma unroll
    for (int32_t j = 0; j < kDT; ++j)
    {
#pragma unroll
        for (int32_t e = 0; e < 4; ++e)
        {
            size_t offset;
            if (stateElem(j, e, offset))
            {
                storeStateElem(p.finalState, offset, p.stateType, s[j][e]);
            }
        }
    }
}

} // namespace kernels
} // namespace gdn
