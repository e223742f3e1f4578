"""Quantized checkpoints: config.json's `quantization_config`, checked and planned from the headers.

Two on-disk forms load:

* Published fine-grained FP8 (Qwen3-Next-*-FP8, Qwen3.5-*-FP8; transformers' finegrained_fp8):
  `{"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic",
  "modules_to_not_convert": [...]}`; each quantized Linear stores `weight` float8_e4m3fn [out, in]
  and `weight_scale_inv` [ceil(out/128), ceil(in/128)] (fp32 or bf16). Those Linears become
  `Fp8BlockLinear` (gdn::fp8_block_linear). Routed experts stored that way stay FP8 in memory
  (gdn_export.weights.quantized_experts -> gdn::moe_fp8).
* ModelOpt's unified Hugging Face form, which `gdn-export quantize` writes:
  `{"quant_method": "modelopt", "quant_algo": "FP8" | "W4A16_AWQ", "ignore": [...], ...}`.
  FP8: `weight` float8_e4m3fn [out, in], `weight_scale` fp32 [] or [out], `input_scale` fp32 []
  -> `Fp8Linear`. W4A16_AWQ: `weight` uint8 [out/2, in] (ModelOpt packs two output rows a byte),
  `weight_scale` [out, in/group] 16-bit, `pre_quant_scale` [in] -> `Int4Linear` (repacked two
  input columns a byte, the ONNX INT4 order, at load). Routed experts in either form stay quantized
  (gdn_export.weights.quantized_experts).

Every problem is a one-line CheckpointError naming the key, raised before any tensor data is read:
an unsupported quant_method / quant_algo / block size, float8 tensors without a quantization_config,
a missing or mis-shaped scale, a quantized tensor where gdn-export keeps 16 bits.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from gdn_export.errors import CheckpointError
from gdn_export.modules.quant_linear import Fp8BlockLinear, Fp8Linear, Int4Linear, swap_linear
from gdn_export.ops.quant_linear.naive import dequantize_block, pack_int4
from gdn_export.weights.mapping import Assembled, Plan, Source
from gdn_export.weights.quant_format import (BLOCK, F8, FP8, FP8_BLOCK, INT4_AWQ, MODELOPT_ALGOS,  # noqa: F401
                                             SCALE_DTYPES, need_tensor, pack_modelopt_int4, unpack_modelopt_int4)
from gdn_export.weights.quantized_experts import prepare_experts

_PER_EXPERT = re.compile(r"\.mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)\.weight$")


@dataclass
class QuantSpec:
    """What a checkpoint's quantization_config asks for."""

    format: str  # FP8_BLOCK, FP8 or INT4_AWQ
    exclude: list[str] = field(default_factory=list)  # modules_to_not_convert / ignore
    group_size: int = 128  # INT4_AWQ
    kv_cache: str | None = None  # "fp8" or None
    raw: dict = field(default_factory=dict)

    def excluded(self, module_key: str) -> bool:
        """module_key: a checkpoint module name (the key without .weight). transformers' rule: an
        entry excludes every module whose name contains it; ModelOpt's ignore entries may be globs."""
        for entry in self.exclude:
            if "*" in entry or "?" in entry:
                if re.fullmatch(re.escape(entry).replace(r"\*", ".*").replace(r"\?", "."), module_key):
                    return True
            elif entry and entry in module_key:
                return True
        return False


