"""Errors of the HTTP model clients, carrying the server's own explanation.

Names follow the ``openai`` SDK's, so code written against it maps one to one,
but ``str(exc)`` always holds the status and the server's message (OpenAI's
``{"error": {"message", "type", "code"}}``, FastAPI's ``{"detail": ...}`` or plain
text), e.g. ``HTTP 400 Bad Request: The model 'gpt-5' does not exist (code:
model_not_found)`` rather than a bare status. Connection errors, timeouts included,
are also :class:`ConnectionError`, so generic ``except ConnectionError`` handlers
treat them as transient. A request timeout is deliberately *not* a
:class:`TimeoutError`: environments catch that for their own turn and rollout
deadlines (a stop reason), while a request that never got its answer is an error
of the rollout (as in the ``openai`` SDK, whose ``APITimeoutError`` is not one either).

The key sent with a request never appears in an error: :func:`redact_secrets`
(:mod:`vfops._redact`) removes it, in any encoding, from the server's message (some
echo the ``Authorization`` header back) before the error is built, so every record of
the error holds the redacted text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from vfops._redact import REDACTED as REDACTED  # re-exported: the name tests know
from vfops._redact import redact_secrets, redact_url_credentials

MAX_MESSAGE_CHARS = 1000
"""A server's message is cut here: enough for a vLLM context-length explanation."""

MAX_TEXT_BODY_CHARS = 500
"""A non-JSON body (a proxy's HTML page, a stack trace) is cut shorter."""


class APIError(Exception):
    """Base of every error an :class:`~vfops.clients.OpenAIClient` request raises."""


class MalformedResponseError(APIError):
    """The server answered 200 but the body is not a chat completion (bad JSON or
    shape). Retryable: a truncated body is usually a transient proxy fault."""


class APIConnectionError(APIError, ConnectionError):
    """No HTTP response: the connection could not be made or broke mid-request."""


class APITimeoutError(APIConnectionError):
    """No response within the client's timeout (not a :class:`TimeoutError`: see the
    module doc)."""


class APIStatusError(APIError):
    """The server answered with a non-2xx status.

    ``status_code``: the HTTP status. ``message``: the server's explanation (empty
    when it gave none). ``body``: the decoded JSON body, or the text of a non-JSON
    one. ``code`` / ``error_type``: OpenAI's ``error.code`` / ``error.type`` when
    present. ``retry_after_s``: the server's ``Retry-After`` / ``retry-after-ms``
    in seconds, if any. ``note``: how the client's retries ended, if they did.
    """

    def __init__(
        self,
        status_code: int,
        message: str = "",
        *,
        body: Any = None,
        code: str | int | None = None,
        error_type: str | None = None,
        retry_after_s: float | None = None,
        reason: str | None = None,
        note: str = "",
    ) -> None:
        self.status_code = status_code
        self.message = message
        self.body = body
        self.code = code
        self.error_type = error_type
        self.retry_after_s = retry_after_s
        self.reason = reason
        self.note = note
        super().__init__(self._describe())

    def _describe(self) -> str:
        text = f"HTTP {self.status_code}"
        if self.reason:
            text += f" {self.reason}"
        if self.message:
            text += f": {self.message}"
        if isinstance(self.code, str) and self.code and self.code not in self.message:
            text += f" (code: {self.code})"
        if self.note:
            text += f"; {self.note}"
        return text

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only fields do not survive the default pickling (by ``args``);
        # errors cross process boundaries in Prefect task results.
        return (_rebuild_status_error, (type(self), self.__dict__.copy()))


def with_note(exc: APIError, note: str) -> APIError:
    """A copy of ``exc`` (same class and fields) whose message ends with ``; note``:
    ``str(exc)`` is what a rollout records, so how its retries ended belongs in it."""
    if isinstance(exc, APIStatusError):
        return _rebuild_status_error(type(exc), {**exc.__dict__, "note": note})
    return type(exc)(f"{exc}; {note}")


