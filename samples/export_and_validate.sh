#!/usr/bin/env bash
# End to end on a tiny random Qwen3-Next checkpoint: make it, export it, generate, validate.
# Usage: samples/export_and_validate.sh [WORKDIR]
set -euo pipefail
work=${1:-$(mktemp -d)}
gdn-export make-tiny "$work/ckpt" --family qwen3_next --seed 1 --overwrite
gdn-export export "$work/ckpt" -o "$work/model.onnx"
gdn-export run "$work/ckpt" --input-ids 5,17,42 --max-new-tokens 6 --save-logits "$work/torch.npz"
gdn-export run "$work/model.onnx" --input-ids 5,17,42 --max-new-tokens 6 --save-logits "$work/ort.npz"
gdn-export validate "$work/ckpt" --onnx "$work/model.onnx" --json "$work/report.json"
echo "outputs in $work"
