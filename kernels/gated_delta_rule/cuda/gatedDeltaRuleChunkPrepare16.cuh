/*
 * The chunk-local half of the chunked prefill for 16-bit inputs (fp16 / bf16) on mma.sync:
 * gatedDeltaRulePrepare16Kernel. The same products, splits, workspace layout and precision as
 * gatedDeltaRulePrepareKernel (gatedDeltaRuleChunk.cuh, which stays for fp32 inputs; only the order
 * of some fp32 sums differs), in half the instructions (benchmarks/investigations/sass_phases.py): wmma there loaded its fragments through generic addresses and transposed the row-
 * major B operands with extra moves (about half the kernel's instructions; its H200 counters showed
 * it instruction-bound), staged every result through shared memory and rebuilt the inverse as two
 * 16-bit tiles per product. Here, one block per (chunk, value head), 8 warps:
 *
 *   k k^T, q k^T          ldmatrix + mma.sync, 10 lower 16 x 16 blocks each; the epilogue applies the
 *                         row / column factors in registers: A (fp32) to shared memory for the
 *                         solve, P (hi + lo) straight to the workspace
 *   Tm = (I + A)^-1       invertUnitLower64, exact fp32 (as before)
 *   w = Tm diag(beta exp(G) rk) k,  u = Tm diag(beta) v
 *                         A operands built in registers from Tm (the column factor applied, split
 *                         into hi + lo 16-bit parts), k and v as B operands through ldmatrix.trans;
 *                         results from the accumulators to the workspace (w rounded to the input
 *                         dtype, u fp32)
 *
 * Tm takes q's bytes (q is dead after q k^T) where they suffice, so the block needs 72.5 KB at
 * Dk = Dv = 128 and three blocks share a multiprocessor (launch bounds cap the registers at 80).
 */
#pragma once

#include "../../cuda_common/mmaSync.cuh"
#include "gatedDeltaRuleChunk.cuh"

