"""Argument groups and small helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import sys
import time

# Shared flags, strict parsers and output checks live in gdn_export.cli.args.
from gdn_export.cli.args import (DTYPES, add_device, add_dtype, add_op_backend, add_overwrite,  # noqa: F401
                                 add_plugins, add_quiet, add_seed, checkpoint_dir, device_of, dtype_of,
                                 input_file, op_backend_of, output_dir, output_file, parse_input_ids)
from gdn_export.errors import InputError

TORCH_DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def torch_dtype(name: str):
    import torch

    return getattr(torch, TORCH_DTYPE_NAMES[name])


class Progress:
    """One line per phase on stderr, with the seconds since the command started."""

    def __init__(self, prefix: str, quiet: bool = False):
        self.prefix, self.quiet, self.t0 = prefix, quiet, time.perf_counter()

    def __call__(self, message: str) -> None:
        if not self.quiet:
            dt = time.perf_counter() - self.t0
            print(f"[{self.prefix} {dt:6.1f}s] {message}", file=sys.stderr, flush=True)


def add_tolerances(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("tolerances (|actual - expected| <= atol + rtol * |expected|)")
    g.add_argument("--atol", nargs="+", default=[], metavar="[TENSOR:]VALUE",
                   help="absolute tolerance; TENSOR:VALUE overrides one tensor (e.g. logits:1e-3) "
                   "(default: per dtype, gdn_export.validate.compare.default_tolerances; with static FP8 "
                   "activations a row within one e4m3 rounding step also passes, named on the row, unless "
                   "--atol / --rtol is given)")
    g.add_argument("--rtol", nargs="+", default=[], metavar="[TENSOR:]VALUE",
                   help="relative tolerance, same form as --atol (default: per dtype); for a graph of "
                   "`export --speculative`: the bound on each output's max |error| / max |reference| "
                   "(default: per dtype, gdn_export.validate.speculative.BOUNDS)")


def parse_tolerances(atol_args, rtol_args, default_atol: float, default_rtol: float):
    """Polygraphy-style `--atol 1e-4 logits:1e-3` into a Tolerances object."""
    from gdn_export.validate import Tolerances

    tol = Tolerances(default_atol, default_rtol)
    for which, items in (("atol", atol_args), ("rtol", rtol_args)):
        for item in items:
            name, _, value = item.rpartition(":")
            try:
                number = float(value)
            except ValueError:
                raise InputError(f"--{which} {item!r}: {value!r} is not a number") from None
            if not number >= 0:  # NaN too: every comparison with it fails
                raise InputError(f"--{which} {item!r}: tolerances must be numbers >= 0")
            if not name:
                setattr(tol, which, number)
            else:
                a, r = tol.per_tensor.get(name, (None, None))
                tol.per_tensor[name] = (number, r) if which == "atol" else (a, number)
    return tol


def check_at_least(value: int, low: int, flag: str) -> int:
    if value < low:
        raise InputError(f"{flag} must be >= {low}, got {value}")
    return value


def check_output_file(path: str, flag: str, args=None):
    """gdn_export.cli.args.output_file (the overwrite policy from args.overwrite)."""
    return output_file(path, flag, args)


def save_logits(args, result, progress) -> None:
    """--save-logits: generated [B, N], prompt_lengths [B] and step_i logits in one .npz, written
    under a temporary name and moved into place (an output that appeared meanwhile is kept unless
    --overwrite)."""
    import numpy as np

    from gdn_export.paths import atomic_file

    with atomic_file(args.save_logits, f"--save-logits {args.save_logits}", overwrite=args.overwrite) as tmp:
        with open(tmp, "wb") as f:  # a file object: savez would add .npz to another name
            np.savez(f, generated=result.generated, prompt_lengths=result.prompt_lengths,
                     **{f"step_{i}": lg for i, lg in enumerate(result.step_logits)})
    progress(f"saved {len(result.step_logits)} steps of logits to {args.save_logits}")
