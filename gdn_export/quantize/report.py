"""What `validate` adds for a quantized checkpoint, in two parts with their own tolerances:

1. the export's parity (ONNX Runtime / TensorRT vs PyTorch): the PyTorch reference runs the exported
   graph's arithmetic (`match_graph_form`), and the rows are held to the dtype's tolerance
   (gdn_export.validate.compare.default_tolerances), with one named exception (`rounding_step`);
2. the quantization's cost: the quantized model's logits against the 16-bit checkpoint it was made
   from (--baseline) or its own weights dequantized, a relative RMS held to the format's bound
   (`DISTANCE_BOUNDS`, or validate's --quant-tol) (`quantization_distance`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdn_export.modules.quant_experts import Fp8MoeExperts
from gdn_export.modules.quant_linear import Fp8BlockLinear, quantized_formats

# The one rounding-step bound of static FP8 activations (format "fp8"), per graph dtype. ONNX
# Runtime and PyTorch sum in other orders (1e-7 relative apart), so an activation sitting on an e4m3
# rounding boundary can round one step (2^-3 relative) apart, and the step propagates through the
# layers and the states. Measured on the tiny qwen3_5 (hidden 192) at validate's defaults: fp32
# graphs agree to 1.7e-6 on 5 of 8 seeds, and on the other 3 a flip moves them by up to 0.054 here
# (0.19 abs / 0.063 rel over 4 other seeds); 16-bit graphs flip on every seed measured (x is rounded
# to 16 bits before it is quantized): bf16 max abs 0.19 over 4 seeds, fp16 0.86 abs / 0.28 rel. int4-awq and fp8-block128 graphs keep
# 16-bit activations: no step, the dtype's tolerance alone (measured max abs 3e-6 in fp32).
STEP_TOLERANCES = {"float32": (0.3, 0.1), "16bit": (1.0, 0.3)}
STEP_NOTE = "one e4m3 rounding step"
# validate's default bound of the quantized model's logits relative RMS against its 16-bit self
# (--quant-tol): tiny random checkpoints, whose random weights amplify rounding, measured fp8
# 0.05-0.45 and int4-awq 0.5-1.04 (tests/quantize/test_calibrate.py); trained checkpoints sit far
# below. A bound catches a broken quantization (a wrong scale, a swapped layout), not a poor one.
DISTANCE_BOUNDS = {"fp8": 0.6, "fp8-block128": 0.6, "int4-awq": 1.5}
DISTANCE_STEPS = 32
DISTANCE_PROMPT = 32


def match_graph_form(model, progress=None) -> None:
    """Published FP8 (128 x 128 blocks) exports with 16-bit activations: run the PyTorch reference
    the same way, so that validate compares like with like (the activation rounding the PyTorch op
    adds is reported by `quantization_distance`' counterpart in docs/quantization.md, not hidden in
    tolerances)."""
    blocks = [m for m in model.modules() if isinstance(m, Fp8BlockLinear)]
    for m in blocks:
        m.activations = "16bit"
    if blocks and progress:
        progress(f"{len(blocks)} fine-grained FP8 layers: the PyTorch reference keeps activations in 16 bits, "
                 f"as the exported graph does")
    experts = [m for m in model.modules() if isinstance(m, Fp8MoeExperts) and m.FORMAT == "fp8"]
    for m in experts:
        m.activations = "16bit"
    if experts and progress:
        progress(f"{len(experts)} FP8 routed-expert layers: the PyTorch reference keeps their activations in "
                 f"16 bits, as the exported graph does (gdn.MoE takes no per-expert activation scale)")


@dataclass
class Distance:
    """The quantized model against its 16-bit self (module docstring, part 2)."""

    formats: list[str]
    against: str  # "the 16-bit CHECKPOINT" or "the same weights dequantized to 16 bits"
    logits_rel_rms: float
    greedy_agreement: float
    steps: int
    seed: int
    bound: float

    @property
    def passed(self) -> bool:
        return self.logits_rel_rms <= self.bound

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{verdict}: quantization ({', '.join(self.formats)}) vs {self.against}: logits relative RMS "
                f"{self.logits_rel_rms:.3e} (bound {self.bound:g}), greedy agreement {self.greedy_agreement:.3f} "
                f"over {self.steps} steps (random prompt, seed {self.seed})")


def distance_bound(formats) -> float:
    """The default --quant-tol of a model whose quantized layers have `formats` (the loosest)."""
    return max(DISTANCE_BOUNDS.get(f, max(DISTANCE_BOUNDS.values())) for f in formats)


def quantization_distance(model, seed: int = 0, progress=None, baseline=None, bound: float | None = None) -> Distance | None:
    """The quantized model against the 16-bit checkpoint `baseline` (a folder) or, without one, its
    own weights dequantized to 16 bits (which shows the activation rounding only: ~0 for weight-only
    int4-awq): logits relative RMS over DISTANCE_STEPS greedy steps of a random prompt, held to
    `bound` (default `distance_bound`). None for a 16-bit model."""
    formats = quantized_formats(model)
    if not formats:
        return None
    from gdn_export.quantize.accuracy import compare, dequantized_copy

    if progress:
        progress(f"measuring the quantized model against its 16-bit (dequantized) copy, {DISTANCE_STEPS} greedy steps")
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (1, DISTANCE_PROMPT), generator=gen).to(model.device)
    saved = {m: m.activations for m in model.modules() if isinstance(m, Fp8BlockLinear)}
    for m in saved:
        m.activations = "dynamic"  # the checkpoint's own arithmetic
    saved.update({m: m.activations for m in model.modules() if isinstance(m, Fp8MoeExperts)})
    for m in model.modules():
        if isinstance(m, Fp8MoeExperts):
            m.activations = "static"
    if baseline is not None:
        from gdn_export.weights import load_checkpoint

        other, what = load_checkpoint(baseline, dtype=model.dtype, device=model.device), f"the 16-bit {baseline}"
        if other.config.vocab_size != model.config.vocab_size:
            from gdn_export.errors import InputError

            raise InputError(f"--baseline {baseline}: vocab size {other.config.vocab_size}, the quantized "
                             f"model {model.config.vocab_size}; is it the checkpoint it was quantized from?")
    else:
        other, what = dequantized_copy(model), "the same weights dequantized to 16 bits"
    try:
        r = compare(model, other, prompt, DISTANCE_STEPS)
    finally:
        for m, a in saved.items():
            m.activations = a
    return Distance(sorted(formats), what, r["logits_rel_rms"], r["greedy_agreement"], DISTANCE_STEPS, seed,
                    distance_bound(formats) if bound is None else bound)


def rounding_step(runner) -> tuple[float, float] | None:
    """The (atol, rtol) of one e4m3 rounding step (STEP_TOLERANCES) when the runner's graph has static
    FP8 activations (metadata gdn_export.quantization holds "fp8"), else None: the second bound of
    gdn_export.validate.compare.Tolerances."""
    from gdn_export.onnx.metadata import KEY_DTYPE, KEY_QUANTIZATION

    meta = getattr(runner, "metadata", {})
    if "fp8" not in meta.get(KEY_QUANTIZATION, "none").split(","):
        return None
    return STEP_TOLERANCES["float32" if meta.get(KEY_DTYPE, "float32") == "float32" else "16bit"]
