#!/usr/bin/env bash
# Build plugins/ and run pluginHostTest on a GPU machine: the full grid, then compute-sanitizer
# memcheck and racecheck on the --quick subset. Logs and the markdown table go to OUT_DIR; a short
# summary is printed last. Exit status: 0 only if every step passed.
#
#   plugins/tests/runOnDevice.sh OUT_DIR [CUDA_ARCHS] [TENSORRT_INCLUDE_DIR]
#   e.g. plugins/tests/runOnDevice.sh "$OUT" 90 "$PWD/.carry/tensorrt/include"
set -u
out=${1:?usage: runOnDevice.sh OUT_DIR [CUDA_ARCHS] [TENSORRT_INCLUDE_DIR]}
archs=${2:-90}
headers=${3:-}
here=$(cd "$(dirname "$0")/.." && pwd)
build="${GDN_BUILD_DIR:-$here/build/device}"
mkdir -p "$out"
summary=()
status=0

step() { # name, timeout seconds, command...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    summary+=("$(printf '%-10s rc=%-3s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
    [ "$rc" -eq 0 ] || status=1
    return "$rc"
}

nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader > "$out/gpu.txt" 2>&1
cfg=(-S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=$archs")
[ -n "$headers" ] && cfg+=("-DTENSORRT_INCLUDE_DIR=$headers")
if step configure 60 cmake "${cfg[@]}" && step build 300 cmake --build "$build" -j "$(nproc)"; then
    step full 90 "$build/pluginHostTest" --markdown "$out/host_test.md"
    sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    step memcheck 90 "$sanitizer" --tool memcheck --leak-check full --error-exitcode 3 \
        "$build/pluginHostTest" --quick --markdown "$out/memcheck.md"
    step racecheck 120 "$sanitizer" --tool racecheck --error-exitcode 3 \
        "$build/pluginHostTest" --quick --markdown "$out/racecheck.md"
fi
echo "GPU: $(cat "$out/gpu.txt")"
printf '%s\n' "${summary[@]}"
for f in full memcheck racecheck; do
    [ -f "$out/$f.log" ] && { echo "--- $f (tail)"; grep -E "FAIL|ERROR SUMMARY|RACECHECK SUMMARY|ALL PASSED|FAILED" "$out/$f.log" | tail -8; }
done
exit "$status"
