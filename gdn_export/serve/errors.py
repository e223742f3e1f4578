"""The errors a request can meet, each with its HTTP status and OpenAI error type.

Every one becomes the body OpenAI's API returns (`ServeError.body`):

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": null}}

400 bad request (malformed JSON, an unknown field, a bad or unsupported parameter, a prompt that
does not fit the cache), 401 a missing or wrong API key, 404 an unknown model or route, 429 a full
queue (with Retry-After), 500 a failure inside the model call, 503 the server is draining.
"""

from __future__ import annotations

from gdn_export.errors import GdnExportError


class ServeError(GdnExportError):
    """One request's error: `status` (HTTP), `kind` (OpenAI's error type), `param` (the request
    field at fault, or None), `code` (a short machine-readable reason, or None)."""

    status = 500
    kind = "internal_error"

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {}


class BadRequest(ServeError):
    status, kind = 400, "invalid_request_error"


class Unauthorized(ServeError):
    status, kind = 401, "authentication_error"


class NotFound(ServeError):
    status, kind = 404, "not_found_error"


class QueueFull(ServeError):
    """The waiting queue is at --max-queue; `retry_after` seconds is a guess at when it has room."""

    status, kind = 429, "rate_limit_error"

    def __init__(self, message: str, retry_after: int):
        super().__init__(message, code="queue_full")
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class EngineFailure(ServeError):
    """The model call that held this request failed; the server goes on with the others."""

    status, kind = 500, "internal_error"


class Unavailable(ServeError):
    """The server is draining (SIGTERM) or its engine stopped."""

    status, kind = 503, "service_unavailable"
