"""What sharing one AWQ pre-scale across sibling projections costs: `gdn-export quantize --format
int4-awq` as it is (q / k / v, gate / up and the GDN input projections share the mean pre-scale, so
that each group runs as one GEMM) against the same calibration with each Linear's own pre-scale
(gdn_export.quantize.calibrate's share_sibling_quantities replaced by a no-op for the second run),
both measured by quant_accuracy.py's perplexity on a train_small.py checkpoint.

    python benchmarks/investigations/awq_shared_prescale.py CHECKPOINT [--windows N] [--calib-samples N]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import quant_accuracy as qa  # noqa: E402


def main(argv=None) -> int:
    import transformers

    import gdn_export.quantize.calibrate as calibrate
    from gdn_export.weights import load_checkpoint

    args = qa.parse_args([*(argv if argv is not None else sys.argv[1:]), "--formats", "int4-awq"])
    d = qa.data(args, transformers.AutoTokenizer.from_pretrained(args.checkpoint))
    cache_len = max(d["windows"].shape[1], args.prompt_len + args.new_tokens)
    base = qa.measure(qa.Ours(load_checkpoint(args.checkpoint, device=args.device), cache_len), d, args)
    print(f"bf16: ppl {base['ppl']:.4f}")
    shared = calibrate.share_sibling_quantities
    with tempfile.TemporaryDirectory() as work:
        np.save(Path(work) / "calib.npy", d["calib"])
        for name, share in (("shared pre-scale", shared), ("own pre-scale", lambda _model: 0)):
            calibrate.share_sibling_quantities = share
            try:
                path = qa.quantize(args, Path(work) / "calib.npy", Path(work) / name.split()[0], "int4-awq")
            finally:
                calibrate.share_sibling_quantities = shared
            got = qa.measure(qa.Ours(load_checkpoint(path, device=args.device), cache_len), d, args, base)
            print(f"int4-awq, {name}: ppl {got['ppl']:.4f} ({got['ppl_change']:+.2f}%), next-token agreement "
                  f"{got['next_token']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
