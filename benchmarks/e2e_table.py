"""Markdown table of the `gdn-export bench` JSON files that benchmarks/e2e_bench.sh wrote.

    python benchmarks/e2e_table.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _f(value, spec=".2f") -> str:
    return "-" if value is None else format(value, spec)


def main(out: str) -> None:
    folder = Path(out)
    print("| run | ops | graph / compile | batch | prefill ms | decode ms/step | decode tok/s | peak GiB "
          "| weights + states GiB | transformers prefill ms | transformers decode ms/step | "
          "transformers peak GiB | bf16 vs fp32 rel RMS: ours / transformers |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    names = sorted(p.stem for p in folder.glob("*.json"))
    failed = (folder / "failures.txt").read_text().split("\n") if (folder / "failures.txt").exists() else []
    for name in names:
        r = json.loads((folder / f"{name}.json").read_text())
        hf = r.get("transformers", {})
        acc, hacc = r.get("accuracy", {}), hf.get("accuracy", {})
        ours_rms = acc.get("ours_vs_fp32", {}).get("rel_rms")
        hf_rms = hacc.get("hf_vs_fp32_hf", {}).get("rel_rms")
        mode = f"{'graph' if r['cuda_graph'] else 'eager'}{' + compile' if r['compile'] else ''}"
        if r.get("prefill_chunk"):
            mode += f", chunk {r['prefill_chunk']}"
        print(f"| {name} | {r['op_backend']} | {mode} | {r['batch']} | {_f(r['prefill_ms'])} | "
              f"{_f(r['decode_ms_per_step'], '.3f')} | {_f(r['decode_tokens_per_s'], '.0f')} | "
              f"{_f(r['peak_memory_bytes'] / 2**30, '.2f')} | "
              f"{_f((r['weights_bytes'] + r['states_bytes']) / 2**30, '.2f')} | "
              f"{_f(hf.get('prefill_ms'))} | {_f(hf.get('decode_ms_per_step'), '.3f')} | "
              f"{_f(hf['peak_memory_bytes'] / 2**30 if 'peak_memory_bytes' in hf else None)} | "
              f"{_f(ours_rms, '.4f')} / {_f(hf_rms, '.4f')} |")
    for line in failed:
        if line.strip():
            print(f"| {line.split()[0]} | failed ({line}) |")
    print("\ntransformers runs without flash-linear-attention / causal-conv1d (its torch fallback); "
          "prompt 4096, 32 decode steps, bf16, medians of 3; fp32 fast-runner tokens equal eager: " +
          ", ".join(f"{p.stem} {json.loads(p.read_text()).get('accuracy', {}).get('fp32_fast_tokens_equal_eager')}"
                    for p in sorted(folder.glob("*.json")) if "accuracy" in json.loads(p.read_text())))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