def _rebuild_status_error(cls: type[APIStatusError], state: dict[str, Any]) -> APIStatusError:
    exc = cls.__new__(cls)
    exc.note = ""  # pickled by a version without notes
    exc.__dict__.update(state)
    Exception.__init__(exc, exc._describe())
    return exc


class BadRequestError(APIStatusError):
    """HTTP 400: the request is invalid (unknown model name, bad parameter...)."""


class AuthenticationError(APIStatusError):
    """HTTP 401: missing or wrong API key."""


class PermissionDeniedError(APIStatusError):
    """HTTP 403: the key may not use this model or route."""


class NotFoundError(APIStatusError):
    """HTTP 404: wrong base URL or route, or an unknown model."""


class ConflictError(APIStatusError):
    """HTTP 409."""


class RequestTooLargeError(APIStatusError):
    """HTTP 413: the request body is over the server's limit."""


class UnprocessableEntityError(APIStatusError):
    """HTTP 422: well-formed JSON the server cannot act on."""


class RateLimitError(APIStatusError):
    """HTTP 429: over the rate or quota limit (retried, honouring ``Retry-After``)."""


class InternalServerError(APIStatusError):
    """HTTP 5xx (retried)."""


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: RequestTooLargeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def status_error_class(status_code: int) -> type[APIStatusError]:
    """The :class:`APIStatusError` subclass for ``status_code``."""
    if status_code >= 500:
        return InternalServerError
    return _BY_STATUS.get(status_code, APIStatusError)


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _explanation(body: Any) -> tuple[str, str | int | None, str | None]:
    """(message, code, type) from a decoded JSON error body, in the shapes servers use."""
    if isinstance(body, str):
        return body, None, None
    if not isinstance(body, dict):
        return orjson.dumps(body).decode(), None, None
    error = body.get("error")
    if isinstance(error, dict):  # OpenAI, vLLM, most proxies
        message = error.get("message")
        code = error.get("code")
        kind = error.get("type")
        return (
            str(message) if message is not None else orjson.dumps(error).decode(),
            code if isinstance(code, str | int) else None,
            kind if isinstance(kind, str) else None,
        )
    for key in ("error", "message", "detail"):  # {"error": "..."}, FastAPI's {"detail": ...}
        value = body.get(key)
        if value:
            return (value if isinstance(value, str) else orjson.dumps(value).decode()), None, None
    return orjson.dumps(body).decode(), None, None


def error_from_response(
    status_code: int,
    content: bytes,
    *,
    reason: str | None = None,
    retry_after_s: float | None = None,
    location: str | None = None,
    secrets: Sequence[str] = (),
) -> APIStatusError:
    """The :class:`APIStatusError` (subclass by status) for a non-2xx response.

    ``secrets`` (the request's API key) are redacted from the body before anything
    is read from it, so neither the message nor ``body`` holds them, and before the
    message is cut to length, so no cut-off piece of one survives either.
    """
    body: Any
    code: str | int | None = None
    kind: str | None = None
    if secrets:
        content = redact_secrets(content.decode("utf-8", errors="replace"), secrets).encode()
        location = location and redact_secrets(location, secrets)
    location = location and redact_url_credentials(location)
    try:
        body = orjson.loads(content) if content.strip() else None
    except orjson.JSONDecodeError:
        body = content.decode("utf-8", errors="replace")
        message = _one_line(body, MAX_TEXT_BODY_CHARS)
    else:
        message = ""
        if body is not None:
            message, code, kind = _explanation(body)
            message = _one_line(message, MAX_MESSAGE_CHARS)
    if location:  # a redirect: most likely http:// where the server wants https://
        message = f"redirected to {location}; use that as the base URL. {message}".strip()
    return status_error_class(status_code)(
        status_code,
        message,
        body=body,
        code=code,
        error_type=kind,
        retry_after_s=retry_after_s,
        reason=reason,
    )
