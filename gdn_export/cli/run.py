"""`gdn-export run MODEL --input-ids ... --max-new-tokens N`: greedy generation on one backend."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gdn_export.cli.common import DTYPES, Progress, add_quiet, parse_input_ids
from gdn_export.cli.runners import BACKENDS, open_runner
from gdn_export.errors import InputError


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="greedy generation with torch, ONNX Runtime or TensorRT",
                       description="Prefill the prompt, then decode greedily with the recurrent "
                       "state, conv state and KV cache kept by the backend.")
    p.add_argument("model", help="checkpoint folder (torch), .onnx (ort) or .engine (trt)")
    p.add_argument("--backend", choices=BACKENDS, help="default: from the MODEL path")
    p.add_argument("--input-ids", action="append", default=[], metavar="ID,ID,...", required=True,
                   help="prompt token ids; repeat the flag for a batch (rows of equal length)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--save-logits", metavar="OUT.npz",
                   help="save the logits of every step (step_0 = prefill [B, T, V], then [B, 1, V])")
    p.add_argument("--dtype", choices=DTYPES, default="fp32", help="torch backend precision")
    p.add_argument("--device", default="cpu", help="torch backend device (cpu, cuda)")
    p.add_argument("--op-backend", choices=("reference", "triton", "cuda"),
                   help="torch backend: implementation of the gdn ops (default reference)")
    p.add_argument("--plugins", help="trt backend: path of libgdn_plugins.so")
    add_quiet(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    import numpy as np

    from gdn_export.runtime.base import generate

    if args.max_new_tokens < 0:
        raise InputError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    ids = parse_input_ids(args.input_ids)
    progress = Progress("run", args.quiet)
    runner = open_runner(args.model, args.backend, dtype=args.dtype, device=args.device,
                         plugins=args.plugins, op_backend=args.op_backend)
    progress(f"{runner.backend}: prefill {ids.shape[1]} tokens x {ids.shape[0]}, then "
             f"{args.max_new_tokens} decode steps")
    result = generate(runner, ids, args.max_new_tokens)
    for row in result.tokens:
        print(" ".join(str(int(t)) for t in row))
    if args.save_logits:
        path = Path(args.save_logits)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".npz", dir=path.parent or ".")
        os.close(fd)
        try:
            np.savez(tmp, tokens=result.tokens,
                     **{f"step_{i}": lg for i, lg in enumerate(result.step_logits)})
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        progress(f"saved {len(result.step_logits)} steps of logits to {path}")
    return 0
