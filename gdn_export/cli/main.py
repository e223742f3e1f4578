"""`gdn-export` command line: make-tiny, quantize, export, build, run, validate, demo, bench, serve."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from gdn_export import __version__
from gdn_export.cli.args import ArgumentParser
from gdn_export.cli import bench, build, demo, export, make_tiny, quantize, run, serve, validate
from gdn_export.errors import GdnExportError

SUBCOMMANDS = (demo, make_tiny, quantize, export, build, run, validate, bench, serve)


def make_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="gdn-export",
        description="Export hybrid Gated DeltaNet language models (Qwen3-Next, Qwen3.5 dense and MoE, "
        "their VL checkpoints' language model, OLMo-Hybrid) to ONNX and TensorRT, run them, and "
        "check their numerical parity. Every command that writes refuses an existing output unless "
        "--overwrite is given, and checks its outputs before the work.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return parser


def _subparser(parser, command: str):
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[command]


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # said by the subcommand's parser, so that the line names the command
            _subparser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help, --version, a usage error (one line, see ArgumentParser)
        return exc.code if isinstance(exc.code, int) else 2
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="gdn-export: %(levelname)s: %(message)s")
    try:
        return int(args.handler(args) or 0)
    except GdnExportError as exc:
        # User mistakes: one line, no traceback.
        print(f"gdn-export {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as exc:
        # What no check foresaw running out of memory (the runners and export check their own
        # allocations up front): one line, not a traceback.
        if not _out_of_memory(exc):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"gdn-export {args.command}: error: out of memory: {first}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gdn-export {args.command}: interrupted", file=sys.stderr)
        return 130


def console_main() -> None:
    """The `gdn-export` script and `python -m gdn_export`: `main()`, then the process ends with its
    status at once. stdout, stderr and the logging handlers are flushed first; the interpreter's
    teardown is skipped: freeing the object graphs of torch, the ONNX exporter and the models takes
    0.5 s after `import torch` alone and ~1.4 s after an export on a 2-core CPU, and every file, temporary
    folder and child process of a command is closed, removed or waited for before main() returns.
    An exception main() lets through (a bug: its traceback) ends the process the usual way."""
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe (`gdn-export ... | head`)
        code = code or 1
    logging.shutdown()
    os._exit(code)


def _out_of_memory(exc: BaseException) -> bool:
    """MemoryError (numpy's too), torch's OutOfMemoryError, or its CPU allocator's RuntimeError."""
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or \
        "can't allocate memory" in text or "out of memory" in text


if __name__ == "__main__":
    console_main()
