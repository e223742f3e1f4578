#!/usr/bin/env bash
# Issue 39's accuracy table on a trained checkpoint, in one GPU call of <= 9 minutes: train_small.py
# --preset gpu --mtp (MINUTES of training, default 4), then quant_accuracy.py on it; the table is
# printed last.
#
#   benchmarks/trained_gpu.sh [OUT]        # repo root; OUT defaults to $OUT, else /tmp/trained_gpu
#
# Needs wheels in .whl/ (an ignored folder carried with the tree; 35 MB), installed into /tmp/site:
# NVIDIA ModelOpt and what it imports that the device image lacks, and transformers 5.24.0 (the
# version these scripts are tested with; the image's is older) with the regex it checks for.
# Made here, once, with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl nvidia-modelopt==0.47.0 omegaconf==2.4.0 pulp==3.3.2 pydantic==2.14.4 pydantic-core==2.50.5 \
#     annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 regex==2026.12.2 \
#     transformers==5.24.0
# Writes OUT/gpu.txt, train.log, train_small.json, quant.log, quant_accuracy.md / .json; the
# checkpoint stays in CK (default /tmp/trained_gpu_ck) on the device machine only.
# SPEC_SECONDS (default 0: off) runs benchmarks/spec_bench.py on the checkpoint (its MTP head) for at
# most that long between the training and the accuracy table (issue 44's speed table: spec_bench.md
# / .json, spec.log).
# BUDGET (default 540 s) bounds the whole script: quant_accuracy.py starts no format past
# BUDGET - 70 s and is stopped at BUDGET - 10 s (the table keeps the formats measured by then).
# A CPU check of the script (no wheels, the tiny preset, a few steps):
#   INSTALL_WHEELS=0 DEVICE=cpu PRESET=tiny STEPS=3 THREADS=1 benchmarks/trained_gpu.sh /tmp/trained_check
set -u -o pipefail
OUT=${1:-${OUT:-/tmp/trained_gpu}}
MINUTES=${MINUTES:-4}
PRESET=${PRESET:-gpu}
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:+--steps $STEPS}
THREADS=${THREADS:+--threads $THREADS}
BUDGET=${BUDGET:-540}
SPEC_SECONDS=${SPEC_SECONDS:-0}
CK=${CK:-/tmp/trained_gpu_ck}
WHEELS="nvidia_modelopt-0.47.0 omegaconf-2.4.0 pulp-3.3.2 pydantic-2.14.4 pydantic_core-2.50.5 annotated_types-0.8.0
        typing_inspection-0.4.5 typing_extensions-4.16.0 regex-2026.12.2 transformers-5.24.0"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
S=$(date +%s); el() { echo $(( $(date +%s) - S )); }
mkdir -p "$OUT"
if [ "${INSTALL_WHEELS:-1}" = 1 ]; then
  for w in $WHEELS; do
    ls .whl/"$w"-*.whl > /dev/null 2>&1 || { echo "trained_gpu.sh: no .whl/$w-*.whl (see the header)" >&2; exit 1; }
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/pip.log" 2>&1 || { echo "trained_gpu.sh: the wheels did not install (see $OUT/pip.log)" >&2; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
  python3 -c "import torch, transformers, tokenizers; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'tokenizers', tokenizers.__version__)"; } > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt" >&2
shown() { grep -v "falling back" >&2 || true; }  # transformers' note on its PyTorch GDN path, once a layer
echo "[$(el)s] training (--minutes $MINUTES)" >&2
timeout $(( BUDGET - 60 - $(el) )) python3 benchmarks/train_small.py "$CK" --preset "$PRESET" --mtp \
  --minutes "$MINUTES" $STEPS $THREADS --device "$DEVICE" --overwrite 2>&1 | tee "$OUT/train.log" | shown \
  || { echo "trained_gpu.sh: train_small.py failed (see $OUT/train.log)" >&2; exit 1; }
cp "$CK/train_small.json" "$OUT/"
if [ "$SPEC_SECONDS" -gt 0 ]; then
  echo "[$(el)s] spec_bench (<= $SPEC_SECONDS s)" >&2
  timeout "$SPEC_SECONDS" python3 benchmarks/spec_bench.py "$CK" --device "$DEVICE" --out "$OUT" \
    > "$OUT/spec.log" 2>&1 || echo "trained_gpu.sh: spec_bench.py did not finish (see $OUT/spec.log)" >&2
  tail -n 25 "$OUT/spec.log" >&2
fi
LEFT=$(( BUDGET - $(el) ))
echo "[$(el)s] quant_accuracy ($LEFT s left)" >&2
timeout $(( LEFT - 10 )) python3 benchmarks/quant_accuracy.py "$CK" --device "$DEVICE" --out "$OUT" --prompts 32 \
  --new-tokens 64 --batch 16 --budget $(( LEFT - 70 )) $THREADS 2> >(tee "$OUT/quant.log" | shown) > /dev/null \
  || echo "trained_gpu.sh: quant_accuracy.py did not finish (see $OUT/quant.log)" >&2
echo "[$(el)s] done" >&2
cat "$OUT/quant_accuracy.md" 2>/dev/null
