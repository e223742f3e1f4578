"""One sparse-MoE layer shaped like Qwen3.5-35B-A3B (H 2048, 256 experts, top 8, expert size 512,
shared expert 512), bf16, every implementation side by side on the current GPU.

    PYTHONPATH=$PWD python3 benchmarks/moe_bench.py [--out DIR] [--quick]

Rows: decode B = 1, 8, 64 and prefill T = 4096 tokens. Columns (median ms):
    triton / cuda     gdn::moe through the public op (use_backend), routed experts only
    layer (triton)    the whole block through the op: router Linear + op + gated shared expert
    hf eager          transformers' Qwen3_5MoeSparseMoeBlock, experts_implementation="eager" (loop)
    hf grouped_mm     the same block with transformers' grouped_mm experts
    dense-equiv       the dense-equivalent routed experts (every expert on every token: the
                      SparseMoeBlock math this op replaces)
    dense GEMM        x [N, H] @ [H, 2kI] then [N, kI] @ [kI, H]: a dense GEMM pair with the routed
                      experts' active FLOPs (the prefill target is 2x this)
    weight read       bytes of the distinct experts hit (3 I H x 2 bytes each) / measured copy
                      bandwidth (the decode target is 1.5x this)
    x / target        time / (1.5 x weight read) at decode, / (2 x dense GEMM) at prefill: <= 1 meets
                      the issue's targets
With --quant (issue 39: quantized experts, decode <= 0.7x bf16), a second table at the decode rows:
the routed experts through gdn::moe (bf16, triton) beside gdn::moe_fp8 (per-channel FP8 weights as
`gdn-export quantize` writes them, weight-only and with static per-expert FP8 activation scales)
and gdn::moe_int4 (RTN group 128), each checked against its fp32 reference first (relative RMS <=
2e-2) and timed the same way; ratios to bf16.
Graph-capturable paths are timed as CUDA-graph replays (no launch gaps); the others (transformers'
loop syncs on nonzero) with CUDA events around eager calls. Before timing, every implementation
is checked against the fp32 reference (relative RMS <= 1e-2); a failed check is printed and its
column shows "FAIL". JSON and the markdown table are written to --out (default $OUT, else a new temp folder).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import gpu_timing
from records import out_dir
import torch
import torch.nn.functional as F
from triton.testing import do_bench

from gdn_export.ops import use_backend
from gdn_export.ops.moe import moe, sparse_moe_forward
from gdn_export.ops.moe.naive import moe as reference
from gdn_export.ops.moe.naive import route

H, E, TOP_K, I, I_SHARED = 2048, 256, 8, 512, 512
ROWS = [("decode B=1", 1), ("decode B=8", 8), ("decode B=64", 64), ("prefill T=4096", 4096)]
DT = torch.bfloat16
BOUND = 1e-2


def rel_rms(a, b) -> float:
    a, b = a.double(), b.double()
    return float("inf") if torch.isnan(a).any() else ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def events_ms(fn, reps=20) -> float:
    for _ in range(3):
        fn()
    return do_bench(fn, warmup=5, rep=reps * 5, return_mode="median")


def graph_ms(fn, steps=10) -> float:
    """GPU time per call, replayed from a CUDA graph of `steps` calls; events if capture fails."""
    return gpu_timing.graph_ms(fn, steps, fallback=events_ms)


def copy_bandwidth() -> float:
    """Bytes per second of a 2 GiB device copy (read + write)."""
    return gpu_timing.copy_tbps() * 1e12


def hf_block():
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock

    cfg = Qwen3_5MoeTextConfig(hidden_size=H, num_experts=E, num_experts_per_tok=TOP_K, moe_intermediate_size=I,
                               shared_expert_intermediate_size=I_SHARED)
    cfg._experts_implementation = "eager"
    torch.manual_seed(0)
    block = Qwen3_5MoeSparseMoeBlock(cfg).to(device="cuda", dtype=DT).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.02)
        block.gate.weight.normal_(0, 0.5)  # spread routing over many experts
        block.experts.gate_up_proj.normal_(0, H**-0.5)
        block.experts.down_proj.normal_(0, I**-0.5)
    block.top_k, block.norm_topk_prob = TOP_K, True  # what sparse_moe_forward reads
    return cfg, block


def dense_weights(gate_up, down):
    """The dense-equivalent form's concatenated weights: gate [E I, H], up [E I, H], down [H, E I]."""
    pairs = gate_up.view(E, 2, I, H)
    return (pairs[:, 0].reshape(E * I, H).contiguous(), pairs[:, 1].reshape(E * I, H).contiguous(),
            down.permute(1, 0, 2).reshape(H, E * I).contiguous())


