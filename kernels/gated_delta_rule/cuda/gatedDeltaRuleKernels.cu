/*
 * Host side of the gated delta rule kernels: parameter checks, workspace layout, path choice and
 * template dispatch. The kernels live in gatedDeltaRuleRecurrent.cuh, gatedDeltaRuleChunk.cuh,
 * gatedDeltaRuleChunkPrepare16.cuh and gatedDeltaRuleChunkWalk.cuh.
 *
 * Paths:
 *   recurrent  T <= 16 (per sequence when packed, or pure varlen decode), any Dk <= 256, any Dv;
 *              every T when each token's state is asked for (stepStates);
 *              also the fallback where the chunked kernels do not fit (odd dims, > 128, or a GPU
 *              with too little shared memory per block). No workspace.
 *   chunked    otherwise: Dk, Dv multiples of 8 and <= 128. Workspace: [varlen chunk offsets]
 *              [w: Hv x maxChunks x 64 x Dk, activation dtype][u: ... x 64 x Dv, fp32]
 *              [P: ... x {1, 2} x 64 x 64, activation dtype: hi and lo tiles for fp16 / bf16]
 *              [scalars: Hv x maxChunks x 192] fp32; maxChunks = B ceil(T / 64), or T / 64 + N for
 *              packed sequences (about 2 Dk + 4 Dv + 256 + 12 bytes per token and value head in bf16).
 *              Its prepare kernel: mma.sync for fp16 / bf16 (gatedDeltaRulePrepare16Kernel), wmma
 *              for fp32. Its sequential pass: for fp16 / bf16 the mma.sync walk with the state in
 *              registers (gatedDeltaRuleChunkWalk.cuh; split over two warps a column group on grids
 *              that leave multiprocessors idle) where its shared memory fits, else (and for fp32)
 *              the wmma walk with the state in shared memory (gatedDeltaRuleChunkStateKernel).
 */
#include "gatedDeltaRuleChunk.cuh"
#include "gatedDeltaRuleChunkPrepare16.cuh"
#include "gatedDeltaRuleChunkWalk.cuh"
#include "gatedDeltaRuleKernels.h"
#include "gatedDeltaRuleKernelsDetail.h"
#include "gatedDeltaRuleRecurrent.cuh"

#include <cmath>

