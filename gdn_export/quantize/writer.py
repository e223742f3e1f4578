"""Write a quantized model as a checkpoint folder in ModelOpt's unified Hugging Face form.

    config.json          the source config plus quantization_config:
                         {"quant_method": "modelopt", "quant_algo": "FP8" | "W4A16_AWQ",
                          "config_groups": {...}, "ignore": [16-bit Linear modules, routed experts],
                          "producer": {...}}
    hf_quant_config.json {"producer": ..., "quantization": {"quant_algo", "kv_cache_quant_algo",
                          "exclude_modules", ("group_size", "has_zero_point", "pre_quant_scale")}}
    with an FP8 K/V cache (--kv-cache fp8): quantization_config kv_cache_scheme {"dynamic": false,
                         "num_bits": 8, "type": "float"} and kv_cache_quant_algo "FP8" (hf_quant_config.json
                         too), and per attention layer self_attn.k_proj.k_scale / self_attn.v_proj.v_scale
                         fp32 [] (amax / 448 of the cached K / V)
    model.safetensors    16-bit tensors as in the source; per quantized Linear:
                         FP8: weight float8_e4m3fn [out, in], weight_scale fp32 [out], input_scale fp32 []
                         W4A16_AWQ: weight uint8 [out/2, in] (ModelOpt's packing: output rows 2i and
                         2i+1 in the low / high nibble), weight_scale [out, in/128] and
                         pre_quant_scale [in] in the model dtype
                         quantized routed experts per expert under ModelOpt's / vLLM's keys
                         (mlp.experts.{e}.gate_proj|up_proj|down_proj.weight, .weight_scale and,
                         for FP8, .input_scale: gdn_export.quantize.experts.checkpoint_tensors)
    every other file of the source folder (tokenizer, generation config) copied as it is
    with a quantized lm_head (`quantize --quantize-lm-head`): lm_head.weight / weight_scale /
                         input_scale as any FP8 Linear, the 16-bit embedding table kept for the
                         lookup, and tie_word_embeddings false in config.json (the head is a tensor
                         of its own now; loaders that tie would drop it)

Written in a temporary folder beside OUT and renamed into place: OUT appears complete or not at all.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from gdn_export import __version__
from gdn_export.errors import GdnExportError
from gdn_export.paths import publish_dir, temp_dir_beside, usual_modes
from gdn_export.modules.quant_experts import QuantMoeExperts
from gdn_export.modules.quant_linear import Int4Linear, QuantLinear
from gdn_export.ops.quant_linear.naive import unpack_int4
from gdn_export.quantize.experts import checkpoint_tensors as expert_checkpoint_tensors
from gdn_export.weights.quant_format import pack_modelopt_int4
from gdn_export.weights.reader import INDEX_FILE, SINGLE_FILE

QUANT_ALGO = {"fp8": "FP8", "int4-awq": "W4A16_AWQ"}
_SKIP = {"config.json", SINGLE_FILE, INDEX_FILE, "hf_quant_config.json"}


def check_output(out: str | Path, overwrite: bool, source: str | Path) -> Path:
    """GdnExportError before any work when OUT cannot be written."""
    out, source = Path(out), Path(source)
    if out.resolve() == source.resolve():
        raise GdnExportError(f"-o {out}: is the source checkpoint itself")
    if out.exists() and not overwrite:
        raise GdnExportError(f"-o {out}: already exists (give --overwrite to replace it)")
    if out.exists() and not out.is_dir():
        raise GdnExportError(f"-o {out}: is a file, not a checkpoint folder")
    if not out.parent.is_dir():
        raise GdnExportError(f"-o {out}: folder {out.parent} does not exist")
    return out


def _has_quantized_experts(model: nn.Module) -> bool:
    return any(isinstance(m, QuantMoeExperts) for m in model.modules())


def _ignored(model: nn.Module, family, config) -> list[str]:
    names = []
    for name, m in model.named_modules():
        if type(m) is nn.Linear:
            names.append(family.checkpoint_name(f"{name}.weight", config)[: -len(".weight")])
    if config.num_experts and not _has_quantized_experts(model):
        names.append("*mlp.experts*")
    if config.mtp_num_hidden_layers:
        names.append("mtp*")  # the MTP head stays 16-bit (mtp_tensors)
    return sorted(names)


def mtp_tensors(source: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """{key: tensor in dtype} of the source checkpoint's multi-token-prediction head (`mtp.*`),
    carried over unquantized so that the quantized model keeps its draft head
    (gdn_export.runtime.speculative); {} without one."""
    from gdn_export.weights.mapping import MTP
    from gdn_export.weights.reader import CheckpointReader

    with CheckpointReader(source) as reader:
        return {key: reader.get(key).to(dtype).contiguous() for key in reader.shapes if MTP.search(key)}


def quantization_config(fmt: str, ignore: list[str], calibrator: str, group_size: int = 128) -> tuple[dict, dict]:
    """(config.json quantization_config, hf_quant_config.json) for fmt."""
    algo = QUANT_ALGO[fmt]
    producer = {"name": "gdn-export", "version": __version__, "calibration": calibrator}
    if fmt == "fp8":
        group = {"input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
                 "weights": {"dynamic": False, "num_bits": 8, "type": "float", "strategy": "channel"},
                 "targets": ["Linear"]}
        details = {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": ignore}
    else:
        group = {"weights": {"dynamic": False, "num_bits": 4, "type": "int", "group_size": group_size},
                 "targets": ["Linear"]}
        details = {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": ignore,
                   "group_size": group_size, "has_zero_point": False, "pre_quant_scale": True}
    qc = {"quant_method": "modelopt", "quant_algo": algo, "config_groups": {"group_0": group},
          "ignore": ignore, "producer": producer}
    return qc, {"producer": producer, "quantization": details}


def kv_scale_tensors(model: nn.Module, family, config) -> dict[str, torch.Tensor]:
    """{checkpoint key: fp32 [] tensor} of an FP8-cache model's k_scale / v_scale (under the attention
    module's k_proj / v_proj, as ModelOpt's unified export and vLLM name them); {} otherwise."""
    from gdn_export.modules.kv_cache_fp8 import kv_scales
    from gdn_export.weights.kv_scales import scale_keys

    scales = kv_scales(model)
    if scales is None:
        return {}
    keys = scale_keys(model, config, family)
    out = {}
    for i, (ks, vs) in scales.items():
        out[keys[i][0]] = torch.tensor(ks, dtype=torch.float32)
        out[keys[i][1]] = torch.tensor(vs, dtype=torch.float32)
    return out


def write_quantized(model: nn.Module, family, config, source: str | Path, out: str | Path, fmt: str,
                    calibrator: str, dtype: torch.dtype, overwrite: bool = False, progress=None) -> Path:
    """Write `model` (quantized Linears swapped in) as a checkpoint folder at `out`: folder 0777 and
    files 0666 & ~umask (0755 / 0644 under umask 022), assembled beside `out` and renamed into place;
    without overwrite, a folder that appeared at `out` meanwhile is kept and this is an OutputError."""
    say = progress or (lambda _m: None)
    source, out = Path(source), Path(out)
    raw = json.loads((source / "config.json").read_text(encoding="utf-8"))
    ignore = _ignored(model, family, config)
    qc, hf_qc = quantization_config(fmt, ignore, calibrator)
    kv = kv_scale_tensors(model, family, config)
    if kv:  # FP8 K/V cache: ModelOpt's config.json and hf_quant_config.json keys
        qc["kv_cache_scheme"] = {"dynamic": False, "num_bits": 8, "type": "float"}
        qc["kv_cache_quant_algo"] = hf_qc["quantization"]["kv_cache_quant_algo"] = "FP8"
    raw["quantization_config"] = qc
    head_quantized = isinstance(getattr(model, "lm_head", None), QuantLinear)
    if head_quantized:
        for section in (raw, raw.get("text_config")):
            if isinstance(section, dict) and section.get("tie_word_embeddings"):
                section["tie_word_embeddings"] = False

    tensors: dict[str, torch.Tensor] = {}
    int4 = {f"{n}.weight": m for n, m in model.named_modules() if isinstance(m, Int4Linear)}
    quant_buffers = {f"{n}.{b}" for n, m in model.named_modules() if isinstance(m, QuantLinear)
                     for b, _ in m.named_buffers(recurse=False)}
    expert_buffers = {f"{n}.{b}" for n, m in model.named_modules() if isinstance(m, QuantMoeExperts)
                      for b, _ in m.named_buffers(recurse=False)}
    tensors.update(expert_checkpoint_tensors(model, family, config))  # per expert, ModelOpt's keys
    for name, t in model.state_dict().items():
        if (config.tie_word_embeddings and name == "lm_head.weight" and not head_quantized) or name in expert_buffers:
            continue
        if name in int4:
            m = int4[name]
            t = pack_modelopt_int4(unpack_int4(t, m.in_features))
        elif name not in quant_buffers and t.is_floating_point():
            t = t.to(dtype)
        for key, part in family.checkpoint_tensors(name, t, config):
            tensors[key] = part.detach().contiguous().cpu()
    tensors.update(kv)
    tensors.update(mtp_tensors(source, dtype))

    tmp = temp_dir_beside(out, f"-o {out}")  # 0777 & ~umask, as every other output folder
    try:
        say(f"writing {len(tensors)} tensors to {out}")
        for f in source.iterdir():
            if f.is_file() and f.name not in _SKIP and not f.name.endswith(".safetensors"):
                shutil.copy2(f, tmp / f.name)
        (tmp / "config.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
        (tmp / "hf_quant_config.json").write_text(json.dumps(hf_qc, indent=4) + "\n", encoding="utf-8")
        save_file(tensors, str(tmp / SINGLE_FILE), metadata={"format": "pt"})
        usual_modes(tmp)  # safetensors writes 0600
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_dir(tmp, out, f"-o {out}", overwrite=overwrite)  # a folder that appeared meanwhile: kept
    return out
