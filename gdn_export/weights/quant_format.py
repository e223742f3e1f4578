"""The on-disk forms of quantized checkpoints that both the Linear and the routed-expert planners
read (gdn_export.weights.quantized, gdn_export.weights.quantized_experts): format names, safetensors
dtype names, ModelOpt's INT4 packing, and the header check of one tensor."""

from __future__ import annotations

import torch

from gdn_export.errors import CheckpointError

F8 = "F8_E4M3"
SCALE_DTYPES = ("F32", "BF16", "F16")
BLOCK = 128
FP8_BLOCK = "fp8-block128"  # the published fine-grained form
FP8 = "fp8"  # ModelOpt FP8: per-channel (or per-tensor) weights, static per-tensor activations
INT4_AWQ = "int4-awq"  # ModelOpt W4A16_AWQ
MODELOPT_ALGOS = {"FP8": FP8, "W4A16_AWQ": INT4_AWQ}


def unpack_modelopt_int4(packed: torch.Tensor) -> torch.Tensor:
    """ModelOpt's W4A16 weight uint8 [N/2, K] (rows 2i, 2i+1 in the low / high nibble of row i) ->
    int8 [N, K] in [-8, 7]."""
    low = (packed & 0x0F).to(torch.int8)
    high = (packed >> 4).to(torch.int8)
    q = torch.stack((low, high), dim=1).reshape(-1, packed.shape[1])
    return torch.where(q >= 8, q - 16, q)


def pack_modelopt_int4(q: torch.Tensor) -> torch.Tensor:
    """int [N, K] in [-8, 7] (N even) -> uint8 [N/2, K], ModelOpt's packing."""
    u = (q.to(torch.int16) & 0x0F).to(torch.uint8)
    return u[0::2] | (u[1::2] << 4)


def need_tensor(reader, key: str, dtypes: tuple[str, ...], shape: tuple[int, ...] | None, what: str) -> None:
    """CheckpointError naming `key` unless the checkpoint holds it in one of `dtypes` (safetensors
    names) and, when given, `shape`; `what` says what it is for."""
    if key not in reader.shapes:
        raise CheckpointError(f"tensor {key} is missing from the checkpoint ({what})")
    if reader.dtypes[key] not in dtypes:
        raise CheckpointError(f"tensor {key} is {reader.dtypes[key]}, expected {' or '.join(dtypes)} ({what})")
    if shape is not None and tuple(reader.shapes[key]) != tuple(shape):
        raise CheckpointError(f"tensor {key} has shape {tuple(reader.shapes[key])} in the checkpoint, "
                              f"expected {tuple(shape)} ({what})")
