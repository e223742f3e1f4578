"""run_parity of runners against a reference at validate's default tolerances, asserted (the
whole-model parity of the ONNX forms' tests)."""

from __future__ import annotations

from gdn_export.validate.compare import Tolerances, default_tolerances, run_parity


def assert_parity(reference, candidates, dtype="float32", state="float32", prompt_len=65, steps=4, batch=3):
    """Ragged prefill of `batch` rows (`prompt_len` down), then `steps` forced decode steps; every
    logits and state row within default_tolerances(dtype, state). Returns the report."""
    atol, rtol = default_tolerances(dtype, state)
    report = run_parity(reference, candidates, vocab_size=reference.vocab_size,
                        tolerances=Tolerances(atol, rtol), batch=batch, prompt_len=prompt_len,
                        decode_steps=steps)
    bad = [r for r in report.rows if not r.passed]
    assert report.passed, bad[:4]
    return report
