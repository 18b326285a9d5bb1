"""Every error the server returns, mapped in one place to a status code and the protocol's own error body.

Handlers never build error responses: they raise. `ninfer.errors` classes come from the engine and the frontend;
the two below are the server's own refinements of them (the body needs fields the base classes do not carry):

- `InvalidRequestError(message, param=...)`: the request is well-formed JSON but asks for something refused
  (`n` above the lanes, an unknown option value). 400.
- `ContextOverflowError(n_prompt_tokens, n_ctx)`: the prompt leaves no room to generate. 400 with both numbers as
  fields of the error object, in both protocols' shapes (llama.cpp's `exceed_context_size_error`, which its web UI
  reads).

The body's shape depends on the route: Anthropic routes (`/v1/messages...`) answer
`{"type":"error","error":{"type","message"}}`, every other route OpenAI's `{"error":{"message","type","param","code"}}`.
`EngineBusyError` is a 429 with `Retry-After`; a RecursionError (a body nested deeper than the decoders go) is a 400.
Anything unexpected is logged and answered as a 500 in the same shape:
client input must never reach that branch (schemathesis checks it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Literal

import msgspec
from litestar import MediaType, Request, Response
from litestar.exceptions import ClientException, HTTPException, ValidationException

from ninfer import errors

log = logging.getLogger("ninfer.serve")

RETRY_AFTER_S = 1
ANTHROPIC_PREFIX = "/v1/messages"


class InvalidRequestError(errors.EngineError):
    """A request the server refuses as asked; `param` names the offending field when there is one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextOverflowError(errors.CapacityError):
    """The prompt does not leave room for one generated token."""

    def __init__(self, n_prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(
            f"the request has {n_prompt_tokens} prompt tokens, which leaves no room to generate in the "
            f"context of {n_ctx} tokens"
        )
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


class TextOverflowError(ContextOverflowError):
    """The prompt's text is so long that it cannot fit the context whatever it tokenizes to: refused without
    tokenizing it, so `n_prompt_tokens` is a lower bound (the text's length over the most characters one token
    covers)."""

    def __init__(self, n_chars: int, at_least_tokens: int, n_ctx: int) -> None:
        super().__init__(at_least_tokens, n_ctx)
        self.args = (
            (f"the request's prompt text has {n_chars} characters, at least {at_least_tokens} tokens, which "
             f"cannot fit the context of {n_ctx} tokens"),
        )


class Conflict(ClientException):
    """What was asked does not fit the addressed thing's present state (a generation whose reasoning cannot be
    ended, a model that is neither loaded nor loading): 409, in the route's error shape."""

    status_code = 409


class ServerShuttingDownError(errors.NinferError):
    """The server is shutting down (ninfer.serve.shutdown): the request was refused, or its stream ended before its
    answer was complete."""


@dataclass(frozen=True)
class ErrorInfo:
    """A protocol-neutral description of one error response."""

    status: int
    message: str
    kind: str  # OpenAI `type`: invalid_request_error, authentication_error, ...
    param: str | None = None
    code: str | None = None
    extra: dict[str, int] | None = None  # more fields of the error object (OpenAIError's optional ones)
    headers: dict[str, str] | None = None


# OpenAI error type -> Anthropic error type.
_ANTHROPIC_TYPES = {
    "invalid_request_error": "invalid_request_error",
    "exceed_context_size_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "not_found_error": "not_found_error",
    "rate_limit_error": "rate_limit_error",
    "server_error": "api_error",
    "unavailable_error": "overloaded_error",
}

_HTTP_KINDS = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error",
               503: "unavailable_error", 529: "unavailable_error"}


