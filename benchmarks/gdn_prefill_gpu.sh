#!/usr/bin/env bash
# The Triton GDN prefill's two forms on one GPU in one device call of <= 9 minutes (issue 40): the GPU
# contract tests of both forms, the launch sweep of their kernels, and the public op on the prefill
# classes beside flash-linear-attention (and FlashInfer when importable), with each one's relative
# RMS against the fp32 naive reference; a short table printed last. docs/perf/gdn.md holds the results.
#
#   benchmarks/gdn_prefill_gpu.sh [OUT]        # repo root; OUT defaults to $OUT, else /tmp/gdn_prefill_gpu
#
# Forms (kernels/gated_delta_rule/triton/chunk.py FORMS): "two-pass" (wy.py writes w, u, Aqk; the
# sequential kernel reads them) and "fused" (wy.py writes (I + A)^-1 only; the sequential kernel forms
# k h, v_new and Aqk per chunk from q, k, v).
#
# Environment: PARTS (default "forms sweep tests fla": the comparison that decides chunk.FORM first),
# TESTS_S (seconds for the fused form's GPU contract tests, `-k triton-chunk-fused`, default 120; the
# two-pass form's ran on the H200 before),
# SWEEP_S (default 150), FORMS_S (default 170: prefill_pack_bench.py, our two forms on the classes
# FORMS_CASES, default 1,3,4,5,6,7: every class but 64K; FLA left out), FLA_S (default 90: the 1 x 16K class again with FLA 0.6, installed from
# .carry/fla into /tmp/fla_site when `import fla` fails; its autotuning takes most of a minute a shape).
set -u
OUT=${1:-${OUT:-/tmp/gdn_prefill_gpu}}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if ! python3 -c "import fla" 2>/dev/null && ls .carry/fla/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/fla_site .carry/fla/*.whl > "$OUT/pip.log" 2>&1 \
    && export PYTHONPATH=$PWD:/tmp/fla_site
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
FORMS=triton-two-pass,triton-fused
for part in ${PARTS:-forms sweep tests fla}; do
  start=$(date +%s)
  case $part in
    tests)
      timeout "${TESTS_S:-120}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/gated_delta_rule \
        -k "triton-chunk-fused" > "$OUT/tests.log" 2>&1
      echo "tests exit $? ($(tail -1 "$OUT/tests.log"))" | tee -a "$OUT/summary.txt"
      grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -10 ;;
    sweep)
      timeout "${SWEEP_S:-150}" python3 benchmarks/bench_kernels.py --only sweep --skip-fla --no-decode \
        --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
      echo "sweep exit $?" | tee -a "$OUT/summary.txt" ;;
    forms)
      timeout "${FORMS_S:-170}" python3 benchmarks/prefill_pack_bench.py --backends "$FORMS" --accuracy \
        --no-fla --cases "${FORMS_CASES:-1,3,4,5,6,7}" --out-dir "$OUT/forms" > "$OUT/forms.log" 2>&1
      echo "forms exit $?" | tee -a "$OUT/summary.txt" ;;
    fla)
      timeout "${FLA_S:-90}" python3 benchmarks/prefill_pack_bench.py --backends "$FORMS" --accuracy \
        --cases 1 --out-dir "$OUT/fla" > "$OUT/fla.log" 2>&1
      echo "fla exit $?" | tee -a "$OUT/summary.txt" ;;
    *) echo "unknown part $part" ;;
  esac
  echo "$part: $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
done
echo
echo "## sweep (ms)"
grep -E "^\| sweep (wy|state|inverse|fused)" "$OUT/sweep/bench_kernels.md" 2>/dev/null | cut -d'|' -f2-4,8
for t in forms fla; do
  [ -f "$OUT/$t/prefill_pack_bench.md" ] && { echo; echo "## $t"; cat "$OUT/$t/prefill_pack_bench.md"; }
done
