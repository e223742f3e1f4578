"""One HTTP request's side of the engine: its choices (one engine request per prompt), the outputs
the engine thread hands over, and the text and counts each choice adds up to.

The engine's `deliver` runs in the engine thread; `Dispatcher.deliver` moves each batch onto the
event loop in one call (call_soon_threadsafe), where every output lands in its request's queue.
A `Choice` turns outputs into text (gdn_export.serve.text): a stop string that matches ends it
("stop") and cancels its engine request, so its row is freed at once; tokens that were already on
their way after that are dropped and not counted.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gdn_export.serve.engine import Engine, Output
from gdn_export.serve.errors import Unavailable
from gdn_export.serve.sampling import SamplingParams


class Dispatcher:
    """Engine outputs -> asyncio queues on `loop` (set Engine.deliver = dispatcher.deliver)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop

    def deliver(self, items: list) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(_dispatch, items)


def _dispatch(items: list) -> None:
    for choice, output in items:
        choice.queue.put_nowait((choice, output))


@dataclass
class Delta:
    """What one batch of outputs added to a choice: text, token ids, and its finish reason once done."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None


class Choice:
    """One prompt of a request: index, prompt ids, the engine request once submitted, its text
    stream (None without a tokenizer), and what it produced so far."""

    def __init__(self, index: int, prompt_ids: list[int], params: SamplingParams, text_stream,
                 queue: asyncio.Queue):
        self.index = index
        self.prompt_ids = prompt_ids
        self.params = params
        self.text_stream = text_stream
        self.queue = queue
        self.seq = None
        self.token_ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def take(self, out: Output, engine: Engine) -> Delta:
        """Account for one engine output; raises its error if it carries one."""
        delta = Delta()
        if self.done:
            return delta
        if out.error is not None:
            raise out.error
        if out.finish_reason == "cancelled":  # not ours: ours come after the choice is done
            raise Unavailable("the request was cancelled", code="cancelled")
        ts = self.text_stream
        for i, token in enumerate(out.token_ids):
            self.token_ids.append(token)
            delta.token_ids.append(token)
            is_stop_token = out.stop_token and i == len(out.token_ids) - 1
            if ts is not None and not is_stop_token:
                delta.text += ts.push(token)
                if ts.stopped:
                    delta.finish_reason = "stop"
                    engine.cancel(self.seq)
                    break
        if delta.finish_reason is None and out.finish_reason is not None:
            delta.finish_reason = out.finish_reason
            if ts is not None:
                delta.text += ts.flush()
        self.text += delta.text
        self.finish_reason = delta.finish_reason
        return delta


async def next_outputs(queue: asyncio.Queue) -> list:
    """Wait for at least one (choice, output), then take every one already queued: under load a
    stream sends several tokens in one chunk instead of falling behind."""
    items = [await queue.get()]
    while not queue.empty():
        items.append(queue.get_nowait())
    return items