namespace gdn
{
namespace
{

using kernels::ChunkWorkspace;
using kernels::kCHUNK;

constexpr int32_t kRECURRENT_MAX_T = 16; // longest sequence the recurrent kernel takes by default
constexpr int32_t kCHUNK_MAX_DIM = 128;
constexpr int32_t kMAX_GRID_YZ = 65535;
constexpr size_t kWORKSPACE_ALIGN = 256;

size_t elementSize(DataType t)
{
    return t == DataType::kFLOAT32 ? 4 : 2;
}

int32_t numSequences(GatedDeltaRuleParams const& p)
{
    return p.cuSeqlens != nullptr ? p.numSeqs : p.batch;
}

//! The shapes, dtype and scale alone: enough to size the workspace before any buffer exists.
bool shapesValid(GatedDeltaRuleParams const& p)
{
    auto const floatType = [](DataType t) {
        return t == DataType::kFLOAT32 || t == DataType::kFLOAT16 || t == DataType::kBFLOAT16;
    };
    bool const dtypeOk = floatType(p.dtype) && floatType(p.stateType);
    bool const shapeOk = p.batch >= 1 && p.seqLen >= 0 && p.numKeyHeads >= 1 && p.numValueHeads >= 1
        && p.numValueHeads % p.numKeyHeads == 0 && p.keyDim >= 1 && p.valueDim >= 1 && p.numValueHeads <= kMAX_GRID_YZ;
    bool const varlenOk = p.cuSeqlens == nullptr || (p.batch == 1 && p.numSeqs >= 1);
    return dtypeOk && shapeOk && varlenOk && std::isfinite(p.scale) && numSequences(p) <= kMAX_GRID_YZ;
}

bool paramsValid(GatedDeltaRuleParams const& p)
{
    bool const pointersOk = p.q != nullptr && p.k != nullptr && p.v != nullptr && p.g != nullptr && p.beta != nullptr
        && p.o != nullptr && (p.finalState != nullptr || p.stepStates != nullptr);
    return pointersOk && shapesValid(p);
}

bool chunkShapeOk(GatedDeltaRuleParams const& p)
{
    return p.keyDim % 8 == 0 && p.valueDim % 8 == 0 && p.keyDim <= kCHUNK_MAX_DIM && p.valueDim <= kCHUNK_MAX_DIM;
}

bool prefersChunked(GatedDeltaRuleParams const& p)
{
    if (!chunkShapeOk(p) || p.seqLen <= kRECURRENT_MAX_T || p.stepStates != nullptr)
    {
        return false;
    }
    // A pack of single tokens is a batched decode step.
    return p.cuSeqlens == nullptr || p.seqLen != p.numSeqs;
}

int64_t maxChunks(GatedDeltaRuleParams const& p)
{
    if (p.cuSeqlens != nullptr)
    {
        // sum_n ceil(L_n / 64) <= T / 64 + N; the exact count is only known on the device.
        return p.seqLen / kCHUNK + p.numSeqs;
    }
    return static_cast<int64_t>(p.batch) * ((p.seqLen + kCHUNK - 1) / kCHUNK);
}

struct WorkspaceLayout
{
    size_t offsetsBytes{0};
    size_t wBytes{0};
    size_t uBytes{0};
    size_t pBytes{0};
    size_t scalarBytes{0};
    size_t total() const
    {
        return offsetsBytes + wBytes + uBytes + pBytes + scalarBytes;
    }
};

WorkspaceLayout workspaceLayout(GatedDeltaRuleParams const& p)
{
    WorkspaceLayout l;
    size_t const rows = static_cast<size_t>(p.numValueHeads) * maxChunks(p) * kCHUNK;
    l.offsetsBytes = p.cuSeqlens != nullptr ? kernels::alignUp((p.numSeqs + 1) * sizeof(int32_t), kWORKSPACE_ALIGN) : 0;
    l.wBytes = kernels::alignUp(rows * p.keyDim * elementSize(p.dtype), kWORKSPACE_ALIGN);
    // u is fp32 for every dtype; P has a lo tile besides the hi one for 16-bit dtypes (kP_TILES).
    size_t const pTiles = p.dtype == DataType::kFLOAT32 ? 1 : 2;
    static_assert(kernels::kP_TILES<float> == 1 && kernels::kP_TILES<__half> == 2
            && kernels::kP_TILES<__nv_bfloat16> == 2,
        "pTiles must match the kernels");
    l.uBytes = kernels::alignUp(rows * p.valueDim * sizeof(float), kWORKSPACE_ALIGN);
    l.pBytes = kernels::alignUp(rows * kCHUNK * pTiles * elementSize(p.dtype), kWORKSPACE_ALIGN);
    l.scalarBytes = kernels::alignUp(
        static_cast<size_t>(p.numValueHeads) * maxChunks(p) * kernels::kSCALARS * sizeof(float), kWORKSPACE_ALIGN);
    return l;
}

int32_t roundDim(int32_t d, int32_t lowest)
{
    for (int32_t r = lowest; r <= 256; r *= 2)
    {
        if (d <= r)
        {
            return r;
        }
    }
    return 0;
}

//! An attribute of the current device (0 when the query fails).
int32_t deviceAttribute(cudaDeviceAttr attribute)
{
    int32_t device = 0;
    int32_t value = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&value, attribute, device) != cudaSuccess)
    {
        return 0;
    }
    return value;
}

int32_t maxDynamicSmem()
{
    return deviceAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
}

//! The device's multiprocessors, asked once (the launchers size their choices by it).
int64_t multiprocessors()
{
    static int64_t const sms = deviceAttribute(cudaDevAttrMultiProcessorCount);
    return sms;
}

// ---------------------------------------------------------------- recurrent

//! A decode step of a 16-bit state with the [kDK, kBV] tile on kNW warps: the state tile staged in
//! shared memory (see the kernel), so the shared-memory carveout bounds the blocks per
//! multiprocessor: ask for all of it.
template <typename T, typename S, int32_t kDK, int32_t kBV, int32_t kNW, int32_t kMIN_BLOCKS = 1>
void launchDecode16(GatedDeltaRuleParams const& p, cudaStream_t stream)
{
    using Tile = kernels::DecodeTile16<kDK, kBV, kNW, kMIN_BLOCKS>;
    auto const kernel = kernels::gatedDeltaRuleDecode16Kernel<T, S, kDK, Tile>;
    static bool const carveout = cudaFuncSetAttribute(
        kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) == cudaSuccess;
    (void) carveout; // a hint: without it the kernel is correct, only fewer blocks may fit
    dim3 const grid((p.valueDim + kBV - 1) / kBV, p.numValueHeads, numSequences(p));
    kernel<<<grid, Tile::kTHREADS, 0, stream>>>(p);
}

