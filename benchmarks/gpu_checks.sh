#!/usr/bin/env bash
# The GPU checks of the repo (H200 here): every GPU test, the plugin host test under
# compute-sanitizer, then the benchmarks (ours triton / ours cuda / FLA / PyTorch side by side).
#
#   benchmarks/gpu_checks.sh OUT_DIR [steps...]     steps: tests plugins bench moe state attn overhead pack
#                                                   cudaprefill e2e (default: tests plugins; a device call
#                                                   has 10 minutes: run the benchmarks in later calls)
#   tests: tests/gpu_run.sh, every `-m gpu` test across tests/ in one pytest-xdist run (< 9 min)
#   moe: benchmarks/moe_bench.py (table in OUT_DIR/moe/moe_bench.md)
#   state: benchmarks/state_dtype_bench.py (decode / prefill per recurrent-state dtype; FlashInfer's
#          bf16-state decode beside it when `import flashinfer` works)
#   attn: benchmarks/attention_decode_bench.py (split-KV decode attention vs the SDPA route) and
#         benchmarks/attention_prefill_bench.py --graph (the Triton prefill kernel vs the SDPA route)
#   pack: benchmarks/prefill_pack_bench.py (prefill batches vs cu_seqlens packs, FLA / FlashInfer beside;
#         minutes of their autotuning / compilation per new shape)
#   overhead: benchmarks/op_overhead.py (host time of one eager decode call through the public op)
#   cudaprefill: benchmarks/cuda_prefill_profile.py (per-kernel time of the CUDA prefill, each walk pinned)
#   e2e: benchmarks/e2e_bench.sh (gdn-export bench on a 1.66B-class random model vs transformers)
#
# Expects FLA wheels in .whl/ and TensorRT headers in .carry/tensorrt/include (both git-ignored,
# carried by the device tool). Logs go to OUT_DIR; a summary table is printed last (with the failed
# tests' ids, also of a step its time limit cut).
set -u
out=${1:?usage: gpu_checks.sh OUT_DIR [steps...]}
shift
steps=${*:-tests plugins}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
summary=()
run_step() { # name, timeout seconds, command...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    local tail_line failed
    tail_line=$(grep -E "passed|failed|error|PASS|FAIL" "$out/$name.log" | tail -1 | cut -c1-90)
    # pytest runs -v: each test's outcome is its own line as it finishes, so a step cut by its time
    # limit still names its failures (the summary line comes only at the end)
    failed=$(grep -E "(FAILED|ERROR) tests/|tests/.*(FAILED|ERROR)" "$out/$name.log" | sed -E 's/.*(tests\/[^ ]*).*/\1/' | sort -u | head -5 | tr '\n' ' ')
    summary+=("$(printf '%-8s rc=%-3s %4ss  %s%s' "$name" "$rc" "$((SECONDS - t0))" "$tail_line" "${failed:+  failed: $failed}")")
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$out/gpu.txt"
for s in $steps; do
    case $s in
        # its build alone takes ~150 s on the H200 host
        plugins) run_step plugins 480 plugins/tests/runOnDevice.sh "$out/plugins" 90 "$PWD/.carry/tensorrt/include" ;;
        tests) run_step tests 560 tests/gpu_run.sh "$out/tests" ;;
        state) run_step state 240 python3 benchmarks/state_dtype_bench.py --out-dir "$out/state" ;;
        attn) run_step attn 90 python3 benchmarks/attention_decode_bench.py --out-dir "$out/attn"
              run_step attn_pf 90 python3 benchmarks/attention_prefill_bench.py --graph --out-dir "$out/attn" ;;
        pack) run_step pack 480 python3 benchmarks/prefill_pack_bench.py --out-dir "$out/pack" ;;
        overhead) run_step overhead 90 python3 benchmarks/op_overhead.py --out "$out/overhead" ;;
        cudaprefill) run_step cudaprefill 90 python3 benchmarks/cuda_prefill_profile.py --out-dir "$out/cudaprefill" ;;
        e2e) run_step e2e 560 bash benchmarks/e2e_bench.sh "$out/e2e" ;;
        bench) run_step bench 200 python3 benchmarks/bench_kernels.py --out "$out/bench" --cuda ;;
        moe) run_step moe_bench 240 python3 benchmarks/moe_bench.py --out "$out/moe" ;;
    esac
done
echo "GPU: $(cat "$out/gpu.txt")"
printf '%s\n' "${summary[@]}"
