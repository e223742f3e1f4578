"""Quantized routed experts in a checkpoint, kept quantized in memory (gdn_export.modules.quant_experts).

Per-expert tensors, as published and as ModelOpt / vLLM write them
(`{layer}.mlp.experts.{e}.gate_proj|up_proj|down_proj.` + ...):

    fine-grained FP8 (quant_method fp8)   weight F8_E4M3 [out, in], weight_scale_inv [ceil(out/128),
                                          ceil(in/128)] (fp32 / bf16) -> Fp8MoeExperts "fp8-block128":
                                          the 128 x 128 block scales kept, each block row repeated over
                                          its rows (gate and up stack into one [2I, H] matrix whose
                                          blocks no longer line up when I % 128 != 0); weights bit-exact
    ModelOpt FP8                          weight F8_E4M3 [out, in], weight_scale fp32 [] or [out],
                                          input_scale fp32 [] -> Fp8MoeExperts "fp8" (gate_up's input
                                          scale: the larger of gate_proj's and up_proj's, which quantize
                                          the same activations)
    ModelOpt W4A16_AWQ                    weight uint8 [out/2, in] (two output rows a byte),
                                          weight_scale [out, ceil(in/group)] -> Int4MoeExperts (repacked
                                          to the ONNX INT4 order); an expert pre_quant_scale is refused
                                          (no place for a per-expert activation scale in the MoE op)

A layer whose experts are stored in 16 bits stays a 16-bit MoeExperts. Every mismatch is a one-line
CheckpointError naming the key, from the headers alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from gdn_export.errors import CheckpointError
from gdn_export.modules.mlp import MoeExperts
from gdn_export.modules.quant_experts import Fp8MoeExperts, Int4MoeExperts, swap_experts
from gdn_export.ops.quant_linear.naive import pack_int4
from gdn_export.weights.mapping import Source
from gdn_export.weights.quant_format import (BLOCK, F8, FP8, FP8_BLOCK, SCALE_DTYPES, need_tensor,
                                             unpack_modelopt_int4)

PROJS = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ExpertPieces(Source):
    """A stacked expert buffer of `shape` built piece by piece: out[index] = fn(*tensors of keys) for
    each (keys, index, fn) of `pieces`; `dtype` None = the dtype the loader asks for."""

    shape: tuple[int, ...] = ()
    dtype: torch.dtype | None = None
    pieces: tuple[tuple[tuple[str, ...], tuple, Callable], ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k for keys, _, _ in self.pieces for k in keys)

    def load(self, reader, read, dtype, device) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=self.dtype or dtype, device=device)
        for keys, index, fn in self.pieces:
            out[index] = fn(*(reader.get(k) for k in keys)).to(device=device, dtype=out.dtype)
        return out


def _rows_of_blocks(rows: int):
    return lambda s: s.float().repeat_interleave(BLOCK, 0)[:rows]


def _per_channel(rows: int):
    return lambda s: s.float().reshape(-1).expand(rows).reshape(rows, 1)


def _repack(K: int):
    return lambda w: pack_int4(unpack_modelopt_int4(w)[:, :K])


def prepare_experts(model: nn.Module, config, family, spec, reader) -> tuple[dict[str, Source], set[str]]:
    """Swap every MoeExperts of the meta-device `model` whose checkpoint experts are quantized for its
    quantized holder; returns ({module tensor name: source}, checkpoint keys consumed). spec: the
    checkpoint's gdn_export.weights.quantized.QuantSpec."""
    sources: dict[str, Source] = {}
    consumed: set[str] = set()
    dtype = model.model.embed_tokens.weight.dtype if hasattr(model, "model") else torch.bfloat16
    for name, m in [(n, m) for n, m in model.named_modules() if isinstance(m, MoeExperts)]:
        E, I, H = m.num_experts, m.intermediate_size, m.gate_up_proj.shape[2]
        prefix = family.checkpoint_name(f"{name}.gate_up_proj", config)[: -len("gate_up_proj")]
        first = f"{prefix}0.gate_proj.weight"
        if first not in reader.shapes or reader.dtypes[first] not in (F8, "U8", "I8"):
            continue  # stacked or 16-bit experts: the generic plan
        if spec.excluded(f"{prefix}0.gate_proj"):
            raise CheckpointError(f"tensor {first} is {reader.dtypes[first]} but quantization_config's "
                                  f"exclusions list its module")
        dims = {"gate_proj": (I, H), "up_proj": (I, H), "down_proj": (H, I)}
        rows_of = {"gate_proj": (slice(0, I),), "up_proj": (slice(I, 2 * I),), "down_proj": ()}
        stack = {"gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj"}
        pieces: dict[str, list] = {}
        if spec.format == FP8_BLOCK:
            module = Fp8MoeExperts(E, H, I, "fp8-block128", device="meta")
        elif spec.format == FP8:
            module = Fp8MoeExperts(E, H, I, "fp8", device="meta")
        else:
            module = Int4MoeExperts(E, H, I, spec.group_size, dtype=dtype, device="meta")
        for e in range(E):
            for proj in PROJS:
                N, K = dims[proj]
                base = f"{prefix}{e}.{proj}."
                w, buf = base + "weight", stack[proj]
                idx = (e, *rows_of[proj])
                if spec.format in (FP8_BLOCK, FP8):
                    need_tensor(reader, w, (F8,), (N, K), f"FP8 weight of expert {e}")
                    pieces.setdefault(buf, []).append(((w,), idx, lambda t: t))
                    if spec.format == FP8_BLOCK:
                        s = base + "weight_scale_inv"
                        need_tensor(reader, s, SCALE_DTYPES, (-(-N // BLOCK), -(-K // BLOCK)),
                                    "[ceil(out/128), ceil(in/128)] block scales of " + w)
                        pieces.setdefault(buf + "_weight_scale", []).append(((s,), idx, _rows_of_blocks(N)))
                    else:
                        s = base + "weight_scale"
                        need_tensor(reader, s, SCALE_DTYPES, None, "weight scale of " + w)
                        if tuple(reader.shapes[s]) not in ((), (1,), (N,)):
                            raise CheckpointError(f"tensor {s} has shape {tuple(reader.shapes[s])} in the checkpoint, "
                                                  f"expected () (per tensor) or ({N},) (per channel)")
                        pieces.setdefault(buf + "_weight_scale", []).append(((s,), idx, _per_channel(N)))
                        a = base + "input_scale"
                        need_tensor(reader, a, SCALE_DTYPES, None, "static activation scale of " + w)
                        if tuple(reader.shapes[a]) not in ((), (1,)):
                            raise CheckpointError(f"tensor {a} has shape {tuple(reader.shapes[a])}, "
                                                  f"expected () (per tensor)")
                        consumed.add(a)
                else:
                    G = spec.group_size
                    if N % 2:
                        raise CheckpointError(f"tensor {w}: W4A16_AWQ needs an even number of rows, expert has {N}")
                    need_tensor(reader, w, ("U8", "I8"), (N // 2, K), f"ModelOpt W4A16_AWQ packed weight of expert {e}")
                    s = base + "weight_scale"
                    need_tensor(reader, s, SCALE_DTYPES, (N, -(-K // G)), f"group-{G} weight scales of " + w)
                    if base + "pre_quant_scale" in reader.shapes:
                        raise CheckpointError(f"tensor {base}pre_quant_scale: an AWQ pre-scale on routed experts "
                                              f"is not supported (the MoE op has no per-expert activation scale)")
                    pieces.setdefault(buf, []).append(((w,), idx, _repack(K)))
                    pieces.setdefault(buf + "_weight_scale", []).append(((s,), idx, lambda t: t))
                consumed.update((w, s))
            if spec.format == FP8:  # one input scale per projection input: gate_up's = max(gate, up)
                g, u, d = (f"{prefix}{e}.{p}.input_scale" for p in PROJS)
                pieces.setdefault("gate_up_proj_input_scale", []).append(
                    ((g, u), (e,), lambda a, b: torch.maximum(a.float().reshape(()), b.float().reshape(()))))
                pieces.setdefault("down_proj_input_scale", []).append(((d,), (e,), lambda a: a.float().reshape(())))
        for buf, ps in pieces.items():
            t = getattr(module, buf)
            fixed = None if isinstance(module, Int4MoeExperts) and buf.endswith("_scale") else t.dtype
            sources[f"{name}.{buf}"] = ExpertPieces(ps[0][0][0], shape=tuple(t.shape), dtype=fixed, pieces=tuple(ps))
        swap_experts(model, name, module)
    return sources, consumed
