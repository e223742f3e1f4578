"""The HTTP side against a live server (uvicorn in a thread) on a make-tiny checkpoint with a byte-level
BPE tokenizer: bad input gets the right status and OpenAI's error body and disturbs nothing;
streaming and non-streaming give the same text and tokens, which are the prompt's tokens alone;
stop strings and ids, echo, several prompts, usage, /v1/models, /health, /metrics."""

from __future__ import annotations

import pytest

from tests.serve.conftest import Reference, until_stop
from tests.serve.http_client import call, events, streamed_text

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


@pytest.fixture(scope="module")
def ref(tiny_ckpt):
    return Reference(tiny_ckpt)


def _body(**kw):
    return {"model": "tiny", "temperature": 0, **kw}


BAD = [
    pytest.param(COMPLETIONS, b'{"model": "tiny", "prompt": "hi",', 400, "malformed JSON in the request body", None,
                 id="malformed-json"),
    pytest.param(COMPLETIONS, b'["tiny"]', 400, "the request body must be a JSON object", None, id="not-an-object"),
    pytest.param(COMPLETIONS, _body(prompt="hi", frobnicate=1), 400, "unknown field 'frobnicate'", "frobnicate",
                 id="unknown-field"),
    pytest.param(COMPLETIONS, {"model": "gpt-4", "prompt": "hi"}, 404,
                 "the model 'gpt-4' does not exist; this server serves 'tiny'", "model", id="unknown-model"),
    pytest.param(COMPLETIONS, _body(prompt=[1] * 150, max_tokens=20), 400,
                 "maximum context length is 160 tokens; the prompt has 150 tokens and max_tokens asks for 20 more",
                 "max_tokens", id="prompt-too-long"),
    pytest.param(COMPLETIONS, _body(prompt="hi", max_tokens=-3), 400,
                 "max_tokens: Input should be greater than or equal to 1", "max_tokens", id="negative-max-tokens"),
    pytest.param(COMPLETIONS, _body(prompt="hi", max_tokens=10**9), 400, "maximum context length is 160 tokens",
                 "max_tokens", id="absurd-max-tokens"),
    pytest.param(COMPLETIONS, _body(prompt="hi", temperature=7), 400,
                 "temperature: Input should be less than or equal to 2", "temperature", id="temperature"),
    pytest.param(COMPLETIONS, _body(prompt="hi", top_p=0), 400, "top_p: Input should be greater than 0", "top_p",
                 id="top-p"),
    pytest.param(COMPLETIONS, _body(prompt="hi", n=3), 400, "n: only 1 is supported", "n", id="n"),
    pytest.param(COMPLETIONS, _body(prompt="hi", logprobs=2), 400, "logprobs: not supported", "logprobs",
                 id="logprobs"),
    pytest.param(COMPLETIONS, _body(prompt=[5, 256]), 400, "token id 256 is outside the vocabulary [0, 256)",
                 "prompt", id="token-out-of-vocab"),
    pytest.param(COMPLETIONS, _body(prompt=""), 400, "the prompt is empty", "prompt", id="empty-prompt"),
    pytest.param(COMPLETIONS, _body(prompt="hi", max_tokens="5"), 400, "max_tokens: Input should be a valid integer",
                 "max_tokens", id="string-number"),
    pytest.param(CHAT, _body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
                 400, "content parts of type 'image_url' are not supported", "messages[0].content", id="image"),
    pytest.param(CHAT, _body(messages=[]), 400, "messages: List should have at least 1 item", "messages",
                 id="no-messages"),
    pytest.param(CHAT, _body(messages=[{"role": "user", "content": "hi", "colour": "red"}]), 400,
                 "unknown field 'messages[0].colour'", "messages[0].colour", id="unknown-nested-field"),
]


@pytest.mark.parametrize("path,body,status,message,param", BAD)
def test_bad_input_gets_its_status_and_an_openai_error(live, path, body, status, message, param):
    got, _, data = call(live.url, path, body)
    assert got == status, data
    assert set(data) == {"error"} and set(data["error"]) == {"message", "type", "param", "code"}
    assert message in data["error"]["message"] and data["error"]["param"] == param
    assert data["error"]["type"] == {400: "invalid_request_error", 404: "not_found_error"}[status]


def test_routes_methods_and_what_still_works_after_bad_input(live, ref):
    status, _, data = call(live.url, "/v1/nothing", b"{}")
    assert status == 404 and "no route POST /v1/nothing" in data["error"]["message"]
    status, _, data = call(live.url, COMPLETIONS, method="GET")
    assert status == 405 and "method GET is not allowed" in data["error"]["message"]
    status, _, data = call(live.url, "/health", method="GET")
    assert (status, data) == (200, {"status": "ok"})
    status, _, data = call(live.url, "/v1/models", method="GET")
    assert status == 200 and [m["id"] for m in data["data"]] == ["tiny"] and data["data"][0]["max_model_len"] == 160
    status, _, data = call(live.url, COMPLETIONS, _body(prompt=[3, 4, 5], max_tokens=6, return_token_ids=True))
    assert status == 200 and data["choices"][0]["token_ids"] == until_stop(ref([3, 4, 5], 6), {2})


