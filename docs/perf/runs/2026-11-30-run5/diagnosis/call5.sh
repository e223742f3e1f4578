#!/usr/bin/env bash
# session 3 device call 5: which launch faults on the tiny models' head shapes (Dk=16, Dv=24, Hv=2Hk)
set -u
export PYTHONUNBUFFERED=1 CUDA_LAUNCH_BLOCKING=1
D=.carry/exp/diag.py
r() { local n=$1 kd=$2; shift 2; KDIR=$kd timeout 100 python3 $D check2 "$@" > $OUT/$n.log 2>&1; echo "$n rc=$? $(grep -c ' ok' $OUT/$n.log) ok: $(grep -h '^check2\|Error' $OUT/$n.log | head -2 | cut -c1-150)"; }
r a kernels 2 63 2 4 16 24 bf16 &
r b kernels 2 63 2 4 16 24 fp32 &
r c kernels 2 130 2 4 32 32 bf16 &
r d kernels 2 130 2 4 16 16 bf16 &
r e kernels 2 130 2 4 64 24 bf16 &
r f kernels 2 130 2 4 16 64 bf16 &
r g kernels 2 130 4 4 16 24 bf16 &
r h kernels 2 130 2 4 32 48 bf16 &
r a4 .carry/exp/v4 2 63 2 4 16 24 bf16 &
r b4 .carry/exp/v4 2 63 2 4 16 24 fp32 &
wait