def dense_equivalent(x, logits, w_gate, w_up, w_down):
    """The dense-equivalent routed experts (today's SparseMoeBlock math): every expert, every token."""
    ids, top = route(logits, TOP_K, True)
    w = torch.zeros_like(logits, dtype=torch.float32).scatter(-1, ids, top).to(x.dtype)  # [N, E]
    act = (F.silu(F.linear(x, w_gate)) * F.linear(x, w_up)).view(-1, E, I) * w[..., None]
    return F.linear(act.view(-1, E * I), w_down)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="decode rows only")
    ap.add_argument("--quant", action="store_true", help="also the quantized experts (FP8, INT4) at the decode rows")
    ap.add_argument("--quant-only", action="store_true", help="only the quantized-experts table")
    args = ap.parse_args(argv)
    args.out = out_dir(args.out, "moe_bench")
    out_path = Path(args.out)
    out_path.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    cfg, block = hf_block()
    gate_up, down = block.experts.gate_up_proj.detach(), block.experts.down_proj.detach()
    quant_rows = _quant(block, gate_up, down) if args.quant or args.quant_only else []
    if args.quant_only:  # neither the dense weights nor the copy bandwidth: the 16-bit table's columns
        table = _quant_table(quant_rows)
        (out_path / "moe_quant_bench.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(),
                                                                   "rows": quant_rows}, indent=1))
        (out_path / "moe_quant_bench.md").write_text(table + "\n")
        print(table)
        return 0
    dense = dense_weights(gate_up, down)
    bandwidth = copy_bandwidth()
    print(f"GPU {torch.cuda.get_device_name()}, copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    results = []
    for label, n in ROWS[:3] if args.quick else ROWS:
        torch.manual_seed(n)
        x = torch.randn(n, H, device="cuda", dtype=DT)
        with torch.no_grad():
            logits = F.linear(x, block.gate.weight)
        hit = int(torch.unique(route(logits, TOP_K, True)[0]).numel())
        row = {"case": label, "tokens": n, "experts_hit": hit,
               "weight_read_ms": hit * 3 * I * H * 2 / bandwidth * 1e3}
        expected = reference(x.float(), logits.float(), gate_up.float(), down.float(), TOP_K, True)
        routed = {
            "triton": lambda: _with("triton", x, logits, gate_up, down),
            "cuda": lambda: _with("cuda", x, logits, gate_up, down),
            "dense_equiv": lambda: dense_equivalent(x, logits, *dense),
        }
        for name, fn in routed.items():
            try:
                with torch.no_grad():
                    err = rel_rms(fn().float(), expected)
                ok = err <= BOUND
                print(f"{label:16s} {name:12s} rel RMS vs fp32 reference {err:.2e} {'ok' if ok else 'FAIL'}")
                row[f"{name}_ms"] = graph_ms(fn) if ok else None
            except Exception as exc:  # noqa: BLE001  (one failing implementation must not hide the others)
                print(f"{label:16s} {name:12s} ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                row[f"{name}_ms"] = None
        # whole layers (router + routed + shared): ours vs transformers' two expert implementations
        _layers(row, label, cfg, block, x)
        with torch.no_grad():
            w1 = torch.randn(H, 2 * TOP_K * I, device="cuda", dtype=DT) * 0.02
            w2 = torch.randn(TOP_K * I, H, device="cuda", dtype=DT) * 0.02
            row["dense_gemm_ms"] = graph_ms(lambda: (x @ w1)[:, : TOP_K * I] @ w2)
        results.append(row)
        torch.cuda.empty_cache()
    (out_path / "moe_bench.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(),
                                                         "copy_bandwidth_Bps": bandwidth, "rows": results}, indent=1))
    table = _table(results)
    if quant_rows:
        table += "\n\n" + _quant_table(quant_rows)
    (out_path / "moe_bench.md").write_text(table + "\n")
    print(table)
    return 0


QUANT_BOUND = 2e-2


