"""Request parsing (every problem one BadRequest naming its field) and the stream's fast event writer
against the pydantic response models it stands in for (the same JSON, field for field)."""

from __future__ import annotations

import json

import pytest

from gdn_export.serve.chunks import ChunkWriter
from gdn_export.serve.errors import BadRequest
from gdn_export.serve.protocol import (ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest, Completion,
                                       CompletionChoice, CompletionRequest, Delta, Usage, parse_request)


def _event(text: str) -> dict:
    assert text.startswith("data: ") and text.endswith("\n\n")
    return json.loads(text[len("data: "):])


@pytest.mark.parametrize("with_ids", [False, True], ids=["text", "with-ids"])
def test_completion_events_match_the_models(with_ids):
    w = ChunkWriter("completion", "cmpl-1", 17, 'm"odel', with_ids)
    text = 'a "quoted" \\ \u00fcber\n\U0001F680'
    for args, model in [
        ((0, text, [5, 6], None, [1, 2]),
         CompletionChoice(index=0, text=text, token_ids=[5, 6], prompt_token_ids=[1, 2])),
        ((3, "", [], "length"), CompletionChoice(index=3, text="", finish_reason="length", token_ids=[])),
    ]:
        if not with_ids:
            model = model.model_copy(update={"token_ids": None, "prompt_token_ids": None})
        want = Completion(id="cmpl-1", created=17, model='m"odel', choices=[model])
        assert _event(w.choice(*args)) == json.loads(want.model_dump_json())
    usage = Completion(id="cmpl-1", created=17, model='m"odel', choices=[],
                       usage=Usage(prompt_tokens=4, completion_tokens=9, total_tokens=13))
    assert _event(w.usage(4, 9)) == json.loads(usage.model_dump_json())


def test_chat_events_match_the_models():
    w = ChunkWriter("chat", "chatcmpl-1", 5, "m", True)

    def want(delta, finish=None, token_ids=None, prompt_ids=None):
        choice = ChatChunkChoice(index=0, delta=delta, finish_reason=finish, token_ids=token_ids,
                                 prompt_token_ids=prompt_ids)
        chunk = ChatCompletionChunk(id="chatcmpl-1", created=5, model="m", choices=[choice])
        return json.loads(chunk.model_dump_json())

    first = want(Delta(role="assistant", content=""), None, [], [7])
    assert _event(w.choice(0, "", [], role=True, prompt_ids=[7])) == first
    assert _event(w.choice(0, "hi", [3])) == want(Delta(content="hi"), None, [3])
    assert _event(w.choice(0, None, [], "stop")) == want(Delta(), "stop", [])
    plain = ChunkWriter("chat", "chatcmpl-1", 5, "m", False)
    assert "token_ids" not in _event(plain.choice(0, "hi", [3]))["choices"][0]


@pytest.mark.parametrize("body,message,param", [
    (b'{"model": "m", "prompt": "x", "max_tokens": 2', "malformed JSON in the request body", None),
    (b"", "the request body is empty", None),
    (b'"x"', "the request body must be a JSON object", None),
    (b'{"prompt": "x"}', "model is required", "model"),
    (b'{"model": "m", "prompt": "x", "top_k": -2}', "top_k: Input should be greater than or equal to -1", "top_k"),
    (b'{"model": "m", "prompt": [[1], []]}', "must be a string, a list of strings", "prompt"),
    (b'{"model": "m", "prompt": "x", "stream_options": {"include_usage": true}}',
     "stream_options is only allowed with stream: true", None),
    (b'{"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", '
     b'"o", "p", "q"]}', "at most 16 stop strings, got 17", "stop"),
    (b'{"model": "m", "prompt": "x", "presence_penalty": 0.5}', "presence_penalty: not supported (only 0), got 0.5",
     "presence_penalty"),
    (b'{"model": "m", "prompt": "x", "seed": 18446744073709551616}', "seed: Input should be less than or equal to",
     "seed"),
], ids=["truncated", "empty", "not-object", "no-model", "top-k", "empty-id-list", "options-without-stream",
        "many-stops", "penalty", "seed-range"])
def test_completion_request_errors(body, message, param):
    with pytest.raises(BadRequest) as err:
        parse_request(body, CompletionRequest)
    assert message in err.value.message and err.value.param == param and err.value.status == 400


def test_requests_parse():
    r = parse_request(b'{"model": "m", "prompt": [[1, 2], [3]], "stop": "x", "stream": true, '
                      b'"stream_options": {"include_usage": true}, "seed": -5}', CompletionRequest)
    assert r.prompts() == [[1, 2], [3]] and r.stop_strings == ["x"] and r.include_usage and r.seed == -5
    c = parse_request(b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, '
                      b'{"type": "text", "text": "b"}]}], "max_completion_tokens": 3, "tool_choice": "none"}',
                      ChatCompletionRequest)
    assert c.token_limit == 3 and c.messages[0].for_template() == {"role": "user", "content": "ab"}


@pytest.mark.parametrize("extra,message,param", [
    ({"response_format": {"type": "json_object"}}, "response_format: only {'type': 'text'} is supported",
     "response_format"),
    ({"tool_choice": "auto"}, "tool_choice: not supported (tools are not)", "tool_choice"),
    ({"logprobs": True}, "logprobs: not supported", "logprobs"),
    ({"n": 4}, "n: only 1 is supported (one choice per prompt), got 4", "n"),
], ids=["json-format", "tool-choice", "logprobs", "n"])
def test_unsupported_chat_fields_are_named(extra, message, param):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(BadRequest) as err:
        parse_request(json.dumps(body).encode(), ChatCompletionRequest)
    assert message in err.value.message and err.value.param == param
    fine = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "text"}}
    parse_request(json.dumps(fine).encode(), ChatCompletionRequest)
