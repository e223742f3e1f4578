"""The text train_small.py trains on and quant_accuracy.py measures with: the Python standard
library's own sources, which ship with every Python.

    files      every *.py under `sysconfig.get_paths()["stdlib"]` (site-packages / dist-packages
               and __pycache__ left out) that decodes as UTF-8, sorted by path relative to the root
    split      a file is held out when crc32(relative path) % 100 < HELD_OUT_PERCENT (5): the
               same files on every run and machine with the same stdlib, whatever the hash seed
    tokenizer  a byte-level BPE (`tokenizers`: ByteLevel pre-tokenizer and decoder, BpeTrainer over
               the training files only, every byte in the initial alphabet, so any text encodes);
               SPECIAL tokens at ids 0..2
    streams    each split's files encoded and concatenated, EOS (<|endoftext|>) after each file:
               int64 [n_tokens]
    windows    held-out windows: the held-out stream cut into consecutive rows of `seq_len` tokens
               [n, seq_len] (perplexity and agreement); calibration rows: rows of the training stream
               at evenly spaced offsets [n, seq_len]

`describe(root)` is the record train_small.py stores beside the checkpoint (root, Python version,
file counts, a digest of the held-out paths) so that quant_accuracy.py can refuse a standard library
other than the one the model was trained on.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import sysconfig
import zlib
from pathlib import Path

import numpy as np

HELD_OUT_PERCENT = 5
EOS = "<|endoftext|>"
SPECIAL = (EOS, "<|im_start|>", "<|im_end|>")
# ChatML, as Qwen's tokenizers have it (what `apply_chat_template` renders; the model itself was
# trained on plain source files only).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@functools.lru_cache(maxsize=4)
def list_files(root: Path | None = None) -> tuple[Path, ...]:
    """Relative paths of the *.py files under root (default: this Python's stdlib), sorted."""
    root = stdlib_root() if root is None else Path(root)
    skip = {"site-packages", "dist-packages", "__pycache__"}
    out = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        out += [Path(folder, n).relative_to(root) for n in names if n.endswith(".py")]
    return tuple(sorted(out))


def held_out(rel: Path) -> bool:
    return zlib.crc32(rel.as_posix().encode()) % 100 < HELD_OUT_PERCENT


def split_files(root: Path | None = None) -> dict[str, list[Path]]:
    """{"train": relative paths, "heldout": relative paths}, each in path order."""
    files = list_files(root)
    return {"train": [f for f in files if not held_out(f)], "heldout": [f for f in files if held_out(f)]}


def read(rels, root: Path | None = None, max_bytes: int | None = None) -> list[str]:
    """The texts of the files `rels` that decode as UTF-8 (a few test files are deliberately in other
    encodings), in order, stopping once max_bytes characters are read."""
    root = stdlib_root() if root is None else Path(root)
    out, kept = [], 0
    for rel in rels:
        if max_bytes is not None and kept >= max_bytes:
            break
        try:
            text = (root / rel).read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        out.append(text)
        kept += len(text)
    return out


def split(root: Path | None = None, max_bytes: int | None = None) -> dict[str, list[str]]:
    """{"train": texts, "heldout": texts}: the UTF-8 files of each split, in path order; max_bytes
    keeps the training files up to that many characters (the held-out split is always whole)."""
    files = split_files(root)
    return {"train": read(files["train"], root, max_bytes), "heldout": read(files["heldout"], root)}


def describe(root: Path | None = None) -> dict:
    """The split's identity: {"root", "python", "files", "heldout_files", "heldout_digest"}."""
    root = stdlib_root() if root is None else Path(root)
    files = list_files(root)
    names = [f.as_posix() for f in files if held_out(f)]
    return {"root": str(root), "python": sys.version.split()[0], "files": len(files),
            "heldout_files": len(names), "heldout_digest": hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]}


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE `tokenizers.Tokenizer` of vocab_size entries (SPECIAL first) trained on texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(SPECIAL):
        raise ValueError(f"vocab_size must be >= {256 + len(SPECIAL)} (the 256 bytes and {len(SPECIAL)} "
                         f"special tokens), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def hf_tokenizer(tok):
    """transformers' PreTrainedTokenizerFast around `tok`, EOS / pad <|endoftext|>, ChatML template."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, clean_up_tokenization_spaces=False)
    hf.chat_template = CHAT_TEMPLATE
    return hf


def encode(tok, texts: list[str]) -> np.ndarray:
    """int64 [n]: the texts' ids (a `tokenizers.Tokenizer` or transformers tokenizer), EOS after each."""
    if hasattr(tok, "encode_batch"):
        ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        eos = tok.token_to_id(EOS)
    else:
        ids = tok(texts, add_special_tokens=False)["input_ids"]
        eos = tok.convert_tokens_to_ids(EOS)
    out = np.empty(sum(len(i) + 1 for i in ids), dtype=np.int64)
    pos = 0
    for row in ids:
        out[pos:pos + len(row)] = row
        out[pos + len(row)] = eos
        pos += len(row) + 1
    return out


def heldout_stream(tok, need: int, root: Path | None = None) -> np.ndarray:
    """int64: the held-out stream's first files, encoded until it holds `need` tokens (or all of
    them): the same prefix as encoding every held-out file, for what `heldout_windows` takes."""
    parts, have = [], 0
    for rel in split_files(root)["heldout"]:
        if have >= need:
            break
        ids = encode(tok, read([rel], root))
        parts.append(ids)
        have += ids.size
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def heldout_windows(stream: np.ndarray, seq_len: int, n: int) -> np.ndarray:
    """int64 [min(n, len // seq_len), seq_len]: the first consecutive rows of the held-out stream."""
    rows = min(n, stream.size // seq_len)
    if rows < 1:
        raise ValueError(f"the held-out stream has {stream.size} tokens, fewer than one row of {seq_len}")
    return stream[:rows * seq_len].reshape(rows, seq_len)


def calibration_rows(stream: np.ndarray, seq_len: int, n: int) -> np.ndarray:
    """int64 [n, seq_len]: rows of the training stream at n evenly spaced offsets."""
    if stream.size < seq_len:
        raise ValueError(f"the training stream has {stream.size} tokens, fewer than one row of {seq_len}")
    starts = np.linspace(0, stream.size - seq_len, n).astype(np.int64)
    return np.stack([stream[s:s + seq_len] for s in starts])
