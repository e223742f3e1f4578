#!/usr/bin/env bash
# End-to-end benchmark on one GPU (issue 9), one command:
#
#     benchmarks/e2e_bench.sh [OUT]          (OUT defaults to $OUT, else /tmp/e2e_bench)
#
# Makes a random 1.66B-class Qwen3.5 text checkpoint with transformers (bf16, on the GPU), runs
# `gdn-export bench` on it for batch 1 and 32 with a 4096-token prompt on the triton and cuda op
# backends (CUDA graphs on; also off, and with torch.compile, at batch 1), transformers in the same
# runs (--compare-hf; flash-linear-attention is not installed on the device, so transformers runs
# its torch fallback of the GDN kernels), the bf16-vs-fp32 accuracy mode at batch 1, then, while
# time remains, a Qwen3.5-9B-like model. Each run's JSON / table / log lands in OUT; the markdown
# table of all runs is printed last (benchmarks/e2e_table.py). Runs are cut at their own timeouts
# so that the whole stays under 9 minutes; a cut run shows as "failed" in the table.
set -uo pipefail
OUT=${1:-${OUT:-/tmp/e2e_bench}}
PY=${PYTHON:-python}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
START=$(date +%s)
BUDGET=${E2E_SECONDS:-540}  # the whole script's wall time; optional runs start only if they fit
elapsed() { echo $(( $(date +%s) - START )); }
fits() { [ $(( $(elapsed) + $1 )) -lt "$BUDGET" ]; }  # fits SECONDS
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
"$PY" -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt" 2>&1

run() {  # run NAME TIMEOUT_S CHECKPOINT FLAGS...
  local name=$1 limit=$2; shift 2
  echo "[e2e $(elapsed)s] $name: gdn-export bench $*" >&2
  timeout "$limit" "$PY" -m gdn_export bench "$@" --json "$OUT/$name.json" > "$OUT/$name.md" 2> "$OUT/$name.log"
  local rc=$?
  [ $rc -eq 0 ] || echo "$name exit $rc" >> "$OUT/failures.txt"
  tail -n 3 "$OUT/$name.md" >&2
}

CK="$OUT/ckpt-1.6b"
[ -f "$CK/config.json" ] || "$PY" benchmarks/make_random_checkpoint.py "$CK" --size 1.6b 2>&1 | tee "$OUT/make-1.6b.log" >&2
P="--device cuda --dtype bf16 --prompt-len 4096 --decode-steps 32 --warmup 1 --repeats 3"
run b1-triton        150 "$CK" $P --batch 1 --op-backend triton --compare-hf --accuracy
run b32-triton       120 "$CK" $P --batch 32 --op-backend triton --compare-hf
fits 90 && run b1-cuda     90 "$CK" $P --batch 1 --op-backend cuda     # first use builds the extension
fits 60 && run b32-cuda    60 "$CK" $P --batch 32 --op-backend cuda
fits 45 && run b1-triton-eager   45 "$CK" $P --batch 1 --op-backend triton --no-cuda-graph
fits 90 && run b1-triton-compile 90 "$CK" $P --batch 1 --op-backend triton --compile
fits 45 && run b32-triton-chunk  45 "$CK" $P --batch 32 --op-backend triton --prefill-chunk 1024

if fits 190; then
  CK9="$OUT/ckpt-9b"
  timeout 90 "$PY" benchmarks/make_random_checkpoint.py "$CK9" --size 9b 2>&1 | tee "$OUT/make-9b.log" >&2
  fits 60 && run 9b-b1-triton 60 "$CK9" $P --batch 1 --op-backend triton
  fits 40 && run 9b-b32-triton 40 "$CK9" $P --batch 32 --op-backend triton
  rm -rf "$CK9"
fi
rm -rf "$CK"
echo "[e2e $(elapsed)s] done" >&2
"$PY" benchmarks/e2e_table.py "$OUT" | tee "$OUT/e2e_table.md"