namespace gdn
{
namespace kernels
{

//! Shared memory of gatedDeltaRulePrepare16Kernel (offsets in bytes from a 128-byte aligned base).
template <typename T, int32_t kDK, int32_t kDV>
struct Prepare16Smem
{
    // 16-byte row pads: the eight rows an ldmatrix reads fall in distinct bank groups.
    static constexpr int32_t kLDK = kDK + 8;
    static constexpr int32_t kLDV = kDV + 8;
    static constexpr int32_t kLDF = kCHUNK + 4; // fp32 A and Tm
    static constexpr size_t kKTILE = alignUp(sizeof(T) * kCHUNK * kLDK, 128);
    static constexpr size_t kFTILE = alignUp(sizeof(float) * kCHUNK * kLDF, 128);
    static constexpr bool kT_IN_Q = kKTILE >= kFTILE;
    static constexpr size_t kK = 0;
    static constexpr size_t kQ = kKTILE;
    static constexpr size_t kV = 2 * kKTILE;
    static constexpr size_t kA = alignUp(kV + sizeof(T) * kCHUNK * kLDV, 128);
    static constexpr size_t kT = kT_IN_Q ? kQ : kA + kFTILE;
    static constexpr size_t kM = kA + (kT_IN_Q ? 1 : 2) * kFTILE;
    static constexpr size_t kVEC = alignUp(kM + sizeof(float) * 3 * 16 * 16, 128);
    static constexpr int32_t kNVEC = 6; // G raw, G, beta, rk, rq, beta exp(G) rk
    static constexpr size_t kBYTES = kVEC + sizeof(float) * kNVEC * kCHUNK;
};

//! Lower 16 x 16 block idx (0..9, row by row) of a 64 x 64 matrix: its block row and column.
__device__ __forceinline__ void lowerBlock(int32_t idx, int32_t& rt, int32_t& ct)
{
    rt = (idx >= 1) + (idx >= 3) + (idx >= 6);
    ct = idx - rt * (rt + 1) / 2;
}

//! The A operand (rows 16 rt.., columns 16 kt..) of Tm diag(colF) as hi + lo 16-bit fragments.
template <typename T, int32_t kLD>
__device__ __forceinline__ void inverseOperand(
    float const* sT, float const* colF, int32_t rt, int32_t kt, uint32_t (&hi)[4], uint32_t (&lo)[4])
{
    int32_t const lane = threadIdx.x % kWARP;
    int32_t const r = 16 * rt + lane / 4;
    int32_t const c = 16 * kt + 2 * (lane % 4);
    float2 const x00 = *reinterpret_cast<float2 const*>(sT + r * kLD + c);
    float2 const x10 = *reinterpret_cast<float2 const*>(sT + (r + 8) * kLD + c);
    float2 const x01 = *reinterpret_cast<float2 const*>(sT + r * kLD + c + 8);
    float2 const x11 = *reinterpret_cast<float2 const*>(sT + (r + 8) * kLD + c + 8);
    float const f0 = colF[c];
    float const f1 = colF[c + 1];
    float const f2 = colF[c + 8];
    float const f3 = colF[c + 9];
    mma::split2<T>(x00.x * f0, x00.y * f1, hi[0], lo[0]);
    mma::split2<T>(x10.x * f0, x10.y * f1, hi[1], lo[1]);
    mma::split2<T>(x01.x * f2, x01.y * f3, hi[2], lo[2]);
    mma::split2<T>(x11.x * f2, x11.y * f3, hi[3], lo[3]);
}

//! out [64, d] = Tm diag(colF) x, x [64, kD] a 16-bit tile in shared memory (row stride ldx; columns
//! >= d are not written). Work items are (row tiles {0, 3} or {1, 2}, 16 columns): the two row
//! tiles of an item take five 16-deep steps between them, so the eight warps stay balanced.
//! Store(rt, column, acc) writes one 16 x 8 accumulator tile at rows 16 rt.., columns column...
template <typename T, int32_t kD, int32_t kLDF, typename Store>
__device__ __forceinline__ void inverseProducts(
    float const* sT, float const* colF, T const* x, int32_t ldx, int32_t d, Store&& store)
{
    constexpr int32_t kPAIRS = kD / 16;                      // 16-column groups
    constexpr int32_t kPER_WARP = (2 * kPAIRS + kCHUNK_WARPS - 1) / kCHUNK_WARPS;
    int32_t const warp = threadIdx.x / kWARP;
    int32_t const lane = threadIdx.x % kWARP;
    int32_t const rowPair = warp & 1;
#pragma unroll
    for (int32_t s = 0; s < 2; ++s)
    {
        int32_t const rt = s == 0 ? rowPair : 3 - rowPair;
        float acc[kPER_WARP][2][4];
#pragma unroll
        for (int32_t pp = 0; pp < kPER_WARP; ++pp)
        {
#pragma unroll
            for (int32_t e = 0; e < 4; ++e)
            {
                acc[pp][0][e] = 0.F;
                acc[pp][1][e] = 0.F;
            }
        }
        for (int32_t kt = 0; kt <= rt; ++kt)
        {
            uint32_t aHi[4];
            uint32_t aLo[4];
            inverseOperand<T, kLDF>(sT, colF, rt, kt, aHi, aLo);
            // ldmatrix.trans row addresses: matrices (rows 0-7 | 8-15) x (columns 0-7 | 8-15).
            int32_t const row = 16 * kt + (lane % 8) + ((lane / 8) & 1) * 8;
#pragma unroll
            for (int32_t pp = 0; pp < kPER_WARP; ++pp)
            {
                int32_t const pair = (warp >> 1) + 4 * pp;
                if (pair < kPAIRS && 16 * pair < d)
                {
                    uint32_t b[4];
                    mma::ldmatrixX4Trans(b, x + row * ldx + 16 * pair + 8 * (lane / 16));
                    mma::mma16816<T>(acc[pp][0], aHi, b[0], b[1]);
                    mma::mma16816<T>(acc[pp][0], aLo, b[0], b[1]);
                    mma::mma16816<T>(acc[pp][1], aHi, b[2], b[3]);
                    mma::mma16816<T>(acc[pp][1], aLo, b[2], b[3]);
                }
            }
        }
#pragma unroll
        for (int32_t pp = 0; pp < kPER_WARP; ++pp)
        {
            int32_t const pair = (warp >> 1) + 4 * pp;
#pragma unroll
            for (int32_t nt = 0; nt < 2; ++nt)
            {
                int32_t const col = 16 * pair + 8 * nt;
                if (pair < kPAIRS && col < d)
                {
                    store(rt, col, acc[pp][nt]);
                }
            }
        }
    }
}

template <typename T, int32_t kDK, int32_t kDV>
__global__ void __launch_bounds__(kCHUNK_THREADS, 3) gatedDeltaRulePrepare16Kernel(
    GatedDeltaRuleParams const p, ChunkWorkspace const ws)
{
    static_assert(kSPLIT<T>, "16-bit inputs only (fp32 takes gatedDeltaRulePrepareKernel)");
    using L = Prepare16Smem<T, kDK, kDV>;
    extern __shared__ __align__(128) unsigned char smem[];
    T* sK = reinterpret_cast<T*>(smem + L::kK);
    T* sQ = reinterpret_cast<T*>(smem + L::kQ);
    T* sV = reinterpret_cast<T*>(smem + L::kV);
    float* sA = reinterpret_cast<float*>(smem + L::kA);
    float* sT = reinterpret_cast<float*>(smem + L::kT);
    float* sM = reinterpret_cast<float*>(smem + L::kM);
    float* sGraw = reinterpret_cast<float*>(smem + L::kVEC);
    float* sG = sGraw + kCHUNK;
    float* sBeta = sG + kCHUNK;
    float* sRk = sBeta + kCHUNK;
    float* sRq = sRk + kCHUNK;
    float* sFw = sRq + kCHUNK;

    int32_t const dk = p.keyDim;
    int32_t const dv = p.valueDim;
    int32_t const h = blockIdx.y;
    int64_t const chunkId = blockIdx.x;
    int32_t const tid = threadIdx.x;
    int32_t const warp = tid / kWARP;
    int32_t const lane = tid % kWARP;
    int32_t const g4 = lane / 4;
    int32_t const t4 = lane % 4;

    ChunkInputs const in = locateChunk(p, ws, chunkId);
    if (!in.inRange)
    {
        return;
    }
    loadChunkInputs<T, kDK, kDV>(p, in, h, sK, sQ, L::kLDK, sV, L::kLDV, sGraw, sBeta);
    chunkRowFactors<T, kDK>(p, sK, sQ, L::kLDK, sGraw, sG, sRk, sRq);

    size_t const slot = static_cast<size_t>(h) * ws.maxChunks + chunkId;
    T* pHi = static_cast<T*>(ws.p) + slot * kP_TILES<T> * kCHUNK * kCHUNK;
    T* pLo = pHi + kCHUNK * kCHUNK;

    // k k^T (blocks 0..9) and q k^T (10..19), lower 16 x 16 blocks, and their factors:
    //   A_ij = beta_i rk_i rk_j exp(G_i - G_j) (k k^T)_ij for j < i, to sA
    //   P_ij = rq_i rk_j exp(G_i - G_j) (q k^T)_ij for j <= i, as hi + lo to the workspace
    for (int32_t t = warp; t < 20; t += kCHUNK_WARPS)
    {
        bool const isP = t >= 10;
        int32_t rt;
        int32_t ct;
        lowerBlock(isP ? t - 10 : t, rt, ct);
        T const* lhs = isP ? sQ : sK;
        float c[2][4] = {{0.F, 0.F, 0.F, 0.F}, {0.F, 0.F, 0.F, 0.F}};
        T const* aRow = lhs + (16 * rt + lane % 16) * L::kLDK + 8 * (lane / 16);
        T const* bRow = sK + (16 * ct + 8 * (lane / 16) + lane % 8) * L::kLDK + 8 * ((lane / 8) & 1);
#pragma unroll
        for (int32_t ks = 0; ks < kDK / 16; ++ks)
        {
            uint32_t a[4];
            uint32_t b[4];
            mma::ldmatrixX4(a, aRow + 16 * ks);
            mma::ldmatrixX4(b, bRow + 16 * ks);
            mma::mma16816<T>(c[0], a, b[0], b[1]);
            mma::mma16816<T>(c[1], a, b[2], b[3]);
        }
#pragma unroll
        for (int32_t hh = 0; hh < 2; ++hh)
        {
            int32_t const i = 16 * rt + g4 + 8 * hh;
            float const gi = sG[i];
            float const rowF = isP ? sRq[i] : sBeta[i] * sRk[i];
#pragma unroll
            for (int32_t nt = 0; nt < 2; ++nt)
            {
                int32_t const j = 16 * ct + 8 * nt + 2 * t4;
                // exp only where j <= i: above the diagonal G_i - G_j > 0 could overflow
                float const d0 = j <= i ? __expf(gi - sG[j]) * sRk[j] : 0.F;
                float const d1 = j + 1 <= i ? __expf(gi - sG[j + 1]) * sRk[j + 1] : 0.F;
                float x0 = c[nt][2 * hh] * rowF * d0;
                float x1 = c[nt][2 * hh + 1] * rowF * d1;
                if (isP)
                {
                    uint32_t hi;
                    uint32_t lo;
                    mma::split2<T>(x0, x1, hi, lo);
                    *reinterpret_cast<uint32_t*>(pHi + i * kCHUNK + j) = hi;
                    *reinterpret_cast<uint32_t*>(pLo + i * kCHUNK + j) = lo;
                }
                else
                {
                    x0 = j < i ? x0 : 0.F; // strictly lower
                    x1 = j + 1 < i ? x1 : 0.F;
                    *reinterpret_cast<float2*>(sA + i * L::kLDF + j) = make_float2(x0, x1);
                }
            }
        }
    }
    // P above the diagonal blocks: zeros, hi and lo (16 bytes a store).
    for (int32_t e = tid; e < kCHUNK * kCHUNK / 8; e += kCHUNK_THREADS)
    {
        int32_t const i = e / (kCHUNK / 8);
        int32_t const j = (e % (kCHUNK / 8)) * 8;
        if (j / 16 > i / 16)
        {
            *reinterpret_cast<uint4*>(pHi + i * kCHUNK + j) = make_uint4(0U, 0U, 0U, 0U);
            *reinterpret_cast<uint4*>(pLo + i * kCHUNK + j) = make_uint4(0U, 0U, 0U, 0U);
        }
    }
    if (tid < kCHUNK)
    {
        float const gLast = sG[kCHUNK - 1]; // padded tokens have g = 0: the last real G
        float const eg = __expf(sG[tid]);
        float* sc = ws.scalars + slot * kSCALARS;
        sc[tid] = sRq[tid] * eg;
        sc[kCHUNK + tid] = sRk[tid] * __expf(gLast - sG[tid]);
        sc[kSCALAR_DECAY + tid] = tid == 0 ? __expf(gLast) : 0.F;
        sFw[tid] = sBeta[tid] * eg * sRk[tid];
    }
    __syncthreads(); // A complete; q (Tm's bytes) no longer read

    invertUnitLower64<L::kLDF>(sA, sT, sM);

    // w = Tm diag(beta exp(G) rk) k (rounded to T), u = Tm diag(beta) v (fp32: it only enters
    // v_new = u - w S, where one rounding cost ~5e-3 of o).
    T* w = static_cast<T*>(ws.w) + slot * kCHUNK * dk;
    float* u = ws.u + slot * kCHUNK * dv;
    inverseProducts<T, kDK, L::kLDF>(sT, sFw, sK, L::kLDK, dk, [&](int32_t rt, int32_t col, float const(&acc)[4]) {
        int32_t const i = 16 * rt + g4;
        int32_t const j = col + 2 * t4;
        *reinterpret_cast<uint32_t*>(w + i * dk + j) = mma::pack2<T>(acc[0], acc[1]);
        *reinterpret_cast<uint32_t*>(w + (i + 8) * dk + j) = mma::pack2<T>(acc[2], acc[3]);
    });
    inverseProducts<T, kDV, L::kLDF>(sT, sBeta, sV, L::kLDV, dv, [&](int32_t rt, int32_t col, float const(&acc)[4]) {
        int32_t const i = 16 * rt + g4;
        int32_t const j = col + 2 * t4;
        *reinterpret_cast<float2*>(u + i * dv + j) = make_float2(acc[0], acc[1]);
        *reinterpret_cast<float2*>(u + (i + 8) * dv + j) = make_float2(acc[2], acc[3]);
    });
}

} // namespace kernels
} // namespace gdn
