"""The attention kernels' shape limits, importable without Triton (the op's routing reads them while
torch.compile traces the model, where no module may be imported)."""

MIN_ROWS = 16  # tl.dot needs M >= 16
MAX_ROWS = 64  # G * S beyond this: SDPA's query-parallel kernels have enough blocks anyway
MAX_TILE = 32 * 256  # query rows x D: the fp32 accumulator (32 KiB) stays in registers at 8 warps


def max_rows(D: int) -> int:
    """The most query rows (G * S) per kv head the split-KV decode kernel takes at head dim D."""
    return min(MAX_ROWS, MAX_TILE // D)
