"""`gdn-export demo`: make a tiny checkpoint, export it, validate PyTorch against ONNX Runtime."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from gdn_export.cli.common import Progress, add_overwrite, add_quiet, add_seed, output_dir, output_file
from gdn_export.cli.make_tiny import FAMILIES, check_target
from gdn_export.errors import OutputError


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="the whole flow on a built-in tiny model (no download)",
                       description="Write a tiny random checkpoint into a temporary folder, export "
                       "it to ONNX, run PyTorch and ONNX Runtime on the same prompts and print the "
                       "parity table. Exit status 1 if parity fails.")
    p.add_argument("--family", choices=FAMILIES, default="qwen3_5", help="model family")
    add_seed(p, "the random weights and prompts")
    p.add_argument("--keep", metavar="DIR", help="keep the checkpoint DIR/tiny-FAMILY and ONNX file "
                   "DIR/tiny-FAMILY.onnx (default: a temporary folder, removed at the end)")
    add_overwrite(p, "the files an earlier --keep demo left in DIR")
    add_quiet(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    from gdn_export.onnx.export import export_onnx
    from gdn_export.runtime.ort_runner import OrtRunner
    from gdn_export.runtime.torch_runner import TorchRunner
    from gdn_export.validate import DEFAULT_TOLERANCES, Tolerances, format_table, run_parity
    from gdn_export.weights import load_checkpoint
    from gdn_export.weights.tiny import make_tiny_checkpoint

    progress = Progress("demo", args.quiet)
    with _work_folder(args.keep) as root:
        ckpt = root / f"tiny-{args.family}"
        onnx_path = root / f"tiny-{args.family}.onnx"
        if args.keep:  # both outputs checked before anything is written
            output_dir(ckpt, "--keep", args, replaceable=lambda p: (p / "config.json").is_file())
            output_file(onnx_path, "--keep", args)
        check_target(ckpt, overwrite=args.overwrite or not args.keep)
        root.mkdir(parents=True, exist_ok=True)
        progress(f"writing a tiny random {args.family} checkpoint to {ckpt}")
        replace = args.overwrite or not args.keep  # outputs another demo wrote meanwhile are kept
        make_tiny_checkpoint(ckpt, family=args.family, seed=args.seed, overwrite=replace)
        model = load_checkpoint(ckpt)
        export_onnx(model, onnx_path, progress=progress, overwrite=replace)
        progress("running PyTorch and ONNX Runtime on the same prompts")
        report = run_parity(TorchRunner(model), [OrtRunner(onnx_path)],
                            vocab_size=model.config.vocab_size,
                            tolerances=Tolerances(*DEFAULT_TOLERANCES["float32"]),
                            batch=2, prompt_len=37, decode_steps=4, seed=args.seed,
                            progress=progress)
        print(format_table(report))
        if args.keep:
            print(f"kept {ckpt} and {onnx_path}")
    return 0 if report.passed else 1


@contextlib.contextmanager
def _work_folder(keep: str | None):
    """Yield the folder the demo writes into: `keep`, else a temporary folder removed at the end
    (an unwritable temporary directory is a one-line error naming it and TMPDIR)."""
    if keep:
        yield Path(keep)
        return
    try:
        tmp = tempfile.TemporaryDirectory(prefix="gdn-export-demo-")
    except OSError as exc:
        raise OutputError(f"cannot create a temporary folder in {tempfile.gettempdir()} "
                          f"({exc.strerror}); set TMPDIR to a writable folder or use --keep DIR") from None
    with tmp as folder:
        yield Path(folder)
