"""Server-sent events of a stream, written from a per-request template.

A stream sends one event per batch of new tokens for every running request: at 128 requests that is
thousands of events a second from one Python thread. Each event here is the request's fixed JSON
around the few fields that change (json.dumps of the text, the finish reason, the token ids), a few
microseconds, where building and dumping the pydantic models of gdn_export.serve.protocol costs
tens; tests/serve check that both give the same JSON.
"""

from __future__ import annotations

import json


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class ChunkWriter:
    """`data: {...}\\n\\n` events of one request: kind "completion" (object text_completion) or "chat"
    (chat.completion.chunk); with_ids adds token_ids (and prompt_token_ids where given)."""

    def __init__(self, kind: str, rid: str, created: int, model: str, with_ids: bool):
        obj = "text_completion" if kind == "completion" else "chat.completion.chunk"
        self.kind, self.with_ids = kind, with_ids
        self._head = f'data: {{"id":{_dumps(rid)},"object":"{obj}","created":{int(created)},"model":{_dumps(model)},'

    def choice(self, index: int, text: str | None, token_ids=None, finish: str | None = None,
               prompt_ids=None, role: bool = False) -> str:
        """One event with one choice: a completion's text, or a chat delta (content `text`, None for
        an empty delta; role: the first chunk's {"role": "assistant"})."""
        if self.kind == "completion":
            body = f'"index":{index},"text":{_dumps(text or "")},"logprobs":null,"finish_reason":{_dumps(finish)}'
        else:
            delta = []
            if role:
                delta.append('"role":"assistant"')
            if text is not None:
                delta.append(f'"content":{_dumps(text)}')
            body = f'"index":{index},"delta":{{{",".join(delta)}}},"logprobs":null,"finish_reason":{_dumps(finish)}'
        if self.with_ids and token_ids is not None:
            body += f',"token_ids":{_dumps(list(token_ids))}'
        if self.with_ids and prompt_ids is not None:
            body += f',"prompt_token_ids":{_dumps(list(prompt_ids))}'
        return f'{self._head}"choices":[{{{body}}}],"usage":null}}\n\n'

    def usage(self, prompt_tokens: int, completion_tokens: int) -> str:
        """The last event of stream_options.include_usage: no choices, the usage."""
        return (f'{self._head}"choices":[],"usage":{{"prompt_tokens":{prompt_tokens},"completion_tokens":'
                f'{completion_tokens},"total_tokens":{prompt_tokens + completion_tokens}}}}}\n\n')
