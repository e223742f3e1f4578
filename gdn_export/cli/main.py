"""`gdn-export` command line: make-tiny, quantize, export, build, run, validate, demo, bench."""

from __future__ import annotations

import argparse
import logging
import sys

from gdn_export import __version__
from gdn_export.cli import bench, build, demo, export, make_tiny, quantize, run, validate
from gdn_export.errors import GdnExportError

SUBCOMMANDS = (demo, make_tiny, quantize, export, build, run, validate, bench)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gdn-export",
        description="Export hybrid Gated DeltaNet language models (Qwen3-Next, Qwen3.5) to ONNX and "
        "TensorRT, run them, and check their numerical parity.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="gdn-export: %(levelname)s: %(message)s")
    try:
        return int(args.handler(args) or 0)
    except GdnExportError as exc:
        # User mistakes: one line, no traceback.
        print(f"gdn-export {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gdn-export {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