def read_quant_config(config_path: str | Path) -> dict | None:
    """config.json's quantization_config (a dict) or None."""
    try:
        if not stat.S_ISREG(os.stat(config_path).st_mode):
            return None  # a pipe would block: read_config names it
        raw = json.loads(Path(config_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
        return None  # read_config reports an unreadable config.json
    qc = raw.get("quantization_config") if isinstance(raw, dict) else None
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise CheckpointError(f"{config_path}: quantization_config must be an object")
    return qc


def parse_spec(qc: dict | None, where: str = "config.json") -> QuantSpec | None:
    """QuantSpec of a quantization_config, or CheckpointError naming what is not supported."""
    if qc is None:
        return None
    method = qc.get("quant_method")
    if method == "fp8":
        block = qc.get("weight_block_size")
        if block is None or list(block) != [BLOCK, BLOCK]:
            raise CheckpointError(f"{where}: quantization_config weight_block_size {block!r} is not supported "
                                  f"(gdn-export loads fine-grained FP8 with [128, 128] blocks)")
        scheme = qc.get("activation_scheme", "dynamic")
        if scheme != "dynamic":
            raise CheckpointError(f"{where}: quantization_config activation_scheme {scheme!r} is not supported "
                                  f"for quant_method fp8 (only 'dynamic')")
        fmt = qc.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise CheckpointError(f"{where}: quantization_config fmt {fmt!r} is not supported (only e4m3)")
        return QuantSpec(FP8_BLOCK, exclude=list(qc.get("modules_to_not_convert") or []), raw=qc)
    if method == "modelopt":
        algo = qc.get("quant_algo")
        if algo not in MODELOPT_ALGOS:
            raise CheckpointError(f"{where}: quantization_config quant_algo {algo!r} is not supported "
                                  f"(gdn-export loads {', '.join(MODELOPT_ALGOS)})")
        group = 128
        for g in (qc.get("config_groups") or {}).values():
            group = int((g.get("weights") or {}).get("group_size") or group)
        kv = qc.get("kv_cache_scheme", qc.get("kv_cache_quant_algo"))  # ModelOpt's config.json / hf_quant_config form
        kv_cache = None
        if kv is not None:
            if not (isinstance(kv, dict) and kv.get("num_bits") == 8 and kv.get("type") == "float") and kv != "FP8":
                raise CheckpointError(f"{where}: quantization_config kv_cache_scheme {kv!r} is not supported "
                                      f"(only FP8)")
            kv_cache = "fp8"
        return QuantSpec(MODELOPT_ALGOS[algo], exclude=list(qc.get("ignore") or []), group_size=group,
                         kv_cache=kv_cache, raw=qc)
    raise CheckpointError(f"{where}: quantization_config quant_method {method!r} is not supported "
                          f"(gdn-export loads 'fp8' with [128, 128] blocks and 'modelopt' FP8 / W4A16_AWQ)")


def _repack_int4(packed: torch.Tensor) -> torch.Tensor:
    return pack_int4(unpack_modelopt_int4(packed))


@dataclass(frozen=True)
class DequantAssembled(Assembled):
    """Stacked experts from per-expert fine-grained FP8 tensors: each piece dequantized with its
    weight_scale_inv (`scales`: (weight key, scale key) pairs) into the 16-bit stacked tensor."""

    scales: tuple[tuple[str, str], ...] = ()

    def load(self, reader, read, dtype, device) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=dtype, device=device)
        scale_of = dict(self.scales)
        for key, index in self.pieces:
            if key in scale_of:
                piece = dequantize_block(reader.get(key), reader.get(scale_of[key]))
            else:
                piece = reader.get(key)
            out[index].copy_(piece)
        return out


@dataclass
class Prepared:
    """What `prepare` decided: checkpoint keys that only quantized modules read (`consumed`, kept
    from the generic plan), module tensors planned here (`sources`), fp8 expert weights to
    dequantize (`expert_scales`: weight key -> scale key)."""

    spec: QuantSpec | None
    consumed: set[str] = field(default_factory=set)
    sources: dict[str, Source] = field(default_factory=dict)
    expert_scales: dict[str, str] = field(default_factory=dict)

    def shapes(self, shapes: dict) -> dict:
        return {k: v for k, v in shapes.items() if k not in self.consumed}

    def expected(self, expected: dict) -> dict:
        return {k: v for k, v in expected.items() if k not in self.sources}

    def finish(self, plan: Plan) -> None:
        """Add the quantized modules' sources and turn fp8 expert stacks into dequantizing ones."""
        plan.sources.update(self.sources)
        for name, source in list(plan.sources.items()):
            if isinstance(source, Assembled) and any(k in self.expert_scales for k, _ in source.pieces):
                plan.sources[name] = DequantAssembled(
                    source.key, shape=source.shape, pieces=source.pieces,
                    scales=tuple((k, self.expert_scales[k]) for k, _ in source.pieces if k in self.expert_scales))
        if self.spec is not None:
            n = sum(1 for n in self.sources if n.endswith(".weight"))
            plan.notes.append(f"{n} quantized Linear layers ({self.spec.format})"
                              + (f", {len(self.expert_scales)} fp8 expert tensors dequantized to 16 bits"
                                 if self.expert_scales else ""))


def _linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear]


