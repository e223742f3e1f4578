"""What `validate` adds for a quantized checkpoint: the PyTorch reference in the exported graph's
arithmetic, and the quantized model's distance from its 16-bit (dequantized) self."""

from __future__ import annotations

import torch

from gdn_export.modules.quant_experts import Fp8MoeExperts
from gdn_export.modules.quant_linear import Fp8BlockLinear, quantized_formats

# validate's default (atol, rtol) floor per quantization format of the exported graph. fp8 (static
# per-tensor FP8 activations): ONNX Runtime and PyTorch sum in other orders, so an activation
# sitting on an e4m3 rounding boundary can round one step (2^-3 relative) apart, and the step
# propagates: measured on the tiny qwen3_5 (hidden 192), 4 seeds, max abs 0.19 / max rel 0.063
# over logits and states (1e-6 when no value flips); fp16 graphs flip more (x is rounded to fp16
# before it is quantized): max abs 0.86 / max rel 0.28 over 4 seeds. int4-awq and fp8-block128 graphs
# keep 16-bit activations: the dtype's defaults hold (measured max abs 3e-6 in fp32).
QUANT_TOLERANCES = {("fp8", "float32"): (0.3, 0.1), ("fp8", "16bit"): (1.0, 0.3)}
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


def quantization_distance(model, seed: int = 0, progress=None, baseline=None) -> str | None:
    """One line: logits relative RMS and greedy agreement of the quantized model against the 16-bit
    checkpoint `baseline` (a folder) or, without one, its own weights dequantized to 16 bits (which
    shows the activation rounding only: ~0 for weight-only int4-awq). None for a 16-bit model."""
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
    return (f"quantization ({', '.join(sorted(formats))}) vs {what}: logits relative "
            f"RMS {r['logits_rel_rms']:.3e}, greedy agreement {r['greedy_agreement']:.3f} over {DISTANCE_STEPS} "
            f"steps (random prompt, seed {seed})")


def tolerance_floor(runner, atol: float, rtol: float) -> tuple[float, float]:
    """(atol, rtol) raised to the floor of the runner's quantization format (metadata_props)."""
    from gdn_export.onnx.metadata import KEY_QUANTIZATION

    from gdn_export.onnx.metadata import KEY_DTYPE

    meta = getattr(runner, "metadata", {})
    formats = meta.get(KEY_QUANTIZATION, "none").split(",")
    dtype = "float32" if meta.get(KEY_DTYPE, "float32") == "float32" else "16bit"
    for f in formats:
        a, r = QUANT_TOLERANCES.get((f, dtype), (0.0, 0.0))
        atol, rtol = max(atol, a), max(rtol, r)
    return atol, rtol
