"""Test helpers: turn a tiny 16-bit checkpoint into Qwen's published fine-grained FP8 layout.

Each quantized Linear's `weight` [out, in] becomes float8_e4m3fn with `weight_scale_inv`
[ceil(out/128), ceil(in/128)] beside it (scale = block amax / 448, as Qwen's and DeepSeek's
converters do); config.json gets quantization_config {"quant_method": "fp8", "activation_scheme":
"dynamic", "weight_block_size": [128, 128], "modules_to_not_convert": [every other Linear]}.
Written independently of gdn_export's loader (numpy-free torch, block loop).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

QUANTIZED = re.compile(r"\.(q_proj|k_proj|v_proj|o_proj|g_proj|in_proj_qkvz|in_proj_qkv|in_proj_z|out_proj|"
                       r"gate_proj|up_proj|down_proj)\.weight$")
EXPERT = re.compile(r"\.experts\.\d+\.")


def block_quantize(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (fp8 [N, K], scale_inv fp32 [ceil(N/b), ceil(K/b)]), block by block."""
    N, K = w.shape
    q = torch.empty(N, K, dtype=torch.float8_e4m3fn)
    s = torch.empty(-(-N // block), -(-K // block))
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            tile = w[i * block:(i + 1) * block, j * block:(j + 1) * block].float()
            s[i, j] = tile.abs().max().clamp(min=1e-12) / 448
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = (tile / s[i, j]).to(torch.float8_e4m3fn)
    return q, s


def dequantize(q: torch.Tensor, s: torch.Tensor, block: int = 128) -> torch.Tensor:
    N, K = q.shape
    out = torch.empty(N, K)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            sl = (slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block))
            out[sl] = q[sl].float() * s[i, j]
    return out


def to_published_fp8(src: Path, fp8_dir: Path, dequant_dir: Path | None = None, *, scale_dtype=torch.float32,
                     experts: bool = True) -> list[str]:
    """Write the FP8 checkpoint to fp8_dir (and the same weights dequantized to fp32 in dequant_dir).
    Returns the quantized module keys (without .weight)."""
    tensors = load_file(str(src / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    fp8, deq, quantized, keep = {}, {}, [], []
    for key, t in tensors.items():
        if QUANTIZED.search(key) and t.dim() == 2 and (experts or not EXPERT.search(key)):
            q, s = block_quantize(t)
            fp8[key], fp8[key[:-len("weight")] + "weight_scale_inv"] = q, s.to(scale_dtype)
            deq[key] = dequantize(q, s.to(scale_dtype).float())
            quantized.append(key[:-len(".weight")])
        else:
            fp8[key] = deq[key] = t
            if t.dim() == 2 and key.endswith(".weight") and "embed_tokens" not in key:
                keep.append(key[:-len(".weight")])
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                  "weight_block_size": [128, 128], "modules_to_not_convert": sorted(keep)}
    for folder, weights, config in ((fp8_dir, fp8, cfg), (dequant_dir, deq, None)):
        if folder is None:
            continue
        folder.mkdir(parents=True)
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        if config is None:
            config = {k: v for k, v in cfg.items() if k != "quantization_config"}
        (folder / "config.json").write_text(json.dumps(config, indent=2))
    return quantized


def rewrite(folder: Path, edit_config=None, edit_tensors=None) -> None:
    """Edit a checkpoint in place (for the bad-input tests)."""
    if edit_config is not None:
        cfg = json.loads((folder / "config.json").read_text())
        edit_config(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
    if edit_tensors is not None:
        tensors = load_file(str(folder / "model.safetensors"))
        edit_tensors(tensors)
        save_file(tensors, str(folder / "model.safetensors"))


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
