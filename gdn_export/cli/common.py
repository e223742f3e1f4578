"""Argument groups and small helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from gdn_export.errors import InputError

DTYPES = ("fp32", "fp16", "bf16")
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


def add_quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


def add_tolerances(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("tolerances (|actual - expected| <= atol + rtol * |expected|)")
    g.add_argument("--atol", nargs="+", default=[], metavar="[TENSOR:]VALUE",
                   help="absolute tolerance; TENSOR:VALUE overrides one tensor (e.g. logits:1e-3)")
    g.add_argument("--rtol", nargs="+", default=[], metavar="[TENSOR:]VALUE",
                   help="relative tolerance, same form as --atol")


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
            if number < 0:
                raise InputError(f"--{which} {item!r}: tolerances must be >= 0")
            if not name:
                setattr(tol, which, number)
            else:
                a, r = tol.per_tensor.get(name, (None, None))
                tol.per_tensor[name] = (number, r) if which == "atol" else (a, number)
    return tol


def parse_input_ids(rows: list[str]):
    """`--input-ids 1,2,3 --input-ids 4,5` into a list of int64 arrays, one per row (any lengths)."""
    import numpy as np

    if not rows:
        raise InputError("--input-ids is empty: give at least one token id")
    parsed = []
    for row in rows:
        tokens = [tok for tok in row.replace(" ", ",").split(",") if tok]
        # ASCII digits only: int() would also take "1_0" and full-width digits.
        bad = next((tok for tok in tokens if not re.fullmatch(r"-?[0-9]+", tok)), None)
        if bad is not None:
            raise InputError(f"--input-ids {row!r}: token ids must be integers, got {bad!r}")
        ids = [int(tok) for tok in tokens]
        big = next((i for i in ids if not -2**63 <= i < 2**63), None)
        if big is not None:  # numpy would raise OverflowError
            raise InputError(f"--input-ids {row!r}: token id {big} is out of range")
        if not ids:
            raise InputError("--input-ids is empty: give at least one token id")
        parsed.append(np.asarray(ids, dtype=np.int64))
    return parsed


def check_output_file(path: str, flag: str) -> Path:
    """Fail before any slow work when `path` cannot be written: its folder is missing or it is
    a folder itself (otherwise the mistake would surface only after loading / running)."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{flag} {path}: is a folder")
    if not p.parent.is_dir():
        raise InputError(f"{flag} {path}: folder {p.parent} does not exist")
    return p


def check_at_least(value: int, low: int, flag: str) -> int:
    if value < low:
        raise InputError(f"{flag} must be >= {low}, got {value}")
    return value