def _quant(block, gate_up, down) -> list[dict]:
    """Decode rows: bf16 gdn::moe against gdn::moe_fp8 (weight-only and static activations) and
    gdn::moe_int4, weights quantized as `gdn-export quantize` does (gdn_export.quantize.experts)."""
    from gdn_export.ops.moe_quant import moe_fp8, moe_int4
    from gdn_export.ops.moe_quant import naive as quant_ref
    from gdn_export.quantize.experts import _fp8_weight, _int4_weight

    gu8, gu8_s = _fp8_weight(gate_up.float())
    dn8, dn8_s = _fp8_weight(down.float())
    gu4, gu4_s = _int4_weight(gate_up.float(), DT)
    dn4, dn4_s = _int4_weight(down.float(), DT)
    rows = []
    for label, n in ROWS[:3]:
        torch.manual_seed(n)
        x = torch.randn(n, H, device="cuda", dtype=DT)
        with torch.no_grad():
            logits = F.linear(x, block.gate.weight)
        # static per-expert activation scales from this batch's ranges (calibration's max rule)
        in_gu = torch.full((E,), x.float().abs().amax().item() / 448, device="cuda")
        act = F.silu(x.float() @ gate_up.float()[:, :I].transpose(1, 2)) * (x.float() @ gate_up.float()[:, I:].transpose(1, 2))
        in_dn = act.abs().amax(dim=(1, 2)).clamp(min=1e-6) / 448
        del act
        forms = {
            "bf16": (lambda: _with("triton", x, logits, gate_up, down),
                     lambda: reference(x.float(), logits.float(), gate_up.float(), down.float(), TOP_K, True)),
            "fp8": (lambda: moe_fp8(x, logits, gu8, gu8_s, dn8, dn8_s, None, None, TOP_K, True),
                    lambda: quant_ref.moe_fp8(x.float(), logits.float(), gu8, gu8_s, dn8, dn8_s, None, None, TOP_K,
                                              True)),
            "fp8 static": (lambda: moe_fp8(x, logits, gu8, gu8_s, dn8, dn8_s, in_gu, in_dn, TOP_K, True),
                           lambda: quant_ref.moe_fp8(x.float(), logits.float(), gu8, gu8_s, dn8, dn8_s, in_gu, in_dn,
                                                     TOP_K, True)),
            "int4": (lambda: moe_int4(x, logits, gu4, gu4_s, dn4, dn4_s, TOP_K, True, 128),
                     lambda: quant_ref.moe_int4(x.float(), logits.float(), gu4, gu4_s.float(), dn4, dn4_s.float(),
                                                TOP_K, True, 128)),
        }
        row = {"case": label, "tokens": n}
        for name, (fn, ref) in forms.items():
            try:
                with torch.no_grad():
                    err = rel_rms(fn().float(), ref().float())
                ok = err <= (BOUND if name == "bf16" else QUANT_BOUND)
                print(f"{label:16s} {name:12s} rel RMS vs its fp32 reference {err:.2e} {'ok' if ok else 'FAIL'}")
                row[f"{name}_ms"] = graph_ms(fn) if ok else None
            except Exception as exc:  # noqa: BLE001  (one failing form must not hide the others)
                print(f"{label:16s} {name:12s} ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                row[f"{name}_ms"] = None
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def _quant_table(rows) -> str:
    forms = ("bf16", "fp8", "fp8 static", "int4")
    lines = ["| case | " + " | ".join(f"{f} ms" for f in forms) + " | " + " | ".join(f"{f} / bf16" for f in forms[1:])
             + " |", "|---" * (2 * len(forms)) + "|"]
    for r in rows:
        ms = ["FAIL" if r.get(f"{f}_ms") is None else f"{r[f'{f}_ms']:.4f}" for f in forms]
        base = r.get("bf16_ms")
        ratio = ["-" if base is None or r.get(f"{f}_ms") is None else f"{r[f'{f}_ms'] / base:.2f}x" for f in forms[1:]]
        lines.append(f"| {r['case']} | " + " | ".join(ms + ratio) + " |")
    return "\n".join(lines)


def _layers(row, label, cfg, block, x) -> None:
    """Times the whole block: through our op (triton) and transformers' eager / grouped_mm experts."""

    def layer_triton():
        with use_backend("triton"):
            return sparse_moe_forward(x, block)

    with torch.no_grad():
        try:
            cfg._experts_implementation = "eager"
            err = rel_rms(layer_triton().float(), block(x[None])[0].float())
            print(f"{label:16s} layer(triton) vs transformers eager: rel RMS {err:.2e}")
            row["layer_rel_rms_vs_hf"] = err
            row["layer_triton_ms"] = graph_ms(layer_triton) if err <= BOUND else None
        except Exception as exc:  # noqa: BLE001
            print(f"{label:16s} layer(triton): ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            row["layer_triton_ms"] = None
        for impl in ("eager", "grouped_mm"):
            cfg._experts_implementation = impl
            try:
                row[f"hf_{impl}_ms"] = events_ms(lambda: block(x[None]))
            except Exception as exc:  # noqa: BLE001
                print(f"{label:16s} hf {impl}: ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                row[f"hf_{impl}_ms"] = None
        cfg._experts_implementation = "eager"


def _with(backend, x, logits, gate_up, down):
    with use_backend(backend):
        return moe(x, logits, gate_up, down, TOP_K, True)


def _table(rows) -> str:
    cols = [("triton", "triton_ms"), ("cuda", "cuda_ms"), ("layer (triton)", "layer_triton_ms"),
            ("hf eager", "hf_eager_ms"), ("hf grouped_mm", "hf_grouped_mm_ms"), ("dense-equiv", "dense_equiv_ms"),
            ("dense GEMM", "dense_gemm_ms"), ("weight read", "weight_read_ms")]
    lines = ["| case | experts hit | " + " | ".join(c for c, _ in cols) + " | triton / target | cuda / target |",
             "|---" * (len(cols) + 4) + "|"]
    for r in rows:
        cells = ["FAIL" if r.get(k) is None else f"{r[k]:.3f}" for _, k in cols]
        target = r["weight_read_ms"] * 1.5 if r["tokens"] <= 64 else r["dense_gemm_ms"] * 2
        ratios = ["-" if r.get(k) is None else f"{r[k] / target:.2f}" for k in ("triton_ms", "cuda_ms")]
        lines.append(f"| {r['case']} | {r['experts_hit']} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
