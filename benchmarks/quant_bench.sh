#!/usr/bin/env bash
# `gdn-export bench --quant fp8 | int4-awq` beside bf16 on one GPU, CUDA graphs + --compile, in one
# device call of <= 200 s (the H200 command of docs/perf/; results for issue 25's targets).
#
#   benchmarks/quant_bench.sh [OUT]        # repo root; OUT defaults to $OUT, else /tmp/quant_bench
#
# Needs NVIDIA ModelOpt: installed from the wheels in .whl/ (an ignored folder carried with the tree:
# cp /work/main/.whl/*.whl .whl/; nvidia_modelopt 0.47.0 and its pure-Python dependencies) into
# /tmp/site when `import modelopt` fails.
# The model: benchmarks/make_random_checkpoint.py --size 1.6b with LAYERS layers (default 4: one
# 3 GDN : 1 attention block) and the vocabulary cut by the same factor as the layers (248320 * LAYERS
# / 24, rounded up to 128), so that every per-layer shape is the 1.66B model's and the 16-bit
# embedding / lm_head keeps its share of the weight bytes (24 layers: about 60 s of --compile per
# model and configuration on the H200, too long for one call).
# Runs, in this order while the budget lasts (BUDGET seconds for the whole script, default 190, each
# run capped by what is left): fp8 batch 1 (prompt 4096), int4-awq batch 1, fp8 batch 32 (prompt
# 256), int4-awq batch 32; each is one `gdn-export bench --quant` (calibration on the GPU with 2 rows
# of 128 random ids, the bf16 model, the quantized one, 64 teacher-forced steps of accuracy). Writes OUT/<fmt>-b<B>.json
# / .md / .log and OUT/table.md (printed last).
set -u
OUT=${1:-${OUT:-/tmp/quant_bench}}
LAYERS=${LAYERS:-4}
VOCAB=${VOCAB:-$(( (248320 * LAYERS / 24 + 127) / 128 * 128 ))}
BUDGET=${BUDGET:-190}
CK=${CK:-/tmp/quant_bench_ck}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
S=$(date +%s); el() { echo $(( $(date +%s) - S )); }
mkdir -p "$OUT"
if ! python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('modelopt') is None)"; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/pip.log" 2>&1 || { echo "ModelOpt not installable from .whl/ (see $OUT/pip.log)" >&2; exit 1; }
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>/dev/null
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
echo "[$(el)s] checkpoint: $LAYERS layers, vocab $VOCAB" >&2
[ -f "$CK/model.safetensors" ] || timeout 60 python3 benchmarks/make_random_checkpoint.py "$CK" --size 1.6b \
  --layers "$LAYERS" --vocab "$VOCAB" > "$OUT/make.log" 2>&1 || { echo "make_random_checkpoint failed" >&2; exit 1; }
echo "[$(el)s] checkpoint made" >&2
# The four runs in one Python process: torch / triton / ModelOpt are imported once (ModelOpt's import
# alone took ~20 s there) and inductor's caches stay warm; dynamo is reset between runs (each run
# compiles new model objects) and each run is stopped by an alarm when the budget runs out.
python3 - "$CK" "$OUT" "$(( BUDGET - $(el) ))" <<'PY'
import contextlib, signal, sys, time
import torch
from gdn_export.cli.main import main

ck, out, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.time()
base = ["--device", "cuda", "--dtype", "bf16", "--op-backend", "triton", "--cuda-graph", "--compile",
        "--decode-steps", "32", "--warmup", "1", "--repeats", "3", "--calib-samples", "2",
        "--calib-seq-len", "128", "--quant-steps", "64", "--overwrite"]


class OutOfTime(Exception):
    pass


def alarm(*_):
    raise OutOfTime()


signal.signal(signal.SIGALRM, alarm)
for fmt, batch, prompt in (("fp8", 1, 4096), ("int4-awq", 1, 4096), ("fp8", 32, 256), ("int4-awq", 32, 256)):
    name, left = f"{fmt}-b{batch}", int(budget - (time.time() - t0))
    if left < 30:
        print(f"[{time.time() - t0:.0f}s] {name} skipped: {left}s of the budget left", file=sys.stderr)
        continue
    torch._dynamo.reset()
    signal.alarm(left)
    try:
        with open(f"{out}/{name}.md", "w") as md, open(f"{out}/{name}.log", "w") as log, \
                contextlib.redirect_stdout(md), contextlib.redirect_stderr(log):
            code = main(["bench", ck, *base, "--quant", fmt, "--batch", str(batch), "--prompt-len", str(prompt),
                         "--json", f"{out}/{name}.json"])
    except OutOfTime:
        code = "out of time"
    except (Exception, SystemExit) as exc:  # one failed run must not cost the others
        code = f"{type(exc).__name__}: {exc}"
    finally:
        signal.alarm(0)
    print(f"[{time.time() - t0:.0f}s] {name}: {code}", file=sys.stderr)
PY
python3 - "$OUT" "$LAYERS" "$VOCAB" > "$OUT/table.md" <<'PY'
import glob, json, os, sys
out, layers, vocab = sys.argv[1], sys.argv[2], sys.argv[3]
print(f"Qwen3.5 1.66B per-layer shapes, {layers} layers, vocab {vocab}; bf16, triton ops, CUDA graph + --compile; "
      "ratios = quantized / bf16 in the same run; accuracy vs bf16 (random weights)\n")
print("| run | bf16 prefill ms | quant prefill ms | prefill ratio | bf16 decode ms | quant decode ms | decode ratio "
      "| peak ratio | weights ratio | logits rel RMS | greedy agreement |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for f in sorted(glob.glob(os.path.join(out, "*-b*.json"))):
    d = json.load(open(f)); q = d["quant"]; r = q["ratios"]; a = q["vs_16bit"]
    print(f"| {os.path.basename(f)[:-5]} | {d['prefill_ms']:.2f} | {q['prefill_ms']:.2f} | {r['prefill_ms']:.3f} "
          f"| {d['decode_ms_per_step']:.3f} | {q['decode_ms_per_step']:.3f} | {r['decode_ms_per_step']:.3f} "
          f"| {r['peak_memory_bytes']:.3f} | {r['weights_bytes']:.3f} | {a['logits_rel_rms']:.3f} "
          f"| {a['greedy_agreement']:.3f} of {a['greedy_steps']} |")
PY
echo "[$(el)s] done" >&2
cat "$OUT/table.md"
