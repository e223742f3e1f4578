"""`gdn-export run MODEL --input-ids ... --max-new-tokens N`: greedy generation on one backend."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gdn_export.cli.common import DTYPES, Progress, add_quiet, check_output_file, parse_input_ids
from gdn_export.cli.runners import BACKENDS, guess_backend, open_runner
from gdn_export.errors import InputError


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="greedy generation with torch, ONNX Runtime or TensorRT",
                       description="Prefill the prompt, then decode greedily with the recurrent "
                       "state, conv state and KV cache kept by the backend. Prints one line per "
                       "row: the prompt's ids, then the generated ids.")
    p.add_argument("model", help="checkpoint folder (torch), .onnx (ort) or .engine (trt)")
    p.add_argument("--backend", choices=BACKENDS, help="default: from the MODEL path")
    p.add_argument("--input-ids", action="append", default=[], metavar="ID,ID,...", required=True,
                   help="prompt token ids; repeat the flag for a batch (rows of equal length)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--save-logits", metavar="OUT.npz",
                   help="save the logits of every step (step_0 = prefill [B, T, V], then [B, 1, V])")
    p.add_argument("--dtype", choices=DTYPES, help="torch backend precision (default fp32; an "
                   "exported model keeps the precision it was exported in)")
    p.add_argument("--device", help="torch backend device (default cpu; cuda, cuda:1, ...)")
    p.add_argument("--op-backend", choices=("reference", "triton", "cuda"),
                   help="torch backend: implementation of the gdn ops (default reference)")
    p.add_argument("--plugins", help="trt backend: path of libgdn_plugins.so")
    add_quiet(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    import numpy as np

    from gdn_export.runtime.base import check_input_ids, generate

    if args.max_new_tokens < 0:
        raise InputError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    ids = parse_input_ids(args.input_ids)
    if args.save_logits:
        check_output_file(args.save_logits, "--save-logits")
    backend = args.backend or guess_backend(args.model)
    _check_flags_apply(args, backend)
    progress = Progress("run", args.quiet)
    runner = open_runner(args.model, backend, dtype=args.dtype or "fp32", device=args.device or "cpu",
                         plugins=args.plugins, op_backend=args.op_backend)
    check_input_ids(ids, runner.vocab_size)  # before the progress line: the error stays one line
    progress(f"{runner.backend}: prefill {ids.shape[1]} tokens x {ids.shape[0]} rows, then greedy "
             f"decoding of {args.max_new_tokens} new tokens")
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


def _check_flags_apply(args, backend: str) -> None:
    """A flag of another backend would be ignored without a word (`run m.onnx --dtype fp16`
    would still run the fp32 graph)."""
    only = {"--dtype": (args.dtype, "torch"), "--device": (args.device, "torch"),
            "--op-backend": (args.op_backend, "torch"), "--plugins": (args.plugins, "trt")}
    for flag, (value, owner) in only.items():
        if value is not None and backend != owner:
            raise InputError(f"{flag} applies to the {owner} backend only; {args.model} runs on {backend}")
