"""What the variants of `gdn-export bench` share (the torch runner, --runtime ort, --quant): the
size checks, the timing tables (torch runner, transformers, the quantized model beside the 16-bit
one, ONNX Runtime) and the --json file."""

from __future__ import annotations

import json
from pathlib import Path

from gdn_export.cli.common import check_at_least

SIZES = (("--batch", "batch", 1), ("--prompt-len", "prompt_len", 1), ("--decode-steps", "decode_steps", 1),
         ("--warmup", "warmup", 0), ("--repeats", "repeats", 1))


def check_sizes(args) -> None:
    """InputError naming the flag of a size below its least value."""
    for flag, name, low in SIZES:
        check_at_least(getattr(args, name), low, flag)


def _fmt(value, spec) -> str:
    return "-" if value is None else format(value, spec)


def _compiled(result: dict) -> str:
    if not result["compile"]:
        return ""
    mode = result.get("compile_mode", "default")
    return ", compiled" if mode == "default" else f", compiled ({mode})"


def table(result: dict, rows) -> str:
    """The markdown table of bench: a header line, one row per (name, result) of `rows`, then the
    weights, memory and accuracy lines of `result`."""
    lines = [f"batch {result['batch']}, prompt {result['prompt_len']}, {result['decode_steps']} decode "
             f"steps, {result['dtype']}, {result['device_name']}, ops {result['op_backend']}, CUDA graph "
             f"{'on' if result['cuda_graph'] else 'off'}{_compiled(result)} "
             f"(medians of {result['repeats']})", "",
             "| | prefill ms | decode ms/step | decode tokens/s | peak memory MiB |",
             "|---|---|---|---|---|"]
    for name, r in rows:
        lines.append(f"| {name} | {_fmt(r.get('prefill_ms'), '.2f')} | {_fmt(r.get('decode_ms_per_step'), '.3f')} "
                     f"| {_fmt(r.get('decode_tokens_per_s'), '.1f')} | {r['peak_memory_bytes'] / 2**20:.1f} |")
    lines.append(f"\nweights {result['weights_bytes'] / 2**20:.1f} MiB + states {result['states_bytes'] / 2**20:.1f} "
                 f"MiB; peak memory from {result['peak_memory_source']}")
    phases = result.get("peak_memory_phases")
    if phases:
        lines.append("ours' peak by phase, MiB: " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in phases.items()))
    hf = result.get("transformers", {})
    if "skipped" in hf:
        lines.append(f"transformers: skipped ({hf['skipped']})")
    spec = result.get("speculative")
    if spec:
        lines.append(f"speculative, K = {spec['k']} (greedy, MTP head, CUDA graph "
                     f"{'on' if spec['cuda_graph'] else 'off'}): {spec['decode_tokens_per_s']:.1f} tokens/s = "
                     f"{spec['speedup']:.2f}x plain decode; {spec['tokens_per_step']:.2f} tokens per verify step "
                     f"(drafts accepted {spec['acceptance_rate']:.1%}); round {spec['round_ms']:.3f} ms (draft "
                     f"{spec['draft_ms']:.3f} + verify {spec['verify_ms']:.3f}) against a plain step "
                     f"{result['decode_ms_per_step']:.3f} ms (verify / plain {spec['verify_over_plain_step']:.2f}); "
                     f"tokens equal plain greedy: {spec['tokens_equal_plain']}"
                     + ("" if spec.get("first_difference") is None else
                        f" ({spec['rows_equal_plain']} rows equal, the first difference at token "
                        f"{spec['first_difference']})"))
    acc = result.get("accuracy")
    if acc:
        lines.append(f"accuracy vs the fp32 model ({acc['steps']} forced steps): ours {result['dtype']} rel RMS "
                     f"{acc['ours_vs_fp32']['rel_rms']:.4f}, argmax agreement {acc['ours_vs_fp32']['argmax_agreement']:.3f}; "
                     f"fp32 fast-runner tokens equal eager: {acc['fp32_fast_tokens_equal_eager']}")
        hacc = hf.get("accuracy")
        if hacc:
            lines.append(f"transformers {result['dtype']} vs its fp32 model: rel RMS {hacc['hf_vs_fp32_hf']['rel_rms']:.4f}, "
                         f"argmax agreement {hacc['hf_vs_fp32_hf']['argmax_agreement']:.3f}; vs our fp32 model: "
                         f"rel RMS {hacc['hf_vs_fp32_ours']['rel_rms']:.4f}")
    return "\n".join(lines)


def quant_table(result: dict) -> str:
    """bench's table with a row for each model, then the ratios and the accuracy."""
    q, dtype = result["quant"], result["dtype"]
    r, acc = q["ratios"], q["vs_16bit"]
    lines = [table(result, [(f"gdn-export {dtype}", result), (f"gdn-export {q['format']}", q)]),
             f"{q['format']} weights {q['weights_bytes'] / 2**20:.1f} MiB; calibration {q['calibration']['samples']} "
             f"x {q['calibration']['seq_len']} tokens ({q['calibration']['data']}), {q['calibration']['seconds']:.1f} s",
             f"{q['format']} / {dtype}: decode {r['decode_ms_per_step']:.3f}x, prefill {r['prefill_ms']:.3f}x, "
             f"peak memory {r['peak_memory_bytes']:.3f}x, weights {r['weights_bytes']:.3f}x",
             f"{q['format']} vs {dtype}: last-position logits rel RMS {acc['logits_rel_rms']:.4f}, greedy agreement "
             f"{acc['greedy_agreement']:.3f} over {acc['greedy_steps']} teacher-forced steps"]
    return "\n".join(lines)


def ort_table(result: dict, name: str) -> str:
    """bench --runtime ort's table: one row for the file `name`."""
    return "\n".join([
        f"ONNX Runtime ({result['kernels']}) on {result['device']}: batch {result['batch']}, prompt "
        f"{result['prompt_len']}, {result['decode_steps']} decode steps (medians of {result['repeats']})\n",
        "| | prefill ms | decode ms/step | decode tokens/s |\n|---|---|---|---|",
        f"| {name} | {result['prefill_ms']:.2f} | {result['decode_ms_per_step']:.3f} | "
        f"{result['decode_tokens_per_s']:.1f} |"])


def write_json(result: dict, path: Path, overwrite: bool) -> None:
    """--json: the result dict without its private ("_") keys, written atomically (a file that
    appeared meanwhile is kept unless overwrite)."""
    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if not k.startswith("_")}
        return x

    from gdn_export.paths import atomic_file

    with atomic_file(path, f"--json {path}", overwrite=overwrite) as tmp:
        tmp.write_text(json.dumps(clean(result), indent=2), encoding="utf-8")
