"""The real `openai` client: 64 concurrent streaming clients (half completions, half chat) against a
server of 16 rows and a queue of 48. Every request either completes with exactly its own prompt's
text and usage, or gets a clean error (429 as openai.RateLimitError); none is lost or mixed up."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gdn_export.runtime.base import generate
from gdn_export.serve.scheduler import Limits
from tests.serve.conftest import LiveServer, Reference, until_stop

CLIENTS, MAX_TOKENS = 64, 10
WORDS = "ba ce di fo gu ha ke li mo nu pa re si to vu wa".split()


@pytest.fixture(scope="module")
def server(tiny_ckpt):
    live = LiveServer(tiny_ckpt, Limits(max_num_seqs=16, max_prefill_seqs=8, prefill_tokens=128, max_queue=48))
    yield live
    live.stop()


def _requests(tok):
    """(kind, prompt or messages, prompt token ids) per client: distinct prompts of different lengths."""
    rng = np.random.default_rng(5)
    out = []
    for i in range(CLIENTS):
        text = f"{i} " + " ".join(rng.choice(WORDS, 1 + i % 9))
        if i % 2:
            messages = [{"role": "user", "content": text}]
            out.append(("chat", messages, tok.chat(messages)))
        else:
            out.append(("completion", text, tok.encode(text)))
    return out


async def _one(client, kind, prompt):
    """(text, usage, finish reason) of one streamed request."""
    if kind == "chat":
        stream = await client.chat.completions.create(model="tiny", messages=prompt, max_tokens=MAX_TOKENS,
                                                      temperature=0, stream=True,
                                                      stream_options={"include_usage": True})
    else:
        stream = await client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                                 stream=True, stream_options={"include_usage": True})
    text, usage, finish = "", None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += (choice.delta.content or "") if kind == "chat" else choice.text
            finish = choice.finish_reason or finish
    return text, usage, finish


def test_64_concurrent_streaming_clients(server, tiny_ckpt):
    import openai

    reqs = _requests(server.tokenizer)
    ref = Reference(tiny_ckpt)
    # the reference: every prompt in one ragged batch of the eager runner (rows never mix: runtime tests)
    wanted = generate(ref.runner, [np.array(ids) for _, _, ids in reqs], MAX_TOKENS).generated.tolist()

    async def run_all():
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        try:
            return await asyncio.gather(*(_one(client, kind, prompt) for kind, prompt, _ in reqs),
                                        return_exceptions=True)
        finally:
            await client.close()

    results = asyncio.run(run_all())
    done = 0
    for (kind, _, ids), want, result in zip(reqs, wanted, results):
        if isinstance(result, BaseException):
            assert isinstance(result, openai.RateLimitError), repr(result)  # a full queue: the clean error
            assert "the queue is full" in str(result)
            continue
        text, usage, finish = result
        tokens = until_stop(want, {2})
        assert text == server.tokenizer.decode(tokens), kind
        assert (usage.prompt_tokens, usage.completion_tokens) == (len(ids), len(tokens))
        assert finish == ("stop" if tokens[-1] == 2 else "length")
        done += 1
    assert done >= 48 and server.engine.idle  # the queue takes 48 even before a row is free
    status = server.engine.stats()
    assert status["decode"] == status["prefill"] == status["waiting"] == 0
