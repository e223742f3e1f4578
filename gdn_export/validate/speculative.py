"""`gdn-export validate CHECKPOINT --onnx NAME.verify.onnx` (or NAME.mtp.onnx): a graph of
`export --speculative K` in ONNX Runtime against the checkpoint's PyTorch modules.

The verify form runs K + 1 tokens a row (one row, then `batch` ragged rows: every other row one
token short) from random states, the MTP head one token and then `seq` tokens a row (at most what
its cache holds beside the rows' pasts), against
gdn_export.onnx.speculative.VerifyForm / the head (gdn_export.weights.mtp.load_mtp) on the same
inputs. Each output's error is max |ORT - PyTorch| / max |PyTorch|, bounded by the graph's dtype
(BOUNDS; a bf16 graph runs as fp32 tensors rounded to bf16 where it rounds).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from gdn_export.errors import InputError
from gdn_export.onnx.metadata import KEY_DTYPE, KEY_SPECULATIVE_K, KEY_SPECULATIVE_ROLE, read_layout

# max |ORT - PyTorch| / max |PyTorch| per graph dtype (tiny models of every MTP family: fp32 < 1e-5,
# fp16 < 2e-3, bf16 < 1.5e-2)
BOUNDS = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 4e-2}


def speculative_role(path) -> str | None:
    """"verify" or "mtp" for a graph `export --speculative` wrote, else None (metadata only)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - not an ONNX file: the caller's own checks say so
        return None
    return {p.key: p.value for p in model.metadata_props}.get(KEY_SPECULATIVE_ROLE)


@dataclass
class Row:
    call: str  # e.g. "verify B3" or "mtp B3 x 4"
    output: str
    error: float
    bound: float

    @property
    def ok(self) -> bool:
        return self.error <= self.bound


def validate_speculative(path, checkpoint, batch: int, seq: int, seed: int, bounds: dict[str, float] | None = None,
                         default_bound: float | None = None, progress=None) -> list[Row]:
    """Rows of every output of `path` (a verify or head graph) on two calls against PyTorch (module
    docstring). bounds: per-output overrides (an output the graph lacks is an InputError, before the
    checkpoint loads); default_bound: instead of BOUNDS[graph dtype]."""
    import torch

    from gdn_export.onnx.speculative import VerifyForm, compare_in_ort, mtp_inputs, verify_inputs
    from gdn_export.weights import load_checkpoint
    from gdn_export.weights.mtp import load_mtp

    say = progress or (lambda _m: None)
    proto = onnx.load(str(path), load_external_data=False)
    meta = {p.key: p.value for p in proto.metadata_props}
    outputs = [v.name for v in proto.graph.output]
    unknown = sorted((bounds or {}).keys() - set(outputs))
    if unknown:
        raise InputError(f"--rtol {unknown[0]}: no such output of {path}; its outputs: {', '.join(outputs)}")
    role, dtype = meta.get(KEY_SPECULATIVE_ROLE), meta.get(KEY_DTYPE, "float32")
    if role not in ("verify", "mtp"):
        raise InputError(f"{path}: not a graph of `export --speculative` (no {KEY_SPECULATIVE_ROLE} metadata)")
    if dtype not in BOUNDS:
        raise InputError(f"{path}: graph dtype {dtype!r}; the speculative graphs are fp32, fp16 or bf16")
    bound = BOUNDS[dtype] if default_bound is None else default_bound
    layout = read_layout(meta)
    cache, k = layout.cache_len, int(meta.get(KEY_SPECULATIVE_K, 0))
    # before the load: verify_inputs puts row b's past at b + 1, mtp_inputs at b + 2
    if role == "verify" and batch + k + 1 > cache:
        raise InputError(f"--batch {batch} rows of {k + 1} tokens at pasts 1 .. {batch} do not fit the "
                         f"graph's cache of {cache} slots; lower --batch")
    if role == "mtp" and batch + 1 >= cache:
        raise InputError(f"--batch {batch} rows at pasts 2 .. {batch + 1} do not fit the head's cache of "
                         f"{cache} slots; lower --batch")
    say(f"loading {checkpoint} in PyTorch ({dtype}, cpu)")
    model = load_checkpoint(checkpoint, dtype=getattr(torch, dtype))
    model.layout = layout
    rows, calls = [], [(1, seed), (batch, seed + 1)]
    if role == "verify":
        module = VerifyForm(model)
        make = lambda b, s: verify_inputs(model, k, batch=b, seed=s)  # noqa: E731
        name = lambda b: f"verify B{b} x {k + 1}"  # noqa: E731
    else:
        module = load_mtp(checkpoint, model)
        room = cache - batch - 1
        if seq > room:
            say(f"{room} head tokens a row (--prompt-len {seq} past the head's cache of {cache} slots)")
            seq = room
        make = lambda b, s: mtp_inputs(module, seq=1 if b == 1 else seq, batch=b, seed=s)  # noqa: E731
        name = lambda b: f"mtp B{b} x {1 if b == 1 else seq}"  # noqa: E731
    for b, s in calls:
        say(f"{name(b)} in ONNX Runtime and PyTorch")
        for output, error in compare_in_ort(path, module, make(b, s)).items():
            rows.append(Row(name(b), output, error, (bounds or {}).get(output, bound)))
    return rows


def format_rows(rows: list[Row]) -> str:
    """The table `validate` prints, and its verdict line."""
    width = max(len(r.output) for r in rows)
    lines = [f"{'call':<18} {'output':<{width}}  max err / max |ref|  bound     ok"]
    for r in rows:
        lines.append(f"{r.call:<18} {r.output:<{width}}  {r.error:<19.3e} {r.bound:<9.0e} {'ok' if r.ok else 'FAIL'}")
    bad = [r for r in rows if not r.ok]
    lines.append(f"PASS: {len(rows)} tensors within tolerance" if not bad else
                 f"FAIL: {len(bad)} of {len(rows)} tensors over tolerance, first {bad[0].output} ({bad[0].call})")
    return "\n".join(lines)
