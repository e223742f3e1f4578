#!/usr/bin/env bash
# Run 13, device call F (the session's last device seconds): the ragged-pack walk tests in their final
# form (each width on the device's shared memory and capped at 99 KB, bit-equal between the two).
set -u
out=$OUT/f; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
timeout 170 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_chunk_walk_cuda.py -k "ragged or small_gpus" > "$out/walk.log" 2>&1
echo "walk rc=$? $(tail -1 "$out/walk.log")"
