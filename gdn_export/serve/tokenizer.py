"""The checkpoint's text side: its tokenizer, chat template, end-of-sequence ids and sampling defaults.

The tokenizer is transformers' AutoTokenizer of the checkpoint folder (local files only, nothing
downloaded); it must be a fast one (a tokenizer.json), whose `tokenizers.Tokenizer` streams the text
(gdn_export.serve.text). A folder without tokenizer files serves token-id prompts only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from gdn_export.errors import CheckpointError
from gdn_export.serve.errors import BadRequest
from gdn_export.serve.text import TextStream

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# generation_config.json fields a request that omits them gets (as the checkpoint's authors advise)
SAMPLING_DEFAULTS = ("temperature", "top_p", "top_k")
STREAM_CONTEXT = 8  # prompt tokens the first generated token is decoded after


class ServeTokenizer:
    """hf: a transformers fast tokenizer. encode / decode / chat (the chat template) / stream."""

    def __init__(self, hf):
        self.hf = hf
        self.backend = getattr(hf, "backend_tokenizer", None)
        if self.backend is None:
            raise CheckpointError(f"{type(hf).__name__} is not a fast tokenizer: serving needs the "
                                  f"checkpoint's tokenizer.json")
        self.has_chat_template = bool(getattr(hf, "chat_template", None))

    @classmethod
    def load(cls, folder: str | Path) -> "ServeTokenizer | None":
        """The folder's tokenizer; None when it has no tokenizer files; CheckpointError when it has
        some that transformers cannot load."""
        folder = Path(folder)
        if not any((folder / f).is_file() for f in TOKENIZER_FILES):
            return None
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise CheckpointError(f"{folder} has a tokenizer, and loading it needs transformers ({exc}): "
                                  f"pip install 'gdn-export[serve]'") from None
        try:
            hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except Exception as exc:  # transformers raises many types for an unusable tokenizer folder
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CheckpointError(f"{folder}: cannot load its tokenizer: {first}") from None
        return cls(hf)

    def __len__(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        """Token ids of a completion prompt (with the special tokens the tokenizer adds, if any)."""
        return list(self.hf(text, add_special_tokens=True)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode([int(t) for t in ids], skip_special_tokens=True)

    def chat(self, messages: list[dict], template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """Token ids of `messages` through the chat template, ending with the assistant's turn.
        BadRequest without a template, or when the template refuses the messages."""
        if not self.has_chat_template:
            raise BadRequest("this checkpoint's tokenizer has no chat template: use /v1/completions",
                             param="messages")
        try:
            text = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                               **(template_kwargs or {}))
        except Exception as exc:  # jinja's TemplateError (raise_exception), TypeError of a kwarg
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise BadRequest(f"the chat template refused these messages: {first}", param="messages") from None
        # The template writes the special tokens itself (a BOS among them, where the model has one).
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def stream(self, stop: Sequence[str], prompt_ids: Sequence[int]) -> TextStream:
        return TextStream(self.backend, stop, list(prompt_ids)[-STREAM_CONTEXT:])


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from None
    return data if isinstance(data, dict) else {}


def _ids(value) -> set[int]:
    if isinstance(value, bool) or value is None:
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, int) and not isinstance(v, bool)}
    return set()


def eos_token_ids(folder: str | Path, tokenizer: ServeTokenizer | None) -> frozenset[int]:
    """End-of-sequence ids: generation_config.json's, config.json's (or its text_config's), and the
    tokenizer's eos token."""
    folder = Path(folder)
    config = _read_json(folder / "config.json")
    ids = _ids(_read_json(folder / "generation_config.json").get("eos_token_id"))
    ids |= _ids(config.get("eos_token_id")) | _ids((config.get("text_config") or {}).get("eos_token_id"))
    if tokenizer is not None and tokenizer.hf.eos_token_id is not None:
        ids.add(int(tokenizer.hf.eos_token_id))
    return frozenset(ids)


def sampling_defaults(folder: str | Path) -> dict[str, float | int]:
    """temperature / top_p / top_k from generation_config.json, where it sets them (and
    do_sample is not false)."""
    gen = _read_json(Path(folder) / "generation_config.json")
    if gen.get("do_sample") is False:
        return {"temperature": 0.0}
    out: dict[str, float | int] = {}
    for key in SAMPLING_DEFAULTS:
        value = gen.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value
    return out
