#!/usr/bin/env bash
# session 3 device call 3: two fixes of the raw-operand walk (v2: fp32 k^T on TF32; v3: transposed state), correctness + time
set -u
export PYTHONUNBUFFERED=1
s() { local n=$1 l=$2; shift 2; local t0=$SECONDS; timeout $l "$@" > $OUT/$n.log 2>&1; local rc=$?; echo "$n rc=$rc $((SECONDS-t0))s"; }
D=.carry/exp/diag.py
A="1,200,4,128,bf16,1,- 1,200,4,128,bf16,1,1 1,200,4,128,bf16,1,2 3,1000,4,64,bf16,0,-"
B="2,4097,4,128,fp16,1,- 1,1000,4,128,bf16,0,2 8,200,32,128,bf16,1,- 8,200,32,128,bf16,1,2,64 1,65,4,64,fp16,1,1"
for K in v2 v3; do
  KDIR=.carry/exp/$K s a_$K 120 python3 $D multi $A &
  KDIR=.carry/exp/$K s b_$K 120 python3 $D multi $B &
done; wait
for K in v2 v3; do KDIR=.carry/exp/$K s t1_$K 60 python3 $D time 1 16384; KDIR=.carry/exp/$K s t8_$K 60 python3 $D time 8 8192; done
for K in v2 v3; do echo "== $K"; cat $OUT/a_$K.log $OUT/b_$K.log | grep -v "^ *wy ok\|^ *chunk ok\|^ *(" | grep -v "^Search\|^CUDA kernel" | sed 's/wy vs torch.*nonfinite/wy nonfinite/' | cut -c1-170; tail -qn 1 $OUT/t1_$K.log $OUT/t8_$K.log; done