//! S: the state's storage type. The decode kernel is templated on it (its loads and stores are the
//! whole cost of a step); the chunked kernels switch on p.stateType at their one load and store.
template <typename T, typename S, int32_t kDK>
void launchRecurrentTile(GatedDeltaRuleParams const& p, cudaStream_t stream)
{
    using Tile = kernels::RecurrentTile<S, kDK>;
    dim3 const grid((p.valueDim + Tile::kBV - 1) / Tile::kBV, p.numValueHeads, numSequences(p));
    if (p.stepStates != nullptr)
    {
        kernels::gatedDeltaRuleRecurrentKernel<T, S, kDK, true><<<grid, Tile::kTHREADS, 0, stream>>>(p);
        return;
    }
    if constexpr (sizeof(S) == 2 && kDK >= 16)
    {
        if (p.seqLen == 1 && p.cuSeqlens == nullptr)
        {
            // Tile by grid size (H200, benchmarks/investigations/cuda/decode16_tiles.cu; 64-column
            // tiles per multiprocessor at Hv = 32, Dv = 128: B = 1 is 0.5, B = 8 is 3.9): a grid of
            // half a tile per multiprocessor finishes soonest with 4 warps on 32 columns (3.3 us at
            // B = 1, 2 warps 3.9); up to 4 tiles each, 2 warps on 32 columns (5.5 vs 6.0 us at B = 4,
            // 7.8 vs 8.1 at 8); beyond, 4 warps on 64 columns with registers capped for 8 resident
            // blocks (with the reduction on the tensor cores: 41.7 vs 44.0 us for 2 warps at
            // B = 64, 23.3 vs 26.1 at 32, 282 vs 281 at 512; 10 blocks spill and are slower).
            int64_t const sms = multiprocessors();
            int64_t const tiles64 = static_cast<int64_t>((p.valueDim + 63) / 64) * p.numValueHeads * numSequences(p);
            if constexpr (kernels::DecodeTile16<kDK, 32, 4>::kFITS)
            {
                if (2 * tiles64 <= sms)
                {
                    launchDecode16<T, S, kDK, 32, 4>(p, stream);
                    return;
                }
            }
            if (tiles64 <= 4 * sms)
            {
                launchDecode16<T, S, kDK, 32, 2>(p, stream);
                return;
            }
            launchDecode16<T, S, kDK, 64, 4, (kDK <= 128 ? 8 : 1)>(p, stream);
            return;
        }
    }
    kernels::gatedDeltaRuleRecurrentKernel<T, S, kDK><<<grid, Tile::kTHREADS, 0, stream>>>(p);
}

