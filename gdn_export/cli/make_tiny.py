"""`gdn-export make-tiny DIR`: a small random checkpoint in the Hugging Face layout."""

from __future__ import annotations

from pathlib import Path

from gdn_export.cli.common import add_overwrite, add_seed, check_at_least, output_dir
from gdn_export.errors import InputError

# gdn_export.weights.tiny.FAMILIES, spelled out so that `--help` needs no torch import.
FAMILIES = ("qwen3_5", "qwen3_next", "qwen3_5_moe", "olmo_hybrid")


def add_parser(sub) -> None:
    p = sub.add_parser("make-tiny", help="write a tiny random checkpoint (config.json + safetensors)",
                       description="Write a tiny random checkpoint of a model family, in the layout "
                       "Hugging Face uses, for tests and demos. Nothing is downloaded.")
    p.add_argument("directory", help="output folder (must not exist, or be empty, unless --overwrite)")
    p.add_argument("--family", choices=FAMILIES, default="qwen3_5", help="model family")
    add_seed(p, "the random weights")
    p.add_argument("--mtp-layers", type=int, default=0, metavar="N",
                   help="add a multi-token-prediction head of N layers (mtp.* tensors and "
                   "mtp_num_hidden_layers, as the released checkpoints; speculative decoding takes 1); "
                   "qwen3_5, qwen3_5_moe and qwen3_next only (default 0: none)")
    p.add_argument("--shards", type=int, default=1,
                   help="write N safetensors shards with an index (at most one per tensor)")
    add_overwrite(p, "DIRECTORY when it holds a checkpoint (a config.json); its other files go with it")
    p.set_defaults(handler=run)


def run(args) -> int:
    from gdn_export.weights.tiny import make_tiny_checkpoint

    # make_tiny_checkpoint checks both too (the target, shards >= 1 and <= the tensor count);
    # these two spell the flags the way the user typed them.
    check_at_least(args.shards, 1, "--shards")
    check_at_least(args.mtp_layers, 0, "--mtp-layers")
    if args.mtp_layers and args.family == "olmo_hybrid":
        raise InputError("--mtp-layers: olmo_hybrid has no multi-token-prediction head (qwen3_5, "
                         "qwen3_5_moe and qwen3_next have one)")
    directory = output_dir(args.directory, "", args, replaceable=_holds_checkpoint)
    path = make_tiny_checkpoint(directory, family=args.family, seed=args.seed, shards=args.shards,
                                mtp_layers=args.mtp_layers, overwrite=args.overwrite)
    print(f"wrote {args.family} checkpoint to {path}")
    return 0


def _holds_checkpoint(directory: Path) -> bool:
    return (directory / "config.json").is_file()


def check_target(directory: Path, overwrite: bool) -> None:
    """gdn_export.weights.tiny.check_target, imported late (torch); `demo` checks its target
    through this name before the slow part."""
    from gdn_export.weights.tiny import check_target as check

    check(directory, overwrite)