def prepare(model: nn.Module, config, family, spec: QuantSpec | None, reader) -> Prepared:
    """Check the checkpoint's quantized tensors against `spec` and swap the quantized Linears of the
    meta-device `model` for their quantized modules. CheckpointError names the key on any mismatch."""
    out = Prepared(spec)
    fp8_keys = {k for k, d in reader.dtypes.items() if d == F8}
    if spec is None:
        if fp8_keys:
            key = sorted(fp8_keys)[0]
            raise CheckpointError(f"tensor {key} is stored as F8_E4M3 (float8_e4m3fn), which the model cannot "
                                  f"take without a quantization_config in config.json (its scales would be ignored)")
        return out
    dtype = model.model.embed_tokens.weight.dtype if hasattr(model, "model") else torch.bfloat16
    expert_sources, handled = prepare_experts(model, config, family, spec, reader)
    out.sources.update(expert_sources)  # routed experts kept quantized (weights/quantized_experts.py)
    out.consumed.update(handled)
    for name, linear in _linears(model):
        key = family.checkpoint_name(f"{name}.weight", config)
        base = key[: -len("weight")]
        if key not in reader.shapes:
            continue  # the generic plan reports the missing tensor
        N, K = linear.out_features, linear.in_features
        bias = linear.bias is not None
        if spec.format == FP8_BLOCK:
            scale_key = base + "weight_scale_inv"
            if reader.dtypes[key] != F8:
                if scale_key in reader.shapes:
                    raise CheckpointError(f"tensor {scale_key} is present but {key} is {reader.dtypes[key]}, "
                                          f"not float8_e4m3fn")
                continue
            if spec.excluded(base[:-1]):
                raise CheckpointError(f"tensor {key} is float8_e4m3fn but quantization_config "
                                      f"modules_to_not_convert lists its module")
            need_tensor(reader, key, (F8,), (N, K), "fine-grained FP8 weight")
            need_tensor(reader, scale_key, SCALE_DTYPES, (-(-N // BLOCK), -(-K // BLOCK)),
                        "[ceil(out/128), ceil(in/128)] block scales of " + key)
            module = Fp8BlockLinear(K, N, device="meta")
            out.sources[f"{name}.weight_scale_inv"] = Source(scale_key)
            keys = (key, scale_key)
        else:
            scale_key = base + "weight_scale"
            if scale_key not in reader.shapes:
                if reader.dtypes[key] in (F8, "U8", "I8"):
                    raise CheckpointError(f"tensor {scale_key} is missing from the checkpoint "
                                          f"({key} is {reader.dtypes[key]})")
                continue
            if spec.excluded(base[:-1]):
                raise CheckpointError(f"tensor {scale_key} is present but quantization_config ignore lists "
                                      f"its module")
            if spec.format == FP8:
                need_tensor(reader, key, (F8,), (N, K), "ModelOpt FP8 weight")
                got = tuple(reader.shapes[scale_key])
                if got not in ((), (1,), (N,)):
                    raise CheckpointError(f"tensor {scale_key} has shape {got} in the checkpoint, expected () "
                                          f"(per tensor) or ({N},) (per channel)")
                need_tensor(reader, scale_key, SCALE_DTYPES, None, "weight scale")
                need_tensor(reader, base + "input_scale", SCALE_DTYPES, None, "static activation scale of " + key)
                if tuple(reader.shapes[base + "input_scale"]) not in ((), (1,)):
                    raise CheckpointError(f"tensor {base}input_scale has shape "
                                          f"{tuple(reader.shapes[base + 'input_scale'])}, expected () (per tensor)")
                module = Fp8Linear(K, N, device="meta")
                out.sources[f"{name}.weight_scale"] = Source(scale_key, select=lambda t, N=N: t.float().reshape(-1).expand(N))
                out.sources[f"{name}.input_scale"] = Source(base + "input_scale", select=lambda t: t.reshape(()))
                keys = (key, scale_key, base + "input_scale")
            else:
                G = spec.group_size
                if N % 2:
                    raise CheckpointError(f"tensor {key}: W4A16_AWQ needs an even number of rows, module has {N}")
                need_tensor(reader, key, ("U8", "I8"), (N // 2, K), "ModelOpt W4A16_AWQ packed weight")
                need_tensor(reader, scale_key, SCALE_DTYPES, (N, -(-K // G)), f"group-{G} weight scales")
                pre = base + "pre_quant_scale"
                has_pre = pre in reader.shapes
                if has_pre:
                    need_tensor(reader, pre, SCALE_DTYPES, (K,), "AWQ pre_quant_scale")
                module = Int4Linear(K, N, G, dtype=dtype, pre_quant_scale=has_pre, device="meta")
                out.sources[f"{name}.weight_scale"] = Source(scale_key)
                if has_pre:
                    out.sources[f"{name}.pre_quant_scale"] = Source(pre)
                keys = (key, scale_key) + ((pre,) if has_pre else ())
        if bias:
            module.register_buffer("bias", torch.empty(N, device="meta"))
            if base + "bias" not in reader.shapes:
                raise CheckpointError(f"tensor {base}bias is missing from the checkpoint")
            out.sources[f"{name}.bias"] = Source(base + "bias")
            keys += (base + "bias",)
        select = _repack_int4 if spec.format == INT4_AWQ else None
        out.sources[f"{name}.weight"] = Source(key, select=select)
        swap_linear(model, name, module)
        out.consumed.update(keys)
        handled.update(keys)
    if spec.format == FP8_BLOCK:
        for key in sorted(fp8_keys - handled):
            if _PER_EXPERT.search(key):
                scale_key = key[: -len("weight")] + "weight_scale_inv"
                rows, cols = reader.shapes[key]
                need_tensor(reader, scale_key, SCALE_DTYPES, (-(-rows // BLOCK), -(-cols // BLOCK)),
                            "[ceil(out/128), ceil(in/128)] block scales of " + key)
                out.expert_scales[key] = scale_key
                out.consumed.add(scale_key)
                handled.update((key, scale_key))
        stray = sorted(k for k in reader.shapes if k.endswith(".weight_scale_inv") and k not in handled)
        if stray:
            raise CheckpointError(f"tensor {stray[0]} scales no float8_e4m3fn weight gdn-export quantizes")
    left = sorted(fp8_keys - handled)
    if left:
        raise CheckpointError(f"tensor {left[0]} is float8_e4m3fn, but gdn-export keeps that tensor in 16 bits "
                              f"(quantized Linear layers only)")
    if spec.format != FP8_BLOCK:
        stray = sorted(k for k in reader.shapes if k.endswith((".weight_scale", ".input_scale", ".pre_quant_scale"))
                       and k not in handled)
        if stray:
            raise CheckpointError(f"tensor {stray[0]} belongs to no Linear layer gdn-export quantizes")
    return out