template <typename T, typename S>
cudaError_t launchRecurrentState(GatedDeltaRuleParams const& p, cudaStream_t stream)
{
    switch (roundDim(p.keyDim, 16))
    {
    case 16: launchRecurrentTile<T, S, 16>(p, stream); break;
    case 32: launchRecurrentTile<T, S, 32>(p, stream); break;
    case 64: launchRecurrentTile<T, S, 64>(p, stream); break;
    case 128: launchRecurrentTile<T, S, 128>(p, stream); break;
    case 256: launchRecurrentTile<T, S, 256>(p, stream); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

template <typename T>
cudaError_t launchRecurrent(GatedDeltaRuleParams const& p, cudaStream_t stream)
{
    switch (p.stateType)
    {
    case DataType::kFLOAT32: return launchRecurrentState<T, float>(p, stream);
    case DataType::kFLOAT16: return launchRecurrentState<T, __half>(p, stream);
    case DataType::kBFLOAT16: return launchRecurrentState<T, __nv_bfloat16>(p, stream);
    }
    return cudaErrorInvalidValue;
}

// ---------------------------------------------------------------- chunked

template <typename Kernel>
cudaError_t launchWithSmem(Kernel kernel, dim3 grid, size_t smemBytes, cudaStream_t stream,
    GatedDeltaRuleParams const& p, ChunkWorkspace const& ws, int32_t threads = kernels::kCHUNK_THREADS)
{
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int32_t>(smemBytes));
    if (err != cudaSuccess)
    {
        return err;
    }
    kernel<<<grid, threads, smemBytes, stream>>>(p, ws);
    return cudaGetLastError();
}

//! Shared memory of the prepare kernel for T: the mma.sync one for 16-bit inputs, wmma for fp32.
template <typename T, int32_t kDK, int32_t kDV>
constexpr size_t prepareBytes()
{
    if constexpr (kernels::kSPLIT<T>)
    {
        return kernels::Prepare16Smem<T, kDK, kDV>::kBYTES;
    }
    else
    {
        return kernels::PrepareSmem<T, kDK, kDV>::kBYTES;
    }
}

template <typename T, int32_t kDK, int32_t kDV>
cudaError_t launchPrepare(GatedDeltaRuleParams const& p, ChunkWorkspace const& ws, cudaStream_t stream)
{
    dim3 const grid(static_cast<uint32_t>(ws.maxChunks), p.numValueHeads);
    if constexpr (kernels::kSPLIT<T>)
    {
        return launchWithSmem(kernels::gatedDeltaRulePrepare16Kernel<T, kDK, kDV>, grid,
            prepareBytes<T, kDK, kDV>(), stream, p, ws);
    }
    else
    {
        return launchWithSmem(kernels::gatedDeltaRulePrepareKernel<T, kDK, kDV>, grid,
            prepareBytes<T, kDK, kDV>(), stream, p, ws);
    }
}

template <typename T, int32_t kDK>
cudaError_t launchPrepareDv(GatedDeltaRuleParams const& p, ChunkWorkspace const& ws, cudaStream_t stream)
{
    switch (roundDim(p.valueDim, 32))
    {
    case 32: return launchPrepare<T, kDK, 32>(p, ws, stream);
    case 64: return launchPrepare<T, kDK, 64>(p, ws, stream);
    case 128: return launchPrepare<T, kDK, 128>(p, ws, stream);
    default: return cudaErrorInvalidValue;
    }
}

template <typename T, int32_t kDK>
size_t prepareSmemBytes(int32_t valueDim)
{
    switch (roundDim(valueDim, 32))
    {
    case 32: return prepareBytes<T, kDK, 32>();
    case 64: return prepareBytes<T, kDK, 64>();
    default: return prepareBytes<T, kDK, 128>();
    }
}

//! Pipeline depth of the wmma walk that fits in smemLimit bytes (0: none).
template <typename T, int32_t kDK>
int32_t wmmaStages(int32_t smemLimit)
{
    if (kernels::StateSmem<T, kDK, 2>::kBYTES <= static_cast<size_t>(smemLimit))
    {
        return 2;
    }
    return kernels::StateSmem<T, kDK, 1>::kBYTES <= static_cast<size_t>(smemLimit) ? 1 : 0;
}

template <typename T, int32_t kDK, int32_t kNW, int32_t kSTAGES, int32_t kKS = 1>
bool walkFits(int32_t smemLimit)
{
    return kernels::WalkSmem<T, kDK, kNW, kSTAGES, kKS>::kBYTES <= static_cast<size_t>(smemLimit);
}

//! Whether the mma.sync walk on kNW warps fits in smemLimit (single-buffered at least).
template <typename T, int32_t kDK, int32_t kNW>
bool walkWidthFits(int32_t smemLimit)
{
    return kernels::kSPLIT<T> && walkFits<T, kDK, kNW, 1>(smemLimit);
}

//! What of the chunked path fits a device with smemLimit bytes of shared memory a block.
struct ChunkFit
{
    bool prepare{false};
    int32_t wmmaStages{0}; //!< pipeline depth of the wmma walk, 0: it does not fit
    bool walk{false};      //!< some mma.sync walk fits (16-bit inputs)
    bool fits() const
    {
        return prepare && (wmmaStages > 0 || walk);
    }
};

template <typename T, int32_t kDK>
ChunkFit chunkFitDk(GatedDeltaRuleParams const& p, int32_t smemLimit)
{
    ChunkFit f;
    f.prepare = prepareSmemBytes<T, kDK>(p.valueDim) <= static_cast<size_t>(smemLimit);
    f.wmmaStages = wmmaStages<T, kDK>(smemLimit);
    f.walk = walkWidthFits<T, kDK, 1>(smemLimit);
    return f;
}

template <typename T>
ChunkFit chunkFit(GatedDeltaRuleParams const& p, int32_t smemLimit)
{
    switch (roundDim(p.keyDim, 32))
    {
    case 32: return chunkFitDk<T, 32>(p, smemLimit);
    case 64: return chunkFitDk<T, 64>(p, smemLimit);
    case 128: return chunkFitDk<T, 128>(p, smemLimit);
    default: return ChunkFit{};
    }
}

template <typename T, int32_t kDK, int32_t kNW, int32_t kSTAGES, int32_t kKS = 1>
cudaError_t launchWalk(GatedDeltaRuleParams const& p, ChunkWorkspace const& ws, cudaStream_t stream)
{
    using L = kernels::WalkSmem<T, kDK, kNW, kSTAGES, kKS>;
    dim3 const grid((p.valueDim + L::kBV - 1) / L::kBV, p.numValueHeads, numSequences(p));
    return launchWithSmem(kernels::gatedDeltaRuleChunkWalkKernel<T, kDK, kNW, kSTAGES, kKS>, grid, L::kBYTES,
        stream, p, ws, L::kTHREADS);
}

//! Blocks of the walk that fit on one multiprocessor at once (its shared memory bounds it), asked
//! once per kernel.
template <typename T, int32_t kDK, int32_t kNW, int32_t kSTAGES>
int32_t walkResidents()
{
    static int32_t const residents = [] {
        using L = kernels::WalkSmem<T, kDK, kNW, kSTAGES>;
        auto const kernel = kernels::gatedDeltaRuleChunkWalkKernel<T, kDK, kNW, kSTAGES>;
        int32_t n = 0;
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int32_t>(L::kBYTES))
                != cudaSuccess
            || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, L::kTHREADS, L::kBYTES) != cudaSuccess)
        {
            (void) cudaGetLastError(); // the query is advice: clear its error, assume one block
            return 1;
        }
        return n;
    }();
    return residents;
}

