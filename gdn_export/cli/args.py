"""Flags every subcommand spells the same way, their strict parsers, and the output checks.

Each shared flag is declared here once, with one default and one help stem; a subcommand adds it
to the argument group it belongs to (Polygraphy's style: help lists flags by what they configure):

    p = sub.add_parser(...)                  # help shows every flag's default (HelpFormatter)
    g = p.add_argument_group("PyTorch model")
    add_dtype(g, "the PyTorch model")        # --dtype {fp32,fp16,bf16}: a checkpoint's fp32, an export's own
    add_device(g, "the PyTorch model")       # --device DEVICE: cpu
    add_op_backend(g)                        # --op-backend {reference,triton,cuda}: gdn_export.ops.backends
    add_plugins(p, "the engine")             # --plugins PATH: $GDN_EXPORT_PLUGINS, then plugins/build/
    add_seed(p)                              # --seed N: 0
    add_overwrite(p)                         # --overwrite: the one overwrite policy
    ...
    def run(args):
        device = device_of(args)                              # the default applied
        out = output_file(args.output, "-o", args)           # before any slow work
        ids = parse_input_ids(args.input_ids)                 # strict: "1,2,3" only

--dtype, --device and --op-backend parse to None when not given, so that a command can refuse one
that does not apply (run's trt backend takes none of them); `dtype_of`, `device_of` and
`op_backend_of` apply the default.

`output_file` / `output_dir` check that the output can be written (gdn_export.paths): folder
exists and accepts files, free space, and an existing output refused unless --overwrite.
"""

from __future__ import annotations

import argparse
import re

from gdn_export.errors import InputError
from gdn_export.paths import check_output_dir, check_output_file, check_readable

DTYPES = ("fp32", "fp16", "bf16")
_TOKEN = re.compile(r"[0-9]+")  # ASCII digits only: int() would also take "1_0", " 1" and "１"


class HelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to every flag's help, "(default: off)" to a switch, unless the help
    already names its default or there is none to name (a flag whose absence means "not given")."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if "default" in text or not action.option_strings or default is argparse.SUPPRESS:
            return text
        if default is False:  # a switch
            return f"{text} (default: off)"
        if default is None or default == []:
            return text
        return f"{text} (default: %(default)s)"


class ArgumentParser(argparse.ArgumentParser):
    """argparse.ArgumentParser with HelpFormatter whose usage errors are one line (`PROG: error:
    MESSAGE`, exit 2, the usage left to --help); subparsers inherit the class."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ------------------------------------------------------------------ shared flags

DEFAULT_DTYPE = "fp32"  # of a checkpoint; an exported model keeps its own
DEFAULT_DEVICE = "cpu"


def add_dtype(parser, what: str = "the model") -> None:
    """--dtype {fp32,fp16,bf16} of `what` (None when not given: `dtype_of`)."""
    parser.add_argument("--dtype", choices=DTYPES, default=None,
                        help=f"precision of {what} (default: fp32 for a checkpoint; an exported model "
                        "keeps the precision it was exported in)")


def dtype_of(args, exported: str | None = None) -> str:
    """--dtype, else the exported model's precision `exported` (fp32 / fp16 / bf16) if known, else fp32."""
    return args.dtype or exported or DEFAULT_DTYPE


def add_device(parser, what: str, note: str = "") -> None:
    """--device where `what` runs, `note` added (None when not given: `device_of`)."""
    parser.add_argument("--device", default=None, metavar="DEVICE",
                        help=f"where {what} runs: cpu, cuda, cuda:1, ...{'; ' + note if note else ''} "
                        f"(default: {DEFAULT_DEVICE})")


def device_of(args) -> str:
    return args.device or DEFAULT_DEVICE


class _BackendNames:
    """The names of the gdn op backend registry (gdn_export.ops.backends.names()) as argparse
    choices, read when first asked (a parse of --op-backend, --help), so that building the parser
    imports no torch."""

    def _names(self) -> list[str]:
        from gdn_export.ops.backends import names

        return names()

    def __contains__(self, name) -> bool:
        return name in self._names()

    def __iter__(self):
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


def add_op_backend(parser) -> None:
    """--op-backend: the registry's backends (None when not given: `op_backend_of`)."""
    parser.add_argument("--op-backend", choices=_BackendNames(), default=None,
                        help="implementation of the gdn ops in PyTorch (gdn_export/ops/backends.py) "
                        "(default: $GDN_EXPORT_BACKEND, else reference on the CPU and triton on CUDA)")