def _tokens(prompt_ids, ref, max_tokens):
    return until_stop(ref(prompt_ids, max_tokens), {2})  # 2: <|im_end|>, the tokenizer's eos


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_streaming_and_non_streaming_agree_with_the_prompt_alone(live, ref, kind):
    text_prompt = "the quick brown fox"
    if kind == "completion":
        path, body = COMPLETIONS, _body(prompt=text_prompt, max_tokens=24, return_token_ids=True)
        prompt_ids = live.tokenizer.encode(text_prompt)
    else:
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text_prompt}]
        path, body = CHAT, _body(messages=messages, max_tokens=24, return_token_ids=True)
        prompt_ids = live.tokenizer.chat(messages)
    status, _, whole = call(live.url, path, body)
    assert status == 200, whole
    chunks = events(live.url, path, {**body, "stream": True, "stream_options": {"include_usage": True}})
    choice = whole["choices"][0]
    want = _tokens(prompt_ids, ref, 24)
    assert choice["token_ids"] == want and choice["prompt_token_ids"] == prompt_ids
    assert choice["finish_reason"] == ("stop" if want[-1] == 2 else "length")
    text = choice["text"] if kind == "completion" else choice["message"]["content"]
    assert text == live.tokenizer.decode(want) and text
    assert streamed_text(chunks, chat=kind == "chat") == text
    assert [t for c in chunks[:-2] for t in c["choices"][0]["token_ids"]] == want
    assert chunks[-1] == "[DONE]" and chunks[-2]["choices"] == []
    usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(want),
             "total_tokens": len(prompt_ids) + len(want)}
    assert chunks[-2]["usage"] == whole["usage"] == usage
    assert all(c["usage"] is None for c in chunks[:-2])
    finishes = [c["choices"][0]["finish_reason"] for c in chunks[:-2]]
    assert finishes[-1] == choice["finish_reason"] and not any(finishes[:-1])
    if kind == "chat":
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks[:-1])


def test_stop_strings_and_stop_ids(live, ref):
    prompt = [7, 8, 9, 10]
    want = _tokens(prompt, ref, 30)
    full = live.tokenizer.decode(want)
    stop = full[len(full) // 2:len(full) // 2 + 3]
    before = full[:full.index(stop)]
    body = _body(prompt=prompt, max_tokens=30, stop=[stop, "\u2603never"], return_token_ids=True)
    _, _, data = call(live.url, COMPLETIONS, body)
    choice = data["choices"][0]
    assert choice["text"] == before and choice["finish_reason"] == "stop"
    assert choice["token_ids"] == want[:len(choice["token_ids"])] and len(choice["token_ids"]) < len(want)
    assert data["usage"]["completion_tokens"] == len(choice["token_ids"])
    chunks = events(live.url, COMPLETIONS, {**body, "stream": True})
    assert streamed_text(chunks) == before and chunks[-2]["choices"][0]["finish_reason"] == "stop"
    # a stop id: the generation ends at that token, which is counted and gives no text
    stop_id = want[3]
    _, _, data = call(live.url, COMPLETIONS, _body(prompt=prompt, max_tokens=30, stop_token_ids=[stop_id],
                                                    return_token_ids=True))
    choice = data["choices"][0]
    assert choice["token_ids"] == until_stop(want, {stop_id}) and choice["finish_reason"] == "stop"
    assert choice["text"] == live.tokenizer.decode(choice["token_ids"][:-1])


def test_several_prompts_echo_and_ignore_eos(live, ref):
    prompts = ["hello there", "bad"]
    body = _body(prompt=prompts, max_tokens=8, echo=True, ignore_eos=True, return_token_ids=True)
    _, _, data = call(live.url, COMPLETIONS, body)
    chunks = events(live.url, COMPLETIONS, {**body, "stream": True, "stream_options": {"include_usage": True}})
    ids = [live.tokenizer.encode(p) for p in prompts]
    assert [c["index"] for c in data["choices"]] == [0, 1]
    for i, choice in enumerate(data["choices"]):
        want = ref(ids[i], 8)  # ignore_eos: all 8 tokens, whatever they are
        assert choice["token_ids"] == want and choice["finish_reason"] == "length"
        assert choice["text"] == prompts[i] + live.tokenizer.decode(want)
        streamed = "".join(c["choices"][0]["text"] for c in chunks[:-2] if c["choices"][0]["index"] == i)
        assert streamed == choice["text"]
    assert data["usage"]["completion_tokens"] == 16 and chunks[-2]["usage"] == data["usage"]


def test_sampling_with_a_seed_repeats(live):
    body = _body(prompt="once upon", max_tokens=12, temperature=1.2, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)
    texts = {call(live.url, COMPLETIONS, body)[2]["choices"][0]["text"] for _ in range(2)}
    texts.add(streamed_text(events(live.url, COMPLETIONS, {**body, "stream": True})))
    assert len(texts) == 1
    other = call(live.url, COMPLETIONS, {**body, "seed": 99})[2]["choices"][0]["text"]
    assert other not in texts  # 12 tokens drawn from a random model: another seed differs


def test_metrics(live):
    call(live.url, COMPLETIONS, _body(prompt="count me", max_tokens=3))
    call(live.url, COMPLETIONS, _body(prompt="hi", frobnicate=1))
    status, headers, text = call(live.url, "/metrics", method="GET")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values["gdn_serve_generation_tokens_total"] >= 3 and values["gdn_serve_prompt_tokens_total"] >= 2
    assert values['gdn_serve_rejected_requests_total{status="400"}'] >= 1
    assert values["gdn_serve_time_to_first_token_seconds_count"] >= 1
    assert values["gdn_serve_inter_token_latency_seconds_count"] >= 2
    assert values["gdn_serve_queue_length"] == 0 and values['gdn_serve_running_sequences{phase="decode"}'] == 0
    assert 'gdn_serve_requests_total{finish_reason="length"}' in values