//! The walk on kNW warps: double-buffered, unless a batch of equal sequences needs more than one
//! wave of it and the single-buffered block fits more often per multiprocessor (H200, 4
//! warps: 186 KB double-buffered is one block a multiprocessor, 99 KB single-buffered two; 8 x 8K
//! tokens at Hv 48 (768 blocks) 2.88 -> 2.47 ms single-buffered, 1 x 16K at Hv 32 (64 blocks) 0.97
//! double-buffered against 1.01), or the double-buffered block does not fit (99 KB / 163 KB GPUs).
//! Packed sequences stay double-buffered: the longest one bounds the walk, and a block that shares
//! its multiprocessor runs slower (a ragged pack of 1 to 12000 tokens took 1.97 ms single-buffered,
//! 1.81 double-buffered, H200).
//! 1 and 2 warps only single-buffered: the 4-warp block fits wherever they do (99 KB at Dk 128), so
//! they run only when pinned (tests, benchmarks), and each variant costs build time.
//! Unpinned (split), a grid of 4-warp blocks that covers at most half the multiprocessors runs the
//! split walk instead: two warps share each 16 state columns, half of dk each (kKS = 2, 32 columns
//! a block, double-buffered only), so twice the blocks each walk their chain in about half the
//! products (one long sequence at few heads: the time to first token of a single prompt).
template <typename T, int32_t kDK, int32_t kNW>
cudaError_t launchWalkWidth(
    GatedDeltaRuleParams const& p, ChunkWorkspace const& ws, int32_t smem, bool split, cudaStream_t stream)
{
    if constexpr (kNW == 4)
    {
        if (walkFits<T, kDK, kNW, 2>(smem))
        {
            using L = kernels::WalkSmem<T, kDK, kNW, 2>;
            int64_t const sms = multiprocessors();
            int64_t const blocks
                = static_cast<int64_t>((p.valueDim + L::kBV - 1) / L::kBV) * p.numValueHeads * numSequences(p);
            if (split && 2 * blocks <= sms && walkFits<T, kDK, kNW, 2, 2>(smem))
            {
                return launchWalk<T, kDK, kNW, 2, 2>(p, ws, stream);
            }
            int32_t const residents2 = walkResidents<T, kDK, kNW, 2>();
            bool const single = p.cuSeqlens == nullptr && walkResidents<T, kDK, kNW, 1>() > residents2
                && blocks > sms * residents2;
            if (!single)
            {
                return launchWalk<T, kDK, kNW, 2>(p, ws, stream);
            }
        }
    }
    return launchWalk<T, kDK, kNW, 1>(p, ws, stream);
}

