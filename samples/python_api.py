"""The Python API behind the command line: load, run with the cache, export, compare with ORT.

    python samples/python_api.py [WORKDIR]
"""

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from gdn_export.layout import DeployLayout
from gdn_export.onnx.export import export_onnx
from gdn_export.runtime.base import generate
from gdn_export.runtime.ort_runner import OrtRunner
from gdn_export.runtime.torch_runner import TorchRunner
from gdn_export.weights import load_checkpoint
from gdn_export.weights.tiny import make_tiny_checkpoint


def main(work: Path) -> None:
    ckpt = make_tiny_checkpoint(work / "ckpt", family="qwen3_5", seed=3, overwrite=True)
    model = load_checkpoint(ckpt, dtype=torch.float32)

    # The deployment layout: an in-place K/V cache of 64 slots, logits of each row's last token.
    model.layout = DeployLayout.make(cache_len=64)

    # One forward serves prefill and decode: the states are an explicit flat tuple, and rows of a
    # batch have their own lengths (right-padded) and their own positions.
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    past, lens = torch.tensor([0, 0]), torch.tensor([4, 2])
    logits, *states = model(ids, past, lens, *model.empty_states(2))
    print("prefill logits", tuple(logits.shape), "states", [tuple(s.shape) for s in states])

    onnx_path = export_onnx(model, work / "model.onnx", progress=print)
    prompts = [np.array([1, 2, 3, 4]), np.array([5, 6])]
    torch_out = generate(TorchRunner(model), prompts, max_new_tokens=5)
    ort_out = generate(OrtRunner(onnx_path), prompts, max_new_tokens=5)
    print("torch tokens", torch_out.generated.tolist())
    print("ort   tokens", ort_out.generated.tolist())
    worst = max(float(np.abs(a - b).max()) for a, b in zip(torch_out.step_logits, ort_out.step_logits))
    print(f"max |logit difference| torch vs ORT: {worst:.2e}")
    assert (torch_out.generated == ort_out.generated).all() and worst < 1e-4


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()))