def op_backend_of(args, device: str) -> str | None:
    """--op-backend, else None where $GDN_EXPORT_BACKEND is set (the registry applies it, and its ops
    name it when it cannot run here: gdn_export.ops.backends), else reference on the CPU and triton
    on a CUDA `device`."""
    import os

    from gdn_export.ops.backends import ENV_VAR

    if getattr(args, "op_backend", None):
        return args.op_backend
    if os.environ.get(ENV_VAR):
        return None
    return "triton" if device.startswith("cuda") else "reference"


MAX_SEED = 2**63 - 1  # torch.manual_seed and numpy's generators take any seed in [0, 2**63)


def seed(text: str) -> int:
    """argparse type of --seed: an integer in [0, 2**63), refused in one line otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**63 - 1], got {text}")
    return value


def add_seed(parser, what: str = "the random numbers") -> None:
    parser.add_argument("--seed", type=seed, default=0, help=f"seed of {what}")


def add_plugins(parser, used_for: str = "the TensorRT engine") -> None:
    parser.add_argument("--plugins", metavar="PATH", default=None,
                        help=f"the plugin library libgdn_plugins.so for {used_for} (default: "
                        "$GDN_EXPORT_PLUGINS, then plugins/build/libgdn_plugins.so; docs/tensorrt.md "
                        "'Building the plugin library')")


def add_overwrite(parser, what: str = "the output") -> None:
    condition = "" if " when " in what else " if it exists"
    parser.add_argument("--overwrite", action="store_true",
                        help=f"replace {what}{condition} (without it, an existing output is an error)")


def add_quiet(parser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


# ------------------------------------------------------------------ outputs

def output_file(path, flag: str, args=None, *, need_bytes: int = 0, suffix: str | None = None,
                also=()):
    """gdn_export.paths.check_output_file with the message naming `flag PATH` and the overwrite
    policy taken from args.overwrite (False when args has none)."""
    return check_output_file(path, f"{flag} {path}".strip(), overwrite=bool(getattr(args, "overwrite", False)),
                             need_bytes=need_bytes, suffix=suffix, also=also)


def output_dir(path, flag: str, args=None, *, need_bytes: int = 0, replaceable=None):
    """gdn_export.paths.check_output_dir, named and with the overwrite policy as `output_file`."""
    return check_output_dir(path, f"{flag} {path}".strip(), overwrite=bool(getattr(args, "overwrite", False)),
                            need_bytes=need_bytes, replaceable=replaceable)


# ------------------------------------------------------------------ inputs

def checkpoint_dir(path) -> None:
    """InputError unless `path` is a listable folder: "not found", "is a file", or "permission denied"
    (Path.is_dir() would call an unreadable folder missing, or raise)."""
    check_readable(path, "checkpoint folder", folder=True, error=InputError)


def input_file(path, what: str) -> None:
    """InputError unless `path` is a readable file (reason named, as checkpoint_dir)."""
    check_readable(path, what, error=InputError, missing="{path}: no such {what}")


# ------------------------------------------------------------------ strict parsing

def parse_input_ids(rows: list[str], flag: str = "--input-ids"):
    """`--input-ids 1,2,3 --input-ids 4,5` into a list of int64 arrays, one per row (any lengths).

    Strict: each row is ID[,ID...] with every ID a non-negative ASCII integer; an empty row, an
    empty item (`1,,2`, `1,2,`), spaces (`1, 2`), signs, non-integers are an InputError naming the
    row and the item (the ids' upper bound, the vocab size, is checked by the runner)."""
    import numpy as np

    if not rows:
        raise InputError(f"{flag} is empty: give at least one token id")
    parsed = []
    for row in rows:
        if not row.strip(", \t"):
            raise InputError(f"{flag} {row!r} is empty: give token ids such as 1,2,3")
        for i, tok in enumerate(row.split(",")):
            if tok == "":
                where = "first" if i == 0 else "last" if i == row.count(",") else f"{i + 1}."
                raise InputError(f"{flag} {row!r}: the {where} token id is empty (write ids as "
                                 f"1,2,3: one comma between ids, no spaces)")
            if not _TOKEN.fullmatch(tok):
                if re.fullmatch(r"-[0-9]+", tok):
                    raise InputError(f"{flag} {row!r}: token ids must be >= 0, got {tok!r}")
                spaces = " (no spaces: write 1,2,3)" if tok.strip() != tok or " " in tok else ""
                raise InputError(f"{flag} {row!r}: token ids must be integers, got {tok!r}{spaces}")
        ids = [int(tok) for tok in row.split(",")]
        big = next((i for i in ids if i >= 2**63), None)
        if big is not None:  # numpy would raise OverflowError
            raise InputError(f"{flag} {row!r}: token id {big} is out of range")
        parsed.append(np.asarray(ids, dtype=np.int64))
    return parsed
