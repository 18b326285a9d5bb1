"""Wrong JSON types are refused, not coerced, and a body that says it is not JSON is not read as JSON.

Litestar converts a decoded body into its route's model with msgspec in lax mode (`strict=False`), so `"8"` becomes
8 and `"true"` becomes True. The protocols' own servers refuse such bodies, and clients that send them have a bug
worth hearing about, so every route with a JSON body model first converts the body strictly (msgspec still takes an
integer for a float) and answers a 400 naming the field when that fails.

A whole-number float (`8.0`) is an integer in JSON Schema 2020-12, the dialect of the OpenAPI document, and clients
and schema-driven fuzzers send it; the strict check reads it as the integer it is (Litestar's lax conversion takes
it for an integer field too), so only a real fraction (`8.5`) is refused where an integer is expected.

A body whose `Content-Type` names another media type (`text/plain`, a form) is refused with 415 before it is
parsed; one without a `Content-Type` is read as JSON (clients that send raw bytes rarely label them).
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request
from litestar.exceptions import ClientException, SerializationException, ValidationException

UNSUPPORTED_MEDIA_TYPE = 415


def media_type_refusal(content_type: str | None) -> str | None:
    """Why a JSON body labelled `content_type` is refused, or None: no label, `application/json`, or a `+json`
    type (`application/merge-patch+json`)."""
    if content_type is None:
        return None
    media = content_type.split(";", 1)[0].strip().lower()
    if media in ("", "application/json") or media.endswith("+json"):
        return None
    return f"this route takes a JSON body (Content-Type: application/json), not {media}"


def json_body_model(handler: Any) -> type[msgspec.Struct] | None:
    """The route handler's JSON body model (its `data`, a msgspec Struct), or None: what this module checks, and
    what the OpenAPI document describes (ninfer.serve.openapi)."""
    data = handler.parsed_fn_signature.parameters.get("data")
    annotation = data.annotation if data is not None else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct) else None


async def refuse_wrong_types(request: Request) -> None:
    """`before_request` hook: a 415 for a body labelled as something else than JSON, and a ValidationException (the
    same 400 as any other body error) for a body that only a lax conversion would accept."""
    model = json_body_model(request.route_handler)
    if model is None:
        return
    refused = media_type_refusal(request.headers.get("content-type"))
    if refused is not None:
        raise ClientException(status_code=UNSUPPORTED_MEDIA_TYPE, detail=refused)
    try:
        body = await request.json()
    except SerializationException:
        return  # malformed JSON: the body's own parsing answers it
    try:
        msgspec.convert(whole_floats_as_ints(body), model, strict=True, str_keys=True)
    except msgspec.ValidationError as exc:
        raise ValidationException(detail=str(exc), extra=[{"message": str(exc), "key": _field(str(exc))}]) from None


# Whole floats up to 2**53 are exact integers; a larger one (1e300) stays a float (no JSON integer field holds it).
_EXACT_FLOAT_INTS = 2**53


def whole_floats_as_ints(value: Any) -> Any:
    """The decoded JSON `value` with every whole-number float (`8.0`, not `8.5`) made an int, at any depth: it passes
    the strict check where an integer is expected, and still passes where a float is (msgspec takes an int there)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT_FLOAT_INTS:
        return int(value)
    if isinstance(value, list):
        return [whole_floats_as_ints(item) for item in value]
    if isinstance(value, dict):
        return {key: whole_floats_as_ints(item) for key, item in value.items()}
    return value


def _field(message: str) -> str | None:
    """The path msgspec names (`... - at `$.messages[0].role``) without its `$.` root."""
    _, at, path = message.rpartition(" - at `$")
    return path.rstrip("`").lstrip(".") or None if at else None