//! The mma.sync walk (16-bit inputs), or cudaErrorNotSupported where it does not fit (the caller
//! then runs the wmma walk). Unpinned: the widest block that fits (launchWalkWidth picks its
//! buffering); 4 warps on the H200 (fastest on every shape class, even where the grid then
//! covers only half the multiprocessors, 1 x 16K tokens at Hv 32: 0.98 ms against 1.05 on 2 warps
//! and 2.56 on 1: the block's warps share the chunk's loads); single-buffered 4 warps with 99 KB
//! (sm_86 / 89 / 120) or 163 KB (A100) of shared memory, where the double-buffered block does not fit.
template <typename T, int32_t kDK>
cudaError_t launchWalkFitting(GatedDeltaRuleParams const& p, ChunkWorkspace const& ws, GatedDeltaRulePath path,
    int32_t smem, cudaStream_t stream)
{
    bool const any = path != GatedDeltaRulePath::kCHUNKED_WALK1 && path != GatedDeltaRulePath::kCHUNKED_WALK2
        && path != GatedDeltaRulePath::kCHUNKED_WALK4;
    if ((any || path == GatedDeltaRulePath::kCHUNKED_WALK4) && walkWidthFits<T, kDK, 4>(smem))
    {
        return launchWalkWidth<T, kDK, 4>(p, ws, smem, any, stream);
    }
    if ((any || path == GatedDeltaRulePath::kCHUNKED_WALK2) && walkWidthFits<T, kDK, 2>(smem))
    {
        return launchWalkWidth<T, kDK, 2>(p, ws, smem, false, stream);
    }
    if ((any || path == GatedDeltaRulePath::kCHUNKED_WALK1) && walkWidthFits<T, kDK, 1>(smem))
    {
        return launchWalkWidth<T, kDK, 1>(p, ws, smem, false, stream);
    }
    return cudaErrorNotSupported;
}

//! smemLimit: shared memory a block may use (launchTyped checked that the prepare kernel and one
//! of the walks fit in it).
template <typename T, int32_t kDK>
cudaError_t launchChunkedDk(GatedDeltaRuleParams const& p, ChunkWorkspace const& ws, GatedDeltaRulePath path,
    int32_t smemLimit, cudaStream_t stream)
{
    cudaError_t err = launchPrepareDv<T, kDK>(p, ws, stream);
    if (err != cudaSuccess)
    {
        return err;
    }
    if constexpr (kernels::kSPLIT<T>)
    {
        if (path != GatedDeltaRulePath::kCHUNKED_WMMA)
        {
            err = launchWalkFitting<T, kDK>(p, ws, path, smemLimit, stream);
            if (err != cudaErrorNotSupported)
            {
                return err;
            }
        }
    }
    int32_t const stages = wmmaStages<T, kDK>(smemLimit);
    if (path >= GatedDeltaRulePath::kCHUNKED_WALK1 || stages == 0)
    {
        return cudaErrorInvalidValue; // a pinned walk that does not serve these inputs or fit
    }
    dim3 const grid((p.valueDim + kernels::kSTATE_BV - 1) / kernels::kSTATE_BV, p.numValueHeads, numSequences(p));
    if (stages == 2)
    {
        return launchWithSmem(kernels::gatedDeltaRuleChunkStateKernel<T, kDK, 2>, grid,
            kernels::StateSmem<T, kDK, 2>::kBYTES, stream, p, ws);
    }
    return launchWithSmem(kernels::gatedDeltaRuleChunkStateKernel<T, kDK, 1>, grid,
        kernels::StateSmem<T, kDK, 1>::kBYTES, stream, p, ws);
}

