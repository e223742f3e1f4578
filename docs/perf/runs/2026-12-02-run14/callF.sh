#!/usr/bin/env bash
# Run 14, device call F: the Triton varlen tests on the GPU (call D's run of the whole file ran past its
# 200 s without a failure before reaching them): packed sequences, the chunk table, cu_seqlens read
# once per tensor version, bad cu_seqlens.
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1; mkdir -p $OUT/f
timeout 240 python3 -m pytest -q -rf -p no:cacheprovider -n 4 tests/kernels/test_gated_delta_rule_kernels.py \
  -k "cu_seqlens or chunk_indices or varlen or bad" > $OUT/f/triton_varlen.log 2>&1; echo rc=$?; tail -3 $OUT/f/triton_varlen.log
