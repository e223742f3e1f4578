"""quantize_checkpoint: checks, calibration data, ModelOpt calibration, the quantized folder; and
quantize_model for an in-memory model (bench --quant)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from gdn_export.errors import GdnExportError
from gdn_export.hf_config import read_config
from gdn_export.quantize import FORMATS
from gdn_export.quantize.calib_data import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN, load_calibration
from gdn_export.weights.quantized import read_quant_config


def check_not_quantized(checkpoint: Path) -> None:
    qc = read_quant_config(checkpoint / "config.json")
    if qc is not None:
        raise GdnExportError(f"{checkpoint}: is already quantized (quantization_config quant_method "
                             f"{qc.get('quant_method')!r}); quantize a 16-bit checkpoint")


def quantize_model(model, checkpoint: Path, fmt: str, calib_data=None, samples: int = DEFAULT_SAMPLES,
                   seq_len: int = DEFAULT_SEQ_LEN, progress=None, rows=None, kv_cache: str | None = None,
                   lm_head: bool = False):
    """Calibrate on an fp32 copy of checkpoint's weights, on model's device, and swap the quantized
    Linears and routed experts into `model` (a 16-bit HybridForCausalLM of that checkpoint);
    kv_cache "fp8" also calibrates the attention layers' K/V cache scales in the same pass
    (gdn_export.quantize.kv_calib) and sets them on `model`; lm_head (fp8): the vocabulary projection
    quantized too (a tied embedding keeps its 16-bit table). Returns (model, calibrator name)."""
    from gdn_export.modules.kv_cache_fp8 import set_kv_scales
    from gdn_export.quantize.calibrate import apply, calibrate, modelopt_version
    from gdn_export.quantize.experts import apply_experts, check_experts, quantize_experts, recording
    from gdn_export.quantize.kv_calib import record_kv_amax, scales_from_amax
    from gdn_export.weights import load_checkpoint

    say = progress or (lambda _m: None)
    check_experts(model.config, fmt)
    check_lm_head(lm_head, fmt)
    if rows is None:
        rows, _ = load_calibration(calib_data, checkpoint, model.config.vocab_size, samples, seq_len, say)
    version = modelopt_version()
    say("loading an fp32 copy for calibration")
    calib_model = load_checkpoint(checkpoint, dtype=torch.float32, device=next(model.parameters()).device)
    with recording(calib_model) as expert_stats, \
            (record_kv_amax(calib_model) if kv_cache else contextlib.nullcontext()) as amax:
        tensors = calibrate(calib_model, fmt, rows, say, lm_head=lm_head)
    if not tensors:
        raise GdnExportError(f"{checkpoint}: no Linear layer to quantize")
    say(f"{len(tensors)} Linear layers quantized ({fmt})")
    experts = quantize_experts(calib_model, fmt, expert_stats, model.dtype, say)
    del calib_model
    model = apply_experts(apply(model, fmt, tensors), fmt, experts)
    if kv_cache:
        scales = scales_from_amax(amax)
        set_kv_scales(model, scales)
        say(f"FP8 K/V cache: {len(scales)} attention layers, k_scale "
            f"{min(s[0] for s in scales.values()):.3g}..{max(s[0] for s in scales.values()):.3g}, v_scale "
            f"{min(s[1] for s in scales.values()):.3g}..{max(s[1] for s in scales.values()):.3g}")
    return model, f"modelopt {version}"


def quantize_checkpoint(checkpoint, out, fmt: str, *, calib_data=None, samples: int = DEFAULT_SAMPLES,
                        seq_len: int = DEFAULT_SEQ_LEN, overwrite: bool = False, progress=None,
                        device: str | torch.device = "cpu", kv_cache: str | None = None,
                        lm_head: bool = False) -> Path:
    """Write the fmt-quantized form of the 16-bit `checkpoint` folder to `out`, calibrating on
    `device` (the gdn ops through the active op backend; "reference" by default; kv_cache "fp8":
    with FP8 K/V cache scales); every check (format, K/V cache format and attention layers, already
    quantized, experts, OUT, calibration data, ModelOpt present) before the model is loaded."""
    from gdn_export.quantize.calibrate import modelopt_version
    from gdn_export.quantize.experts import check_experts
    from gdn_export.quantize.writer import check_output, write_quantized
    from gdn_export.weights import load_checkpoint
    from gdn_export.weights.loader import FAMILIES

    say = progress or (lambda _m: None)
    checkpoint = Path(checkpoint)
    if fmt not in FORMATS:
        raise GdnExportError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    config = read_config(checkpoint / "config.json")
    check_kv_cache(kv_cache, config)
    check_lm_head(lm_head, fmt)
    check_not_quantized(checkpoint)
    check_experts(config, fmt)
    out = check_output(out, overwrite, checkpoint)
    rows, _ = load_calibration(calib_data, checkpoint, config.vocab_size, samples, seq_len, say)
    say("importing ModelOpt")
    modelopt_version()  # ModelOpt missing: said before the load
    say(f"loading {checkpoint} ({config.torch_dtype}, {device})")
    model = load_checkpoint(checkpoint, device=device)
    model, calibrator = quantize_model(model, checkpoint, fmt, progress=say, rows=rows, kv_cache=kv_cache,
                                       lm_head=lm_head)
    return write_quantized(model, FAMILIES[config.family], config, checkpoint, out, fmt, calibrator,
                           config.torch_dtype, overwrite=overwrite, progress=say)


KV_CACHE_FORMATS = ("fp8",)
LM_HEAD_FORMATS = ("fp8",)


def check_lm_head(lm_head: bool, fmt: str) -> None:
    """GdnExportError when the lm_head is to be quantized in a format that does not take it."""
    if lm_head and fmt not in LM_HEAD_FORMATS:
        raise GdnExportError(f"--quantize-lm-head applies to --format {' / '.join(LM_HEAD_FORMATS)}, not {fmt}")


def check_kv_cache(kv_cache: str | None, config) -> None:
    """GdnExportError unless kv_cache is None or a format we store, for a model with attention layers."""
    if kv_cache is None:
        return
    if kv_cache not in KV_CACHE_FORMATS:
        raise GdnExportError(f"--kv-cache {kv_cache!r} is not one of {', '.join(KV_CACHE_FORMATS)}")
    from gdn_export.config import LINEAR

    if all(kind == LINEAR for kind in config.layer_kinds):
        raise GdnExportError(f"--kv-cache {kv_cache}: the model has no attention layers (no K/V cache to quantize)")