template <typename T>
cudaError_t launchChunked(
    GatedDeltaRuleParams const& p, void* workspace, GatedDeltaRulePath path, int32_t smemLimit, cudaStream_t stream)
{
    WorkspaceLayout const l = workspaceLayout(p);
    auto* base = static_cast<unsigned char*>(workspace);
    ChunkWorkspace ws;
    ws.maxChunks = maxChunks(p);
    ws.chunksPerSeq = (p.seqLen + kCHUNK - 1) / kCHUNK;
    ws.w = base + l.offsetsBytes;
    ws.u = reinterpret_cast<float*>(base + l.offsetsBytes + l.wBytes);
    ws.p = base + l.offsetsBytes + l.wBytes + l.uBytes;
    ws.scalars = reinterpret_cast<float*>(base + l.offsetsBytes + l.wBytes + l.uBytes + l.pBytes);
    if (p.cuSeqlens != nullptr)
    {
        auto* offsets = reinterpret_cast<int32_t*>(base);
        kernels::gatedDeltaRuleChunkOffsetsKernel<<<1, kernels::kOFFSETS_THREADS, 0, stream>>>(
            p.cuSeqlens, p.numSeqs, offsets);
        cudaError_t const err = cudaGetLastError();
        if (err != cudaSuccess)
        {
            return err;
        }
        ws.chunkOffsets = offsets;
    }
    if (ws.maxChunks == 0)
    {
        return cudaSuccess;
    }
    switch (roundDim(p.keyDim, 32))
    {
    case 32: return launchChunkedDk<T, 32>(p, ws, path, smemLimit, stream);
    case 64: return launchChunkedDk<T, 64>(p, ws, path, smemLimit, stream);
    case 128: return launchChunkedDk<T, 128>(p, ws, path, smemLimit, stream);
    default: return cudaErrorInvalidValue;
    }
}

// ---------------------------------------------------------------- dispatch

//! smemOverride: > 0 caps the shared memory a block may use below the device's (tests run the
//! paths of smaller GPUs on a larger one).
template <typename T>
cudaError_t launchTyped(GatedDeltaRuleParams const& p, void* workspace, GatedDeltaRulePath path, int32_t smemOverride,
    cudaStream_t stream)
{
    bool const pinned = path != GatedDeltaRulePath::kAUTO && path != GatedDeltaRulePath::kRECURRENT;
    if (pinned && p.stepStates != nullptr)
    {
        return cudaErrorInvalidValue; // every token's state: the recurrent kernel only
    }
    bool chunked = pinned || (path == GatedDeltaRulePath::kAUTO && prefersChunked(p));
    int32_t smemLimit = 0;
    if (chunked)
    {
        int32_t const device = maxDynamicSmem();
        smemLimit = smemOverride > 0 && smemOverride < device ? smemOverride : device;
        bool const fits = chunkShapeOk(p) && chunkFit<T>(p, smemLimit).fits();
        if (!fits || workspace == nullptr)
        {
            if (pinned || workspace == nullptr)
            {
                return cudaErrorInvalidValue;
            }
            chunked = false; // shared memory too small on this GPU: fall back, still correct
        }
    }
    if (chunked)
    {
        return launchChunked<T>(p, workspace, path, smemLimit, stream);
    }
    if (roundDim(p.keyDim, 16) == 0)
    {
        return cudaErrorInvalidValue;
    }
    return launchRecurrent<T>(p, stream);
}

} // namespace

size_t gatedDeltaRuleChunkedWorkspaceSize(GatedDeltaRuleParams const& params)
{
    if (!shapesValid(params) || !chunkShapeOk(params))
    {
        return 0;
    }
    return workspaceLayout(params).total();
}

size_t gatedDeltaRuleWorkspaceSize(GatedDeltaRuleParams const& params)
{
    // Shapes only (no buffers exist when TensorRT asks), independent of the device: where the
    // chunked path falls back, the workspace goes unused.
    if (!shapesValid(params) || !prefersChunked(params))
    {
        return 0;
    }
    return workspaceLayout(params).total();
}

cudaError_t launchGatedDeltaRuleWithPath(GatedDeltaRuleParams const& params, void* workspace, GatedDeltaRulePath path,
    cudaStream_t stream, int32_t smemLimit)
{
    if (!paramsValid(params))
    {
        return cudaErrorInvalidValue;
    }
    if (numSequences(params) == 0)
    {
        return cudaSuccess;
    }
    switch (params.dtype)
    {
    case DataType::kFLOAT32: return launchTyped<float>(params, workspace, path, smemLimit, stream);
    case DataType::kFLOAT16: return launchTyped<__half>(params, workspace, path, smemLimit, stream);
    case DataType::kBFLOAT16: return launchTyped<__nv_bfloat16>(params, workspace, path, smemLimit, stream);
    }
    return cudaErrorInvalidValue;
}

cudaError_t launchGatedDeltaRule(GatedDeltaRuleParams const& params, void* workspace, cudaStream_t stream)
{
    return launchGatedDeltaRuleWithPath(params, workspace, GatedDeltaRulePath::kAUTO, stream);
}

} // namespace gdn
