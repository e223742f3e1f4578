#!/usr/bin/env bash
# Run 14, device call E (right after call D): FlashInfer 0.7.2 installed from /tmp/fi + .carry/fi2;
# decode with fp32 / bf16 / fp16 states beside FlashInfer's bf16-state kernel (states rotated past
# L2), through the bare launcher and the public op; the Triton prefill of packs beside the same
# lengths as a batch (cu_seqlens now read once per tensor version).
set -u
out=$OUT/e; mkdir -p "$out" /tmp/fi; cp .carry/fi2/* /tmp/fi/ 2>/dev/null
( cd /tmp/fi && cat cu13.part.* > nvidia_cutlass_dsl_libs_cu13-4.7.1-cp312-cp312-manylinux_2_28_x86_64.whl && rm cu13.part.* \
  && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ./*.whl ) > "$out/flashinfer_install.log" 2>&1
export PYTHONPATH=$PWD:$PWD/kernels:$PWD/benchmarks:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss' "$n" "$rc" "$((SECONDS-t))")"); }
step state 300 python3 benchmarks/state_dtype_bench.py --out-dir "$out/state"
step pack 150 python3 benchmarks/prefill_pack_bench.py --no-fla --no-flashinfer --backends triton,cuda --cases 1,3,4,7 --out-dir "$out/pack"
tail -2 "$out/flashinfer_install.log"
grep -E "^\| [0-9]+ \| bf16" "$out/state/state_dtype_bench.md" 2>/dev/null || tail -5 "$out/state.log"
grep -E "^\| " "$out/pack/prefill_pack_bench.md" 2>/dev/null || tail -5 "$out/pack.log"
printf '%s\n' "${sum[@]}"
