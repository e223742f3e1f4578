#!/usr/bin/env bash
# Every GPU test of the repo (`pytest -m gpu` across tests/) in one call on one GPU, made for one
# 10-minute H200 call (16 CPU cores; GDN_GPU_TIMEOUT cuts it at 530 s). pytest-xdist workers share
# the GPU, Triton's compile cache and one build each of the CUDA extension and of plugins/
# (tests/plugins/cmake_build.py), both started first, in the background (the workers run at nice 5, so
# that the builds the last tests wait for come first). The time goes to Triton
# compiles, so: each worker takes a contiguous slice of the tests (`--dist worksteal`; neighbouring
# tests share kernel specializations), with the tests that wait for a build at the end of every slice
# (tests/conftest.py), and a specialization wanted by several workers at once is compiled by one of
# them while the others wait for its cache entry (tests/triton_compiles.py).
#
#   tests/gpu_run.sh [OUT_DIR] [pytest args...]      e.g. tests/gpu_run.sh $OUT/g tests/ops/gated_delta_rule
#
# OUT_DIR (default $OUT/gpu-tests where $OUT is set, else a new folder under the temp dir, printed;
# never inside the repository): pytest.log, junit.xml, tests.tsv (each test's outcome and seconds as it
# ends, a failure's traceback under it: complete even in a run the time limit cut), compiles.tsv
# (every Triton compile: process, kernel, seconds waited and compiling), extension.log, plugins.log,
# the Triton cache (TRITON_CACHE_DIR overrides).
# GDN_GPU_WORKERS (default 14): workers on the one GPU (the tests are short and mostly wait on Triton
#   compiles and launches on the CPU); each holds its own CUDA context and caching allocator (the
#   tests give cached blocks back after each test). GDN_GPU_TIMEOUT (default 530 s).
# TensorRT headers for the plugin build: TENSORRT_INCLUDE_DIR, else .carry/tensorrt/include if present.
# Exit status: pytest's (5 if nothing was selected), 124 if the time limit cut the run (pytest runs
# -v: each outcome is a line of pytest.log as it finishes, so a cut run still names its failures).
set -u
cd "$(dirname "$0")/.."
out=${1:-}
if [ -z "$out" ]; then
  if [ -n "${OUT:-}" ]; then out=$OUT/gpu-tests; else out=$(mktemp -d "${TMPDIR:-/tmp}/gpu-tests.XXXXXX"); fi
  echo "gpu_run: writing to $out" >&2
fi
shift $(($# > 0 ? 1 : 0))
mkdir -p "$out"
out=$(cd "$out" && pwd)
workers=${GDN_GPU_WORKERS:-14}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$out/triton-cache}
export GDN_TEST_THREADS=${GDN_TEST_THREADS:-1} GDN_TEST_LOG=$out/tests.tsv GDN_TRITON_LOG=$out/compiles.tsv
rm -f "$out/tests.tsv" "$out/compiles.tsv"
if [ -z "${TENSORRT_INCLUDE_DIR:-}" ] && [ -f .carry/tensorrt/include/NvInferRuntime.h ]; then
    export TENSORRT_INCLUDE_DIR=$PWD/.carry/tensorrt/include
fi
t0=$SECONDS
python3 -c "from gdn_export.cuda import extension; extension.load()" > "$out/extension.log" 2>&1 &
python3 -c "from tests.plugins.cmake_build import _build; print(_build())" > "$out/plugins.log" 2>&1 &
timeout "${GDN_GPU_TIMEOUT:-530}" nice -n 5 python3 -m pytest -m gpu -n "$workers" --dist worksteal -p no:cacheprovider \
    -v -rfEs --durations=25 --junitxml="$out/junit.xml" tests "$@" > "$out/pytest.log" 2>&1
rc=$?
wait
echo "gpu tests: rc=$rc in $((SECONDS - t0)) s ($workers workers): $(grep -E '(passed|failed|error)' "$out/pytest.log" | tail -1)"
echo "slowest:"; grep -v "^    " "$out/tests.tsv" 2>/dev/null | sort -t$'\t' -k2,2 -rn | head -12 | cut -c1-160
grep -E "^(failed|error)" "$out/tests.tsv" 2>/dev/null | cut -f4 | sort -u | head -20
[ -s "$out/compiles.tsv" ] && python3 -m tests.triton_compiles "$out/compiles.tsv"
exit $rc
