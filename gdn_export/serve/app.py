"""The HTTP side (FastAPI): OpenAI's routes over one Engine.

    POST /v1/completions        prompt: text or token ids (a list of them: one choice each)
    POST /v1/chat/completions   messages through the checkpoint's chat template
    GET  /v1/models             the one model served
    GET  /health                200 while serving, 503 while draining or after the engine stopped
    GET  /metrics               Prometheus text (gdn_export.serve.metrics)

Streaming ("stream": true) sends server-sent events: `data: {chunk}` per batch of new text, the
finish reason, with stream_options.include_usage a last chunk with the usage and no choices, then
`data: [DONE]`; an error after the stream began comes as `data: {"error": {...}}` before [DONE].
Every error is OpenAI's error body with its status (gdn_export.serve.errors). A client that
disconnects, streaming or not, cancels its engine requests: their rows are freed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gdn_export.serve.chunks import ChunkWriter
from gdn_export.serve.engine import Engine
from gdn_export.serve.errors import BadRequest, NotFound, ServeError, Unauthorized, Unavailable
from gdn_export.serve.metrics import ServeMetrics
from gdn_export.serve.protocol import (ChatChoice, ChatCompletion, ChatCompletionRequest, ChatMessage, Completion,
                                       CompletionChoice, CompletionRequest, ModelCard, ModelList, Usage,
                                       parse_request)
from gdn_export.serve.requests import Choice, Dispatcher, next_outputs
from gdn_export.serve.sampling import SamplingParams
from gdn_export.serve.tokenizer import ServeTokenizer

log = logging.getLogger("gdn_export.serve")
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the cache's room
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class ServeConfig:
    """model_name: the id clients send as "model"; checkpoint: the folder (for messages);
    sampling_defaults: temperature / top_p / top_k of requests that omit them
    (generation_config.json); api_key: required as "Authorization: Bearer KEY" when set."""

    model_name: str
    checkpoint: str = ""
    sampling_defaults: dict = field(default_factory=dict)
    api_key: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))


def create_app(engine: Engine, tokenizer: ServeTokenizer | None, config: ServeConfig) -> FastAPI:
    """The FastAPI app serving `engine` (None tokenizer: token-id prompts only); its lifespan starts
    the engine thread (delivering onto the app's event loop) and stops it. /metrics serves the
    engine's ServeMetrics (one is made and given to the engine if it has none)."""
    if not isinstance(engine.metrics, ServeMetrics):
        engine.metrics = ServeMetrics()
    metrics = engine.metrics
    metrics.bind(engine.stats)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.deliver = Dispatcher(asyncio.get_running_loop()).deliver
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(title="gdn-export serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    api = _Api(engine, tokenizer, config, metrics)

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, exc: ServeError):
        metrics.on_rejected(exc.status)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            error: ServeError = NotFound(f"no route {request.method} {request.url.path}")
        elif exc.status_code == 405:
            error = BadRequest(f"method {request.method} is not allowed on {request.url.path}")
        else:
            error = BadRequest(str(exc.detail))
        return JSONResponse(error.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        error = ServeError(f"internal error: {type(exc).__name__}: {exc}")
        return JSONResponse(error.body(), status_code=500)

    @app.get("/health")
    async def health():
        if engine.dead is not None:
            return JSONResponse({"status": "failed", "reason": engine.dead}, status_code=503)
        if engine.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models")
    async def models(request: Request):
        api.authorize(request)
        card = ModelCard(id=config.model_name, created=config.created, max_model_len=engine.cache_len)
        return JSONResponse(ModelList(data=[card]).model_dump())

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await api.completions(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await api.chat(request)

    return app


class _Api:
    def __init__(self, engine: Engine, tokenizer: ServeTokenizer | None, config: ServeConfig,
                 metrics: ServeMetrics):
        self.engine, self.tokenizer, self.config, self.metrics = engine, tokenizer, config, metrics

    # ------------------------------------------------------------------ checks
    def authorize(self, request: Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise Unauthorized("missing or wrong API key: send 'Authorization: Bearer KEY'", code="invalid_api_key")

    async def _parse(self, request: Request, model):
        self.authorize(request)
        if self.engine.draining:
            raise Unavailable("the server is shutting down and takes no new requests", code="draining")
        body = parse_request(await request.body(), model)
        if body.model != self.config.model_name:
            raise NotFound(f"the model {body.model!r} does not exist; this server serves "
                           f"{self.config.model_name!r}", param="model", code="model_not_found")
        return body

    def _params(self, body, prompt_len: int, max_tokens: int | None, default_max: int) -> SamplingParams:
        d = self.config.sampling_defaults
        temperature = body.temperature if body.temperature is not None else d.get("temperature", 1.0)
        top_p = body.top_p if body.top_p is not None else d.get("top_p", 1.0)
        top_k = body.top_k if body.top_k is not None else d.get("top_k", 0)
        if max_tokens is None:
            max_tokens = max(1, min(default_max, self.engine.cache_len - prompt_len))
        param = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) is not None else "max_tokens"
        self.engine.sched.check_fits(prompt_len, max_tokens, param)
        return SamplingParams(max_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                              top_k=max(int(top_k), 0), seed=body.seed,
                              stop_token_ids=frozenset(body.stop_token_ids or ()), ignore_eos=body.ignore_eos)

    def _submit(self, choices: list[Choice]) -> None:
        """Queue every choice's engine request, or none of them."""
        try:
            for c in choices:
                c.seq = self.engine.submit(c.prompt_ids, c.params, c)
        except ServeError:
            self._cancel(choices)
            raise

    def _cancel(self, choices: list[Choice]) -> None:
        for c in choices:
            if c.seq is not None and not c.done:
                self.engine.cancel(c.seq)

    # ------------------------------------------------------------------ /v1/completions
    async def completions(self, request: Request):
        body: CompletionRequest = await self._parse(request, CompletionRequest)
        queue: asyncio.Queue = asyncio.Queue()
        choices, prompt_texts = [], []
        for i, prompt in enumerate(body.prompts()):
            if isinstance(prompt, str):
                if self.tokenizer is None:
                    raise BadRequest(f"this checkpoint has no tokenizer (no tokenizer files in "
                                     f"{self.config.checkpoint}): give the prompt as token ids", param="prompt")
                ids = self.tokenizer.encode(prompt)
            else:
                ids = list(prompt)
            if not ids:
                raise BadRequest("the prompt is empty: give at least one token", param="prompt")
            params = self._params(body, len(ids), body.max_tokens, COMPLETION_MAX_TOKENS)
            stream = self.tokenizer.stream(body.stop_strings, ids) if self.tokenizer else None
            choices.append(Choice(i, ids, params, stream, queue))
            echo = ""
            if body.echo and self.tokenizer is not None:
                echo = prompt if isinstance(prompt, str) else self.tokenizer.decode(ids)
            prompt_texts.append(echo)
        with_ids = body.return_token_ids or self.tokenizer is None
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        writer = ChunkWriter("completion", rid, created, body.model, with_ids)

        async def events() -> AsyncIterator[str]:
            started = set()
            async for c, delta in self._deltas(choices, queue):
                first = c.index not in started
                started.add(c.index)
                text = (prompt_texts[c.index] if first else "") + delta.text
                yield writer.choice(c.index, text, delta.token_ids, delta.finish_reason,
                                    prompt_ids=c.prompt_ids if first else None)
            if body.include_usage:
                yield writer.usage(*_counts(choices))

        def whole() -> Completion:
            return Completion(id=rid, created=created, model=body.model, usage=_usage(choices), choices=[
                CompletionChoice(index=c.index, text=prompt_texts[c.index] + c.text, finish_reason=c.finish_reason,
                                 token_ids=c.token_ids if with_ids else None,
                                 prompt_token_ids=c.prompt_ids if with_ids else None) for c in choices])

        return await self._respond(request, body.stream, choices, queue, events, whole)

    # ------------------------------------------------------------------ /v1/chat/completions
    async def chat(self, request: Request):
        body: ChatCompletionRequest = await self._parse(request, ChatCompletionRequest)
        if self.tokenizer is None:
            raise BadRequest(f"this checkpoint has no tokenizer (no tokenizer files in {self.config.checkpoint}): "
                             f"chat needs one; use /v1/completions with token-id prompts", param="messages")
        ids = self.tokenizer.chat([m.for_template() for m in body.messages], body.chat_template_kwargs)
        params = self._params(body, len(ids), body.token_limit, self.engine.cache_len)
        queue: asyncio.Queue = asyncio.Queue()
        choices = [Choice(0, ids, params, self.tokenizer.stream(body.stop_strings, ids), queue)]
        with_ids = body.return_token_ids
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        writer = ChunkWriter("chat", rid, created, body.model, with_ids)

        async def events() -> AsyncIterator[str]:
            yield writer.choice(0, "", [], role=True, prompt_ids=ids)
            async for c, delta in self._deltas(choices, queue):
                if delta.text or delta.token_ids:
                    yield writer.choice(0, delta.text, delta.token_ids)
                if delta.finish_reason is not None:
                    yield writer.choice(0, None, [], delta.finish_reason)
            if body.include_usage:
                yield writer.usage(*_counts(choices))

        def whole() -> ChatCompletion:
            c = choices[0]
            return ChatCompletion(id=rid, created=created, model=body.model, usage=_usage(choices), choices=[
                ChatChoice(index=0, message=ChatMessage(content=c.text), finish_reason=c.finish_reason,
                           token_ids=c.token_ids if with_ids else None, prompt_token_ids=ids if with_ids else None)])

        return await self._respond(request, body.stream, choices, queue, events, whole)

    # ------------------------------------------------------------------ shared
    async def _respond(self, request: Request, stream: bool, choices: list[Choice], queue: asyncio.Queue,
                       events, whole):
        """Queue the choices, then stream events() or wait for them all and answer whole()."""
        self._submit(choices)
        if stream:
            return self._event_stream(events(), choices)
        await self._wait_all(request, choices, queue)
        return JSONResponse(whole().model_dump())

    async def _deltas(self, choices: list[Choice], queue: asyncio.Queue):
        """(choice, Delta) per choice per batch of outputs, until every choice is done; a batch's
        outputs of one choice are merged into one delta."""
        while not all(c.done for c in choices):
            merged: dict[int, tuple[Choice, object]] = {}
            for c, out in await next_outputs(queue):
                d = c.take(out, self.engine)
                if c.index in merged:
                    m = merged[c.index][1]
                    m.text += d.text
                    m.token_ids += d.token_ids
                    m.finish_reason = d.finish_reason or m.finish_reason
                elif d.text or d.token_ids or d.finish_reason:
                    merged[c.index] = (c, d)
            for item in merged.values():
                yield item

    async def _wait_all(self, request: Request, choices: list[Choice], queue: asyncio.Queue) -> None:
        """Run every choice to its end; a client that disconnects first cancels them."""
        async def run():
            async for _ in self._deltas(choices, queue):
                pass

        work = asyncio.ensure_future(run())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not work.done():
                work.cancel()
                self._cancel(choices)
            gone.cancel()
        work.result()  # its ServeError, if a choice failed

    def _event_stream(self, events: AsyncIterator[str], choices: list[Choice]) -> StreamingResponse:
        async def body():
            try:
                async for event in events:
                    yield event
            except ServeError as exc:
                self.metrics.on_rejected(exc.status)
                yield f"data: {_json(exc.body())}\n\n"
            except Exception as exc:  # a bug: the client still gets an error event, the server goes on
                log.exception("unexpected error in a stream")
                yield f"data: {_json(ServeError(f'internal error: {type(exc).__name__}: {exc}').body())}\n\n"
            finally:  # also when the client went away (the response task is cancelled)
                self._cancel(choices)
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _counts(choices: list[Choice]) -> tuple[int, int]:
    """(prompt tokens, completion tokens) of a request's choices."""
    return sum(len(c.prompt_ids) for c in choices), sum(len(c.token_ids) for c in choices)


def _usage(choices: list[Choice]) -> Usage:
    prompt, completion = _counts(choices)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def _json(data) -> str:
    import json

    return json.dumps(data, separators=(",", ":"))
