"""From generated token ids to the text a client sees: incremental detokenization and stop strings.

`TextStream` turns tokens into text as they come (tokenizers' DecodeStream: a character split over
several byte-level tokens comes out whole, once complete). With stop strings it holds back the end
of the text that could still begin one, and at a match cuts the text before it (the stop string is
not returned, as in OpenAI's API). Streaming and non-streaming responses both come from this one
path, so their text is the same.
"""

from __future__ import annotations

from typing import Sequence


class TextStream:
    """Text of one generation. tokenizer: a `tokenizers.Tokenizer`; stop: stop strings (non-empty);
    prompt_ids: the last prompt tokens, the context the first generated token is decoded in."""

    def __init__(self, tokenizer, stop: Sequence[str] = (), prompt_ids: Sequence[int] = ()):
        from tokenizers.decoders import DecodeStream

        self._tokenizer = tokenizer
        self._decode = DecodeStream(ids=[int(t) for t in prompt_ids], skip_special_tokens=True)
        self._stop = tuple(stop)
        self._held = ""
        self.stopped = False

    def push(self, token_id: int) -> str:
        """The text that `token_id` releases ("" while a character or a possible stop string is
        incomplete). After a stop string matched, nothing more."""
        if self.stopped:
            return ""
        piece = self._decode.step(self._tokenizer, int(token_id)) or ""
        if not self._stop:
            return piece
        text = self._held + piece
        hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return text[:min(hits)]
        keep = _open_prefix(text, self._stop)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        """What was held back (the generation ended without completing a stop string)."""
        held, self._held = self._held, ""
        return held


def _open_prefix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of `text` that is the start of a stop string (shorter than it)."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
