/*
 * Extra entry points of the gated delta rule kernels for tests and benchmarks (the PyTorch
 * extension uses them to run one path on purpose). The TensorRT plugin needs only
 * gatedDeltaRuleKernels.h, whose launcher picks the path itself.
 */
#pragma once

#include "gatedDeltaRuleKernels.h"

namespace gdn
{

enum class GatedDeltaRulePath : int32_t
{
    kAUTO = 0,      //!< what launchGatedDeltaRule does
    kRECURRENT = 1, //!< token-by-token kernel, any T (slow for long T), no workspace
    kCHUNKED = 2,   //!< chunked WY kernels; cudaErrorInvalidValue where unsupported
    // The chunked path with its sequential pass pinned (cudaErrorInvalidValue where that pass does
    // not serve the inputs): the wmma walk (the fallback for fp32 and small shared memory), or the
    // mma.sync walk (fp16 / bf16) on 1, 2 or 4 warps a block.
    kCHUNKED_WMMA = 3,
    kCHUNKED_WALK1 = 4,
    kCHUNKED_WALK2 = 5,
    kCHUNKED_WALK4 = 6,
};

//! Workspace bytes of the chunked path for these shapes, whatever the path heuristic would pick.
size_t gatedDeltaRuleChunkedWorkspaceSize(GatedDeltaRuleParams const& params);

//! launchGatedDeltaRule with the path chosen by the caller. The workspace must hold
//! gatedDeltaRuleChunkedWorkspaceSize bytes when the chunked path runs. smemLimit > 0 caps the
//! shared memory a block may use below the device's, so that one GPU runs the kernel choices of
//! smaller ones (99 KB: sm_86 / 89 / 120, 163 KB: sm_80); 0: the device's.
cudaError_t launchGatedDeltaRuleWithPath(GatedDeltaRuleParams const& params, void* workspace, GatedDeltaRulePath path,
    cudaStream_t stream, int32_t smemLimit = 0);

} // namespace gdn