def describe(exc: Exception) -> ErrorInfo:
    """The response an exception deserves. Order matters: subclasses before their bases."""
    if isinstance(exc, ContextOverflowError):
        return ErrorInfo(
            400,
            str(exc),
            "exceed_context_size_error",
            code="context_length_exceeded",
            extra={"n_prompt_tokens": exc.n_prompt_tokens, "n_ctx": exc.n_ctx},
        )
    if isinstance(exc, InvalidRequestError):
        return ErrorInfo(400, str(exc), "invalid_request_error", param=exc.param)
    if isinstance(exc, errors.EngineBusyError):
        return ErrorInfo(
            429, str(exc), "rate_limit_error", code="engine_busy", headers={"Retry-After": str(RETRY_AFTER_S)}
        )
    if isinstance(exc, ServerShuttingDownError):
        return ErrorInfo(503, str(exc), "unavailable_error", code="shutting_down",
                         headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, errors.OutOfMemoryError):
        return ErrorInfo(503, str(exc), "unavailable_error", headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, errors.EngineError):  # bad token id, sampling value, template refusal, capacity
        return ErrorInfo(400, str(exc), "invalid_request_error")
    if isinstance(exc, RecursionError):
        # The server recurses only over what a request holds (its JSON, a schema, a template's data): a request
        # nested deeper than the interpreter's stack, which the JSON decoders refuse this way.
        return ErrorInfo(400, "the request is nested too deeply", "invalid_request_error")
    if isinstance(exc, ValidationException):
        return ErrorInfo(400, _validation_message(exc), "invalid_request_error", param=_validation_param(exc))
    if isinstance(exc, HTTPException):
        kind = _HTTP_KINDS.get(
            exc.status_code, "invalid_request_error" if exc.status_code < 500 else "server_error"
        )
        return ErrorInfo(exc.status_code, exc.detail, kind, headers=dict(exc.headers or {}) or None)
    log.exception("unexpected error while serving a request", exc_info=exc)
    return ErrorInfo(500, f"internal error: {type(exc).__name__}", "server_error")


def _validation_message(exc: ValidationException) -> str:
    details = exc.extra if isinstance(exc.extra, list) else []
    parts = [d.get("message", "") for d in details if isinstance(d, dict)]
    return "; ".join(p for p in parts if p) or exc.detail


def _validation_param(exc: ValidationException) -> str | None:
    details = exc.extra if isinstance(exc.extra, list) else []
    for d in details:
        if isinstance(d, dict) and isinstance(d.get("key"), str):
            return d["key"]
    return None


class OpenAIError(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None
    code: str
    # exceed_context_size_error only (llama.cpp's, which its web UI reads)
    n_prompt_tokens: int | msgspec.UnsetType = msgspec.UNSET
    n_ctx: int | msgspec.UnsetType = msgspec.UNSET


class OpenAIErrorBody(msgspec.Struct):
    """Every error body of the OpenAI-style routes (the OpenAPI document's too: ninfer.serve.openapi)."""

    error: OpenAIError


class AnthropicError(msgspec.Struct, kw_only=True):
    type: str
    message: str
    n_prompt_tokens: int | msgspec.UnsetType = msgspec.UNSET
    n_ctx: int | msgspec.UnsetType = msgspec.UNSET


class AnthropicErrorBody(msgspec.Struct, kw_only=True):
    """Every error body of the Anthropic routes (`/v1/messages...`)."""

    type: Literal["error"]
    error: AnthropicError


def openai_body(info: ErrorInfo) -> dict[str, Any]:
    error = OpenAIError(message=info.message, type=info.kind, param=info.param, code=info.code or info.kind,
                        **(info.extra or {}))
    return msgspec.to_builtins(OpenAIErrorBody(error))


def anthropic_body(info: ErrorInfo) -> dict[str, Any]:
    error = AnthropicError(type=_ANTHROPIC_TYPES.get(info.kind, "api_error"), message=info.message,
                           **(info.extra or {}))
    return msgspec.to_builtins(AnthropicErrorBody(type="error", error=error))


def body_for_path(path: str, info: ErrorInfo) -> dict[str, Any]:
    return anthropic_body(info) if path.startswith(ANTHROPIC_PREFIX) else openai_body(info)


def _wire_name(request: Request, key: str | None) -> str | None:
    """A parameter as the client spells it: Litestar names a refused query parameter by its Python name
    (`offset`), not by the name the route declares for it (`from`)."""
    handler = request.scope.get("route_handler")
    parameter = handler.parsed_fn_signature.parameters.get(key) if handler is not None and key else None
    alias = getattr(getattr(parameter, "kwarg_definition", None), "name", None)
    return alias if isinstance(alias, str) else key


def handle_exception(request: Request, exc: Exception) -> Response:
    """The app's one exception handler."""
    info = describe(exc)
    if isinstance(exc, ValidationException):
        info = replace(info, param=_wire_name(request, info.param))
    return Response(
        body_for_path(request.url.path, info),
        status_code=info.status,
        headers=info.headers,
        media_type=MediaType.JSON,
    )


EXCEPTION_HANDLERS = {Exception: handle_exception}
