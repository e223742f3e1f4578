#!/usr/bin/env bash
# session 3 device call 2: localise the NaNs of the raw-operand prefill (wy vs torch; chunk on torch intermediates)
set -u
export PYTHONUNBUFFERED=1
s() { local n=$1 l=$2; shift 2; local t0=$SECONDS; timeout $l "$@" > $OUT/$n.log 2>&1; local rc=$?; echo "$n rc=$rc $((SECONDS-t0))s"; }
D=.carry/exp/diag.py
CASES="1,200,4,128,bf16,1,- 1,200,4,128,bf16,1,1 1,200,4,128,bf16,1,- 3,1000,4,64,bf16,0,- 3,1000,4,64,bf16,0,- 2,4097,4,128,fp16,1,- 1,1000,4,128,bf16,0,2"
for K in wip v1; do KDIR=.carry/exp/$K s multi_$K 150 python3 $D multi $CASES & done; wait
KDIR=.carry/exp/v1 s fp32_v1 150 python3 $D multi 1,200,4,128,fp32,1,- 3,1000,4,64,fp32,0,1
KDIR=.carry/exp/v1 s v1_t1 60 python3 $D time 1 16384
for K in wip v1; do echo "== $K"; grep -v "^ *wy ok\|^ *chunk ok" $OUT/multi_$K.log | cut -c1-200; done
echo "== fp32 v1"; cat $OUT/fp32_v1.log | cut -c1-200; tail -n 2 $OUT/v1_t1.log
