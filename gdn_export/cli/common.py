"""Argument groups and small helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import re
import sys
import time

from gdn_export.errors import GdnExportError, InputError

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


_SHAPE = re.compile(r"^(?P<name>[^:]+):\[(?P<dims>[0-9, ]*)\]$")


def parse_shape_specs(specs: list[str], flag: str) -> dict[str, tuple[int, ...]]:
    """trtexec / Polygraphy `name:[d0,d1,...]` (several per flag, or comma-joined)."""
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        for part in re.findall(r"[^,\[\]]+:\[[^\]]*\]", spec) or [spec]:
            m = _SHAPE.match(part.strip())
            if not m:
                raise InputError(f"{flag} {part!r}: expected NAME:[d0,d1,...]")
            dims = tuple(int(d) for d in m["dims"].replace(" ", "").split(",") if d)
            out[m["name"]] = dims
    return out


def parse_input_ids(rows: list[str]):
    """`--input-ids 1,2,3 --input-ids 4,5,6` into an int64 array [B, T] (rows of equal length)."""
    import numpy as np

    if not rows:
        raise InputError("--input-ids is empty: give at least one token id")
    parsed = []
    for row in rows:
        try:
            ids = [int(tok) for tok in row.replace(" ", ",").split(",") if tok]
        except ValueError:
            raise InputError(f"--input-ids {row!r}: token ids must be integers") from None
        if not ids:
            raise InputError("--input-ids is empty: give at least one token id")
        parsed.append(ids)
    if len({len(r) for r in parsed}) != 1:
        raise InputError(f"--input-ids rows differ in length ({[len(r) for r in parsed]}); pad them to one length")
    return np.asarray(parsed, dtype=np.int64)


def fail(message: str) -> "GdnExportError":
    return GdnExportError(message)
