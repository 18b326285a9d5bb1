"""Wrong JSON types are refused, not coerced.

Litestar converts a decoded body into its route's model with msgspec in lax mode (`strict=False`), so `"8"` becomes
8 and `"true"` becomes True. The protocols' own servers refuse such bodies, and clients that send them have a bug
worth hearing about, so every route with a JSON body model first converts the body strictly (msgspec still takes an
integer for a float) and answers a 400 naming the field when that fails.
"""

from __future__ import annotations

import msgspec
from litestar import Request
from litestar.exceptions import SerializationException, ValidationException


async def refuse_wrong_types(request: Request) -> None:
    """`before_request` hook: a ValidationException (the same 400 as any other body error) for a body that only a
    lax conversion would accept."""
    data = request.route_handler.parsed_fn_signature.parameters.get("data")
    if data is None or not isinstance(data.annotation, type) or not issubclass(data.annotation, msgspec.Struct):
        return
    try:
        body = await request.json()
    except SerializationException:
        return  # malformed JSON: the body's own parsing answers it
    try:
        msgspec.convert(body, data.annotation, strict=True, str_keys=True)
    except msgspec.ValidationError as exc:
        raise ValidationException(detail=str(exc), extra=[{"message": str(exc), "key": _field(str(exc))}]) from None


def _field(message: str) -> str | None:
    """The path msgspec names (`... - at `$.messages[0].role``) without its `$.` root."""
    _, at, path = message.rpartition(" - at `$")
    return path.rstrip("`").lstrip(".") or None if at else None
