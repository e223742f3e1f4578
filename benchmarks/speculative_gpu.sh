#!/usr/bin/env bash
# Speculative decoding on one GPU in one device call of <= 9 minutes (issue 44): the GPU checks of
# the every-step state (the CUDA kernel's stepStates, the GatedDeltaRuleSteps plugin) and of the
# speculative runners, then the speed table on a trained checkpoint; a short summary printed last.
#
#   benchmarks/speculative_gpu.sh [OUT]      # repo root; OUT defaults to $OUT, else /tmp/speculative_gpu
#
# Parts, in the order of PARTS (default "tests plugins speed"):
#   tests    pytest tests/ops/gated_delta_rule/test_steps.py tests/runtime/test_speculative_gpu.py
#            tests/serve/test_speculation_gpu.py (the server's captured rounds)
#            (the CUDA extension is built first, in the background while the plugins build)
#   plugins  cmake plugins/ (TensorRT headers: $TENSORRT_INCLUDE_DIR, else .carry/tensorrt/include, an
#            ignored folder carried with the tree: a copy of ../shared/third_party/tensorrt/include)
#            and pluginHostTest on the GPU: every plugin case, the GatedDeltaRuleSteps rows kept
#   speed    benchmarks/trained_gpu.sh with MINUTES of training (default 4) and SPEC_SECONDS of
#            spec_bench.py (default 150; B1 and B8, K = 1..4, token agreement and the logit gap where
#            a row first differs); needs .whl (see trained_gpu.sh); its accuracy part gets what is left
# BUDGET (default 530 s) bounds the whole script.
# OUT receives tests.log, plugins.log, steps_plugin.md, speed.tgz (trained_gpu.sh's files) and
# summary.txt (printed last): at most 8 files, what the device tool brings back.
set -u
FINAL=${1:-${OUT:-/tmp/speculative_gpu}}
PARTS=${PARTS:-tests plugins speed}
BUDGET=${BUDGET:-530}
MINUTES=${MINUTES:-4}
SPEC_SECONDS=${SPEC_SECONDS:-150}
HEADERS=${TENSORRT_INCLUDE_DIR:-$PWD/.carry/tensorrt/include}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=$(date +%s); el() { echo $(( $(date +%s) - S )); }
left() { echo $(( BUDGET - $(el) )); }
has() { case " $PARTS " in *" $1 "*) return 0;; esac; return 1; }
mkdir -p "$FINAL"
SUMMARY="$FINAL/summary.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$SUMMARY" 2>&1

if has tests; then  # the extension compiles while the plugins build (nice: the build goes first)
  ( nice -n 10 python3 -c "from gdn_export.cuda import extension; extension.load()" > /tmp/speculative_ext.log 2>&1 ) &
  EXT_PID=$!
fi

if has plugins; then
  echo "[$(el)s] plugins" >&2
  { cmake -S plugins -B /tmp/speculative_plugins -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DTENSORRT_INCLUDE_DIR="$HEADERS" && cmake --build /tmp/speculative_plugins -j 16; } > "$FINAL/plugins.log" 2>&1
  if [ -x /tmp/speculative_plugins/pluginHostTest ]; then
    timeout $(( $(left) > 120 ? 120 : $(left) )) /tmp/speculative_plugins/pluginHostTest \
      --markdown /tmp/speculative_plugins/table.md >> "$FINAL/plugins.log" 2>&1
    echo "pluginHostTest exit $?: $(tail -1 "$FINAL/plugins.log")" >> "$SUMMARY"
    { head -3 /tmp/speculative_plugins/table.md; grep "GatedDeltaRuleSteps" /tmp/speculative_plugins/table.md; } \
      > "$FINAL/steps_plugin.md" 2>/dev/null
  else
    echo "plugins: the build failed (plugins.log)" >> "$SUMMARY"
  fi
fi

if has tests; then
  echo "[$(el)s] tests" >&2
  wait "$EXT_PID"
  timeout $(( $(left) > 150 ? 150 : $(left) )) python3 -m pytest -q -p no:cacheprovider -n 4 \
    tests/ops/gated_delta_rule/test_steps.py tests/runtime/test_speculative_gpu.py tests/serve/test_speculation_gpu.py \
    > "$FINAL/tests.log" 2>&1
  echo "tests exit $?: $(tail -1 "$FINAL/tests.log")" >> "$SUMMARY"
fi

if has speed; then
  echo "[$(el)s] speed" >&2
  SPEED=/tmp/speculative_speed
  MINUTES=$MINUTES SPEC_SECONDS=$SPEC_SECONDS BUDGET=$(( $(left) - 5 )) benchmarks/trained_gpu.sh "$SPEED" \
    > /tmp/speculative_speed.log 2>&1
  tar -czf "$FINAL/speed.tgz" -C "$SPEED" . /tmp/speculative_speed.log 2>/dev/null
  { echo; cat "$SPEED/spec_bench.md" 2>/dev/null || echo "speed: no spec_bench.md (speed.tgz)"; } >> "$SUMMARY"
fi
echo "[$(el)s] done" >&2
cat "$SUMMARY"
