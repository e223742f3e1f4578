"""Which stored tensor dtypes a checkpoint may hold: one check, before any tensor data is read.

The model computes in fp32 / fp16 / bf16 and converts every weight to the requested dtype. A
floating-point tensor in F32, F16, BF16 or F64 converts without surprise (F64 -> F32 keeps what the
model can use, as transformers does); an integer, boolean or 8-bit float tensor does not (an int8
weight cast to float is a different weight; FP8 needs its scales), so it is refused by name.

`check_tensor_dtypes(stored, allowed, where)` is the one place to widen this: a caller that knows
a tensor may be FP8 (a checkpoint whose quantization_config says so) passes `allowed` as a
function of the tensor name returning that tensor's set, e.g.

    allowed = lambda name: FLOAT_DTYPES | {"F8_E4M3"} if name.endswith(".weight") else FLOAT_DTYPES

Dtype names are the safetensors header's: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U8 BOOL ...
"""

from __future__ import annotations

from typing import Callable, Collection, Mapping

from gdn_export.errors import CheckpointError

FLOAT_DTYPES = frozenset({"F32", "F16", "BF16", "F64"})
_READABLE = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
             "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32",
             "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def readable(dtype: str) -> str:
    """"I8 (int8)" for a safetensors dtype name."""
    name = _READABLE.get(dtype)
    return f"{dtype} ({name})" if name else dtype


def check_tensor_dtypes(stored: Mapping[str, str],
                        allowed: Collection[str] | Callable[[str], Collection[str]] = FLOAT_DTYPES,
                        where: str = "checkpoint", hint: str = "") -> None:
    """CheckpointError naming the first tensor (sorted by name) whose stored dtype is not allowed.

    stored: {tensor name: safetensors dtype name}; allowed: one set for every tensor, or a function
    name -> that tensor's set; where: the checkpoint (folder or file) for the message; hint: appended
    to the message (e.g. what would make the dtype acceptable).
    """
    per_tensor = allowed if callable(allowed) else (lambda _name, s=frozenset(allowed): s)
    bad = [(name, dtype) for name, dtype in sorted(stored.items()) if dtype not in per_tensor(name)]
    if not bad:
        return
    name, dtype = bad[0]
    ok = ", ".join(readable(d) for d in sorted(per_tensor(name)))
    more = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
    if dtype.startswith("F8") and not hint:
        hint = "; FP8 weights need a quantization_config in config.json"
    raise CheckpointError(f"{where}: tensor {name} is stored as {readable(dtype)}{more}, which the "
                          f"model cannot take; allowed: {ok}{hint}")


def allowed_dtypes(config) -> Collection[str] | Callable[[str], Collection[str]]:
    """What `load_checkpoint` lets each tensor of a checkpoint with this HybridConfig be stored as:
    the floats for now (a quantized checkpoint's FP8 weights and scales are allowed here, from its
    quantization_config)."""
    return FLOAT_DTYPES


def stored_bytes(shapes: Mapping[str, tuple[int, ...]], element_bytes: int) -> int:
    """Bytes of all tensors in `shapes` at `element_bytes` per element (an export's weight size)."""
    total = 0
    for shape in shapes.values():
        n = 1
        for d in shape:
            n *= d
        total += n * element_bytes
    return total
