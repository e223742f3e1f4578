"""Calibration tokens for `gdn-export quantize` / `bench --quant`.

Sources, in order:
* a token file: `.npy` (integer array, any shape, flattened) or a text file holding only
  whitespace-separated integer ids;
* a text file (anything else): tokenized with the checkpoint's tokenizer (transformers
  AutoTokenizer on the checkpoint folder); a checkpoint without one is refused by name;
* no file: the built-in English text below, tokenized with the checkpoint's tokenizer when it has
  one; without a tokenizer, uniform random ids from numpy's default_rng(0) (documented: random ids
  calibrate activation ranges worse than text; give --calib-data for a real deployment).

The token stream is cut into rows of `seq_len` tokens (the last row may be shorter) and the first
`samples` rows are kept. Empty data and ids outside [0, vocab_size) are one-line InputErrors.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from gdn_export.errors import InputError
from gdn_export.paths import check_readable

DEFAULT_SAMPLES = 32
DEFAULT_SEQ_LEN = 512
RANDOM_SEED = 0

BUILTIN_TEXT = """\
The history of science is the study of how people have come to understand the natural world. Early
astronomers tracked the motion of the planets across the night sky and kept careful records that
later scholars used to test new ideas. In the seventeenth century, experiments with falling bodies,
pendulums and lenses changed the way questions were asked: a claim had to survive measurement.
Chemistry grew out of metallurgy, medicine and the search for dyes; physics joined heat, light,
electricity and magnetism into a small number of laws. Biology moved from describing species to
explaining how they change over generations, and in the twentieth century the structure of DNA
showed how information is stored and copied inside every living cell.

A good recipe lists its ingredients in the order they are used. Preheat the oven to 200 degrees,
whisk two eggs with a cup of milk, fold in flour and a pinch of salt, and let the batter rest for
ten minutes. Meanwhile, slice the apples thinly and toss them with lemon juice and cinnamon.

def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a

Q: What is the capital of France? A: Paris. Q: How many days are in a leap year? A: 366.
The committee met on Tuesday to review the budget for the coming year. Revenue rose by four percent,
while costs for energy and transport fell; the members agreed to invest the difference in training,
new equipment for the laboratory and a fund for unexpected repairs. The vote was unanimous.
"""


def _tokenizer(checkpoint: str | Path):
    """The checkpoint's tokenizer, or None when it has none (or transformers cannot load it)."""
    checkpoint = Path(checkpoint)
    if not any((checkpoint / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json",
                                                    "tokenizer.model", "vocab.json")):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(checkpoint))
    except Exception:  # transformers raises many types for an unusable tokenizer folder
        return None


def _ids_from_text_file(path: Path) -> np.ndarray | None:
    """The ids of a whitespace-separated integer file, None when it holds other text."""
    text = path.read_text(encoding="utf-8", errors="replace")
    tokens = text.split()
    if tokens and all(re.fullmatch(r"-?[0-9]+", t) for t in tokens):
        return np.asarray([int(t) for t in tokens], dtype=np.int64)
    return None


def check_calibration_file(path: str | Path) -> None:
    """InputError unless --calib-data names a readable file (missing, a folder, a pipe, no permission)."""
    check_readable(path, "calibration file", error=InputError, missing="--calib-data {path}: file not found")


def load_calibration(path: str | Path | None, checkpoint: str | Path, vocab_size: int,
                     samples: int = DEFAULT_SAMPLES, seq_len: int = DEFAULT_SEQ_LEN,
                     progress=None) -> tuple[list[np.ndarray], str]:
    """(rows of int64 token ids, a one-line description of the source)."""
    say = progress or (lambda _m: None)
    if samples < 1:
        raise InputError(f"--calib-samples must be >= 1, got {samples}")
    if seq_len < 1:
        raise InputError(f"--calib-seq-len must be >= 1, got {seq_len}")
    if path is None:
        tok = _tokenizer(checkpoint)
        if tok is not None:
            ids = np.asarray(tok(BUILTIN_TEXT)["input_ids"], dtype=np.int64)
            what = f"the built-in English text ({ids.size} tokens, the checkpoint's tokenizer)"
            # Repeat the short text to fill the asked rows (activation ranges, not content, matter).
            reps = -(-samples * seq_len // max(ids.size, 1))
            ids = np.tile(ids, min(reps, 64))
        else:
            rng = np.random.default_rng(RANDOM_SEED)
            ids = rng.integers(0, vocab_size, size=samples * seq_len, dtype=np.int64)
            what = (f"random token ids (numpy default_rng({RANDOM_SEED}); the checkpoint has no tokenizer: "
                    f"give --calib-data for real calibration)")
    else:
        path = Path(path)
        check_calibration_file(path)
        if path.suffix == ".npy":
            try:
                arr = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise InputError(f"--calib-data {path}: not a readable .npy file ({exc})") from None
            if not np.issubdtype(arr.dtype, np.integer):
                raise InputError(f"--calib-data {path}: token ids must be integers, got {arr.dtype}")
            ids = arr.astype(np.int64).reshape(-1)
            what = f"{path} ({ids.size} token ids)"
        else:
            ids = _ids_from_text_file(path)
            if ids is not None:
                what = f"{path} ({ids.size} token ids)"
            else:
                text = path.read_text(encoding="utf-8", errors="replace")
                if not text.strip():
                    raise InputError(f"--calib-data {path}: the file is empty")
                tok = _tokenizer(checkpoint)
                if tok is None:
                    raise InputError(f"--calib-data {path} is text, but {checkpoint} has no tokenizer "
                                     f"transformers can load: give token ids (.npy or whitespace-separated)")
                ids = np.asarray(tok(text)["input_ids"], dtype=np.int64)
                what = f"{path} ({ids.size} tokens, the checkpoint's tokenizer)"
    if ids.size == 0:
        raise InputError(f"--calib-data {path}: no tokens" if path is not None else "no calibration tokens")
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
        raise InputError(f"--calib-data {path}: token id {int(ids[bad[0]])} at position {int(bad[0])} is outside "
                         f"the vocabulary [0, {vocab_size})")
    rows = [ids[i:i + seq_len] for i in range(0, ids.size, seq_len)][:samples]
    say(f"calibration data: {what}; {len(rows)} rows of up to {seq_len} tokens")
    return rows, what
