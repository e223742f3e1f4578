"""How far half precision alone moves the logits of the tiny models (CPU, reference ops only).

Prints, per family and prompt length, the relative RMS distance of the logits of
  (a) the bf16 model on exact (fp32-internal) ops from the fp32 model, and
  (b) the bf16 model whose gdn op rounds the L2-normalised q and k to bf16 (what any bf16
      tensor-core kernel does to its dot operands) from (a).
(b) is the floor under which no bf16 kernel can bring the whole-model comparison against the
reference ops; tests/models/test_op_backends_gpu.py is calibrated on it.

    python benchmarks/investigations/precision_floor.py
"""

import tempfile
from unittest import mock

import torch

from gdn_export.ops.gated_delta_rule import naive
from gdn_export.weights import load_checkpoint
from gdn_export.weights.tiny import make_tiny_checkpoint


def rel_rms(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


_EXACT_PREPARE = naive._prepare


def _rounding_prepare(*args):
    q, k, *rest = _EXACT_PREPARE(*args)
    return (q.bfloat16().float(), k.bfloat16().float(), *rest)


def main():
    torch.manual_seed(0)
    print("| family | T | bf16 model vs fp32 model | q/k rounded to bf16 vs bf16 model |")
    print("|---|---|---|---|")
    for family in ("qwen3_5", "qwen3_next"):
        for T in (63, 130):
            with tempfile.TemporaryDirectory() as tmp:
                make_tiny_checkpoint(f"{tmp}/c", family=family, seed=T)
                m32 = load_checkpoint(f"{tmp}/c", dtype=torch.float32)
                m16 = load_checkpoint(f"{tmp}/c", dtype=torch.bfloat16)
            ids = torch.randint(0, m32.config.vocab_size, (2, T))
            pos = torch.arange(T).expand(2, T)
            with torch.no_grad():
                exact, *_ = m32(ids, pos, *m32.empty_states(2))
                half, *_ = m16(ids, pos, *m16.empty_states(2))
                with mock.patch.object(naive, "_prepare", _rounding_prepare):
                    rounded, *_ = m16(ids, pos, *m16.empty_states(2))
            print(f"| {family} | {T} | {rel_rms(half, exact):.4f} | {rel_rms(rounded, half):.4f} |")


if __name__ == "__main__":
    main()
