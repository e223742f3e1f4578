#!/usr/bin/env bash
# Every GPU test of the repo (`pytest -m gpu` across tests/) in one call on one GPU, made for one
# 10-minute H200 call (16 CPU cores; GDN_GPU_TIMEOUT cuts it at 530 s): pytest-xdist workers share
# the GPU, Triton's compile cache and one build
# of the CUDA extension (started first, in the background: the workers that need it wait on
# torch's build lock, the others run Triton tests meanwhile) and of plugins/ (tests/plugins/cmake_build.py).
#
#   tests/gpu_run.sh [OUT_DIR] [pytest args...]      e.g. tests/gpu_run.sh gpu-tests -k contracts
#
# OUT_DIR (default gpu-tests): pytest.log, junit.xml, tests.tsv (each test's outcome and seconds as it
# ends, a failure's traceback under it: complete even in a run the time limit cut), extension.log,
# the Triton cache (TRITON_CACHE_DIR overrides).
# GDN_GPU_WORKERS (default 12): workers on the one GPU (the tests are short and mostly wait on Triton
#   compiles and launches on the CPU: 6 workers ran 84% of 4738 tests in 540 s on the H200); each
#   holds its own CUDA context and caching allocator (the tests give cached blocks back after each
#   test). GDN_GPU_TIMEOUT (default 530 s).
# TensorRT headers for the plugin build: TENSORRT_INCLUDE_DIR, else .carry/tensorrt/include if present.
# Exit status: pytest's (5 if nothing was selected), 124 if the time limit cut the run (pytest runs
# -v: each outcome is a line of pytest.log as it finishes, so a cut run still names its failures).
set -u
cd "$(dirname "$0")/.."
out=${1:-gpu-tests}
shift $(($# > 0 ? 1 : 0))
mkdir -p "$out"
out=$(cd "$out" && pwd)
workers=${GDN_GPU_WORKERS:-12}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$out/triton-cache}
export GDN_TEST_THREADS=${GDN_TEST_THREADS:-1} GDN_TEST_LOG=$out/tests.tsv
rm -f "$out/tests.tsv"
if [ -z "${TENSORRT_INCLUDE_DIR:-}" ] && [ -f .carry/tensorrt/include/NvInferRuntime.h ]; then
    export TENSORRT_INCLUDE_DIR=$PWD/.carry/tensorrt/include
fi
t0=$SECONDS
python3 -c "from gdn_export.cuda import extension; extension.load()" > "$out/extension.log" 2>&1 &
timeout "${GDN_GPU_TIMEOUT:-530}" python3 -m pytest -m gpu -n "$workers" -p no:cacheprovider -v -rfEs \
    --durations=25 --junitxml="$out/junit.xml" tests "$@" > "$out/pytest.log" 2>&1
rc=$?
wait
echo "gpu tests: rc=$rc in $((SECONDS - t0)) s ($workers workers): $(grep -E '(passed|failed|error)' "$out/pytest.log" | tail -1)"
echo "slowest:"; grep -v "^    " "$out/tests.tsv" 2>/dev/null | sort -t$'\t' -k2,2 -rn | head -12 | cut -c1-160
grep -E "^(failed|error)" "$out/tests.tsv" 2>/dev/null | cut -f4 | sort -u | head -20
exit $rc
