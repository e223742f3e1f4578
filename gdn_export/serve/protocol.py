"""Requests and responses in OpenAI's shapes (pydantic), and the checks that make bad ones a 400.

Requests are parsed from the raw body (`parse_request`): malformed JSON, a field of the wrong type
or out of range, and a field OpenAI does not define (extra="forbid") each give one BadRequest
naming the field. OpenAI fields this server does not implement (n > 1, logprobs, penalties,
logit_bias, tools, images ...) are refused by name rather than ignored. Extensions, as vLLM spells
them: top_k, stop_token_ids, ignore_eos, return_token_ids (the token ids beside the text; always
on for a checkpoint without a tokenizer), chat_template_kwargs.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Callable, ClassVar, Literal, Union

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer,
                      model_validator)

from gdn_export.serve.errors import BadRequest

MAX_STOP_STRINGS = 16
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes


class _Request(BaseModel):
    """A request body. UNSUPPORTED: OpenAI fields this server does not implement, {field: (asks for
    it?, what the 400 says)}; `refuse_unsupported` checks them after the types."""

    model_config = ConfigDict(extra="forbid", strict=True)
    UNSUPPORTED: ClassVar[dict[str, tuple[Callable[[Any], bool], str]]] = {}

    def refuse_unsupported(self) -> None:
        for name, (asked, message) in self.UNSUPPORTED.items():
            value = getattr(self, name)
            if asked(value):
                raise BadRequest(f"{name}: {message.format(value)}", param=name)


class StreamOptions(_Request):
    include_usage: bool = False


class _Sampling(_Request):
    """Fields /v1/completions and /v1/chat/completions share."""

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    seed: Annotated[int, Field(ge=SEED_RANGE[0], le=SEED_RANGE[1])] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    UNSUPPORTED = {
        "n": (lambda v: v not in (None, 1), "only 1 is supported (one choice per prompt), got {}"),
        "presence_penalty": (bool, "not supported (only 0), got {}"),
        "frequency_penalty": (bool, "not supported (only 0), got {}"),
        "logit_bias": (bool, "not supported"),
    }

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        if any(s == "" for s in stops):
            raise ValueError("stop strings must not be empty")
        return v

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @model_validator(mode="after")
    def _stream_options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")
        return self


class CompletionRequest(_Sampling):
    """POST /v1/completions. prompt: a string, a list of strings, token ids, or lists of token ids
    (one choice each)."""

    prompt: Union[str, list[int], list[str], list[list[int]]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None
    UNSUPPORTED = {**_Sampling.UNSUPPORTED,
                   "logprobs": (lambda v: v is not None, "not supported"),
                   "best_of": (lambda v: v not in (None, 1), "only 1 is supported, got {}"),
                   "suffix": (bool, "not supported")}

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, v):
        if isinstance(v, str):
            return v
        if not isinstance(v, list) or not v:
            raise ValueError("must be a string, a list of strings, a list of token ids or a list of "
                             "lists of token ids, and not empty")
        if all(isinstance(x, int) and not isinstance(x, bool) for x in v) or all(isinstance(x, str) for x in v):
            return v
        if all(isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
               for x in v):
            return v
        raise ValueError("must be a string, a list of strings, a list of token ids or a list of "
                         "non-empty lists of token ids")

    def prompts(self) -> list[str | list[int]]:
        """The prompts, one per choice: strings or token-id lists."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class TextPart(_Request):
    type: Literal["text"]
    text: str


class Message(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v):
        if isinstance(v, list):
            for part in v:
                if part.get("type") != "text":
                    raise ValueError(f"content parts of type {part.get('type')!r} are not supported "
                                     f"(text only)")
                TextPart.model_validate(part)
        return v

    @field_validator("tool_calls")
    @classmethod
    def _no_tool_calls(cls, v):
        if v:
            raise ValueError("tool calls are not supported")
        return v

    def for_template(self) -> dict:
        """The message as chat templates read it (content parts joined into one string)."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part["text"] for part in content)
        out = {"role": self.role, "content": content if content is not None else ""}
        for key in ("name", "reasoning_content", "tool_call_id"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    UNSUPPORTED = {**_Sampling.UNSUPPORTED,
                   "logprobs": (bool, "not supported"),
                   "top_logprobs": (bool, "not supported"),
                   "tools": (bool, "tools are not supported"),
                   "tool_choice": (lambda v: v not in (None, "none"), "not supported (tools are not)"),
                   "response_format": (lambda v: v is not None and v.get("type") != "text",
                                       "only {{'type': 'text'}} is supported, got {}")}

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def parse_request(body: bytes, model: type[_Request]) -> Any:
    """`model` from a request body, or BadRequest naming the first problem (module docstring)."""
    if not body.strip():
        raise BadRequest("the request body is empty: send a JSON object")
    try:
        request = model.model_validate_json(body)
    except ValidationError as exc:
        raise _bad_request(exc) from None
    request.refuse_unsupported()
    return request


def _bad_request(exc: ValidationError) -> BadRequest:
    err = exc.errors(include_url=False)[0]
    loc = [p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in _UNION_TAGS))]
    param = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(loc)) or None
    kind, msg = err["type"], err["msg"].removeprefix("Value error, ")
    if kind == "json_invalid":
        return BadRequest(f"malformed JSON in the request body: {err['ctx'].get('error', msg)}")
    if kind == "model_type" and not loc:
        return BadRequest("the request body must be a JSON object")
    if kind == "extra_forbidden":
        return BadRequest(f"unknown field {param!r}", param=param)
    if kind == "missing":
        return BadRequest(f"{param} is required", param=param)
    return BadRequest(f"{param}: {msg}" if param else msg, param=param)


_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "function-after", "function-before",
               "constrained-int", "constrained-float"}


# ------------------------------------------------------------------------------ responses


class _Response(BaseModel):
    """OpenAI response shapes. Fields named in `_drop_when_none` (the extensions) are left out of the
    JSON when None. The stream's events are written by gdn_export.serve.chunks in the same shapes."""

    _drop_when_none: tuple[str, ...] = ()

    @model_serializer(mode="wrap")
    def _drop(self, handler):
        data = handler(self)
        for key in self._drop_when_none:
            if data.get(key) is None:
                data.pop(key, None)
        return data


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class _Choice(_Response):
    """What every choice has; token_ids / prompt_token_ids only with return_token_ids (or without a
    tokenizer)."""

    _drop_when_none = ("token_ids", "prompt_token_ids")
    index: int
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionChoice(_Choice):
    text: str


class _Envelope(_Response):
    """What every response and stream chunk has around its choices."""

    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    usage: Usage | None = None


class Completion(_Envelope):
    """A /v1/completions response, or (object "text_completion" too) one of its stream's chunks:
    "usage": null in every chunk but the usage chunk (stream_options.include_usage), which has no
    choices."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class ChatMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Choice):
    message: ChatMessage


class ChatCompletion(_Envelope):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


class Delta(_Response):
    _drop_when_none = ("role", "content")
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Choice):
    delta: Delta


class ChatCompletionChunk(_Envelope):
    """One chunk of a /v1/chat/completions stream: "usage": null but in the usage chunk
    (stream_options.include_usage), which has no choices."""

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "gdn-export"
    max_model_len: int


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]
