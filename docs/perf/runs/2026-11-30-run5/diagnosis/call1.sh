#!/usr/bin/env bash
# session 3 device call 1: where does the raw-operand (wip) prefill fault; per-kernel times main vs wip; decode cache hints
set -u
export PYTHONUNBUFFERED=1
s() { local n=$1 l=$2; shift 2; local t0=$SECONDS; timeout $l "$@" > $OUT/$n.log 2>&1; local rc=$?; echo "$n rc=$rc $((SECONDS-t0))s"; tail -n 4 $OUT/$n.log | sed 's/^/    /'; }
W=.carry/exp/wip; M=kernels; D=.carry/exp/diag.py
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
CUDA_LAUNCH_BLOCKING=1 KDIR=$W s wip_small 90 python3 $D check 1 200 4 128 bf16 1
CUDA_LAUNCH_BLOCKING=1 KDIR=$W s wip_small_st1 60 python3 $D check 1 200 4 128 bf16 1 1
CUDA_LAUNCH_BLOCKING=1 KDIR=$W s wip_fp32 60 python3 $D check 1 200 4 128 fp32 1
CUDA_LAUNCH_BLOCKING=1 KDIR=$W s wip_d64 60 python3 $D check 3 1000 4 64 bf16 0
if grep -q "chunk ok" $OUT/wip_small.log; then :; else
  KDIR=$W s wip_memcheck 120 compute-sanitizer --tool memcheck --show-backtrace no --print-limit 5 python3 $D check 1 130 2 128 bf16 1
fi
KDIR=$M s main_t1 60 python3 $D time 1 16384
KDIR=$M s main_t8 60 python3 $D time 8 8192
KDIR=$W s wip_t1 60 python3 $D time 1 16384
KDIR=$W s wip_t8 60 python3 $D time 8 8192
KDIR=$W s wip_t1_w8 60 python3 $D time 1 16384 - 8
KDIR=$M s dec_main 60 python3 $D decode 64 256
KDIR=.carry/exp/dec s dec_hint 60 python3 $D decode 64 256
echo "== summary"; grep -h "^check\|^time\|^decode\|Error\|error" $OUT/*.log | cut -c1-160 | head -40
