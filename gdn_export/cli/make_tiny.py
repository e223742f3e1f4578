"""`gdn-export make-tiny DIR`: a small random checkpoint in the Hugging Face layout."""

from __future__ import annotations

FAMILIES = ("qwen3_5", "qwen3_next")


def add_parser(sub) -> None:
    p = sub.add_parser("make-tiny", help="write a tiny random checkpoint (config.json + safetensors)",
                       description="Write a tiny random checkpoint of a model family, in the layout "
                       "Hugging Face uses, for tests and demos. Nothing is downloaded.")
    p.add_argument("directory", help="output folder (must not exist, or be empty)")
    p.add_argument("--family", choices=FAMILIES, default="qwen3_5")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shards", type=int, default=1, help="write N safetensors shards with an index")
    p.set_defaults(handler=run)


def run(args) -> int:
    from gdn_export.weights.tiny import make_tiny_checkpoint

    path = make_tiny_checkpoint(args.directory, family=args.family, seed=args.seed, shards=args.shards)
    print(f"wrote {args.family} checkpoint to {path}")
    return 0
