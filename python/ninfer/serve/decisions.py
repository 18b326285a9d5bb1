"""`POST /v1/decisions` and `POST /v1/systemone`: TypeSafe's System One body on both, answered by one decision job
per request (ninfer.decisions). The two differ only in their error bodies: `/v1/decisions` OpenAI's envelope
`{"error": {message, type, param, code}}`, `/v1/systemone` TypeSafe's `{"detail": ...}` (a 422 lists every
violation as `{type, loc, msg, input}`), with the same statuses (docs/decisions.md has the table).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import MediaType, Request, Response, post

from ninfer import errors
from ninfer.decisions.contract import ContractError, DecisionLimits, TooLargeError, load_json, parse_request
from ninfer.decisions.prompt import context_messages
from ninfer.decisions.readout import answer
from ninfer.decisions.runner import run_questions, typed_questions
from ninfer.serve.disconnect import run_while_connected
from ninfer.serve.errors import ErrorInfo, describe, openai_body
from ninfer.serve.gate import LeaseDependency
from ninfer.serve.openapi import JSON_OBJECT_BODY

LIMITS_STATE_KEY = "decision_limits"  # app.state entry: the DecisionLimits the server was started with


def limits_of(request: Request) -> DecisionLimits:
    return request.app.state.get(LIMITS_STATE_KEY) or DecisionLimits()


def served_name(model_id: str, temperature: float) -> str:
    return model_id if temperature == 1.0 else f"{model_id}-t{temperature:g}"


async def decide(request: Request, lease: LeaseDependency) -> dict[str, Any]:
    limits = limits_of(request)
    raw = await request.body()
    # Decoding and checking the contract, and building the shared context, take time in proportion to the body
    # (its JSON is read with a Python hook per object): off the event loop, as the generation routes read theirs.
    body = await asyncio.to_thread(lambda: parse_request(load_json(raw), limits))
    served = lease.served  # the model the body names, pinned by the gate
    shared = await asyncio.to_thread(context_messages, body.state, body.messages)
    work = run_questions(served.engine, shared, typed_questions(body.questions), limits, body.temperature)
    probs, input_tokens = await run_while_connected(request, work)
    return {"model": served_name(served.model_id, body.temperature),
            "answers": {q.id: answer(q, p) for q, p in zip(body.questions, probs, strict=True)},
            "usage": {"input_tokens": input_tokens, "output_tokens": 0}}


def error_info(exc: Exception) -> tuple[ErrorInfo, list[dict[str, Any]] | None]:
    """The status and description of a decision route's error, and the contract's violations when it has them."""
    if isinstance(exc, ContractError):
        kind = "invalid_request_error" if exc.status == 400 else "unprocessable_entity_error"
        first = exc.problems[0] if exc.problems else {"loc": []}
        param = ".".join(str(p) for p in first["loc"][1:]) or None
        return ErrorInfo(exc.status, str(exc), kind, param=param, code=kind), exc.problems
    if isinstance(exc, TooLargeError):
        return ErrorInfo(413, str(exc), "request_too_large_error", code="request_too_large_error"), None
    if isinstance(exc, errors.CapacityError):
        return ErrorInfo(400, str(exc), "invalid_request_error", code="context_length_exceeded"), None
    return describe(exc), None


# TypeSafe's `detail` for each status that is not a list of violations.
_TYPESAFE_KINDS = {401: "authentication_error", 403: "authentication_error", 413: "max_tokens_exceeded",
                   429: "rate_limit_error"}


class TypeSafeDetail(msgspec.Struct, kw_only=True):
    error_type: str
    message: str


class TypeSafeErrorBody(msgspec.Struct):
    """Every error body of `/v1/systemone` (TypeSafe's shape; the OpenAPI document's too): a 422 lists the
    contract's violations, every other status names its kind."""

    detail: TypeSafeDetail | list[dict[str, Any]]


def typesafe_body(info: ErrorInfo, problems: list[dict[str, Any]] | None) -> dict[str, Any]:
    if info.status == 422 and problems:
        return {"detail": problems}
    if info.code == "context_length_exceeded":
        return {"detail": {"error_type": "max_tokens_exceeded", "message": info.message}}
    kind = _TYPESAFE_KINDS.get(info.status, "api_error" if info.status >= 500 else "api_usage_error")
    return {"detail": {"error_type": kind, "message": info.message}}


def _respond(info: ErrorInfo, body: dict[str, Any]) -> Response:
    return Response(body, status_code=info.status, headers=info.headers, media_type=MediaType.JSON)


def openai_handler(request: Request, exc: Exception) -> Response:
    info, _ = error_info(exc)
    return _respond(info, openai_body(info))


def typesafe_handler(request: Request, exc: Exception) -> Response:
    info, problems = error_info(exc)
    return _respond(info, typesafe_body(info, problems))


_DOC = "TypeSafe System One: calibrated probabilities over each question's answers (docs/decisions.md)"


# The contract's shape violations are 422s (ninfer.serve.openapi documents them from `error_statuses`).
@post("/v1/decisions", status_code=200, exception_handlers={Exception: openai_handler}, summary=_DOC,
      opt={"error_statuses": (422,), JSON_OBJECT_BODY: True})
async def decisions(request: Request, lease: LeaseDependency) -> dict[str, Any]:
    return await decide(request, lease)


@post("/v1/systemone", status_code=200, exception_handlers={Exception: typesafe_handler},
      summary=_DOC + "; errors in TypeSafe's `detail` shape",
      opt={"error_statuses": (422,), "error_body": TypeSafeErrorBody, JSON_OBJECT_BODY: True})
async def systemone(request: Request, lease: LeaseDependency) -> dict[str, Any]:
    return await decide(request, lease)


route_handlers = [decisions, systemone]
