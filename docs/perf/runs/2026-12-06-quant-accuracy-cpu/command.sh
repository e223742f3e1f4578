#!/usr/bin/env bash
# 2026-12-06, the 2-core development machine (shared: load average 7-11 during the runs), torch
# 2.13.0+cpu, transformers 5.24.0, tokenizers 0.23.3, ModelOpt 0.47.0, Python 3.11.7's standard library.
# Training: 600 steps bounded (the time bound of 45 min did not bind: 1663 s); one torch thread, since
# two threads waited on each other under that load (15 steps: 58 s with one, 368 s with two).
set -e
python3 benchmarks/train_small.py /tmp/trained/cpu --preset cpu --mtp --steps 600 --minutes 45 --threads 1 \
  --device cpu 2> train.log
python3 benchmarks/quant_accuracy.py /tmp/trained/cpu --windows 256 --prompts 32 --new-tokens 32 --threads 1 \
  --out . 2> quant_accuracy.log
