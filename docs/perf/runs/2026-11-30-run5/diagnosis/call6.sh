#!/usr/bin/env bash
# session 3 device call 6: wy vs torch and chunk on torch intermediates at D = 16 / 24 (bf16 wrong there)
set -u
export PYTHONUNBUFFERED=1 CUDA_LAUNCH_BLOCKING=1
D=.carry/exp/diag.py
KDIR=kernels timeout 100 python3 $D multi 2,130,4,16,bf16,0,- 2,130,4,24,bf16,0,- 2,130,4,24,bf16,0,-,16 2,130,4,24,bf16,0,-,64 2,130,4,16,bf16,0,-,32 2,130,4,48,bf16,0,- 2,130,4,24,fp16,0,- 2>&1 | grep -v "^ *(\|ok$" | sed 's/: wy vs torch//' | cut -c1-190
