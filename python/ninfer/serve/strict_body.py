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

Decoding and converting a body takes time in proportion to its values: 10 MB of small ones (300,000 short chat
messages, a schema of 150,000 properties) take the CPU for seconds, which on the event loop would delay every other
client's `/health` and stream. So a body over OFF_LOOP_BODY_BYTES is decoded, checked and converted in a worker
thread; a smaller one inline, where the thread hop would cost more than it saves. A worker thread still holds the
GIL for the whole of each C call it makes, so a long body is decoded a piece at a time (decode_json_in_pieces): one
decode of 10 MB holds it for ~1 s on a loaded machine, its pieces ~1 ms each. Both run `validated_body`, the one
validation path, and the app's `BodyRequest` hands its result to the route as its `data` (Litestar takes an
instance of the model as it is), so the body is decoded once and the route, its models and the OpenAPI document are
the same as without it.
"""

from __future__ import annotations

import asyncio
import codecs
from typing import Any

import msgspec
from litestar import Request
from litestar.exceptions import ClientException, ValidationException

UNSUPPORTED_MEDIA_TYPE = 415
# Bodies longer than this are decoded and validated in a worker thread. Below it the work is short (at most ~1.2 ms
# for 64 KiB of the smallest values, chat messages of two characters, on one core; ~35 us per KiB) while the thread
# hop costs ~60 us and most requests are a few KiB; above it the time on the loop would grow with the body.
OFF_LOOP_BODY_BYTES = 64 * 2**10
# JSON text longer than this is decoded a piece at a time: one C call over 64 KiB of small values takes ~1 ms.
DECODE_PIECE_BYTES = 64 * 2**10
BODY_KEY = "ninfer_body"  # where BodyRequest keeps the validated body in the request's scope state


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
    """`before_request` hook: a 415 for a body labelled as something else than JSON, then the body's validation
    (BodyRequest.json): a refused body is answered before the route's dependencies (its model's lease) are
    resolved."""
    model = json_body_model(request.route_handler)
    if model is None:
        return
    refused = media_type_refusal(request.headers.get("content-type"))
    if refused is not None:
        raise ClientException(status_code=UNSUPPORTED_MEDIA_TYPE, detail=refused)
    await request.json()


def validated_body(body: bytes, model: type[msgspec.Struct]) -> msgspec.Struct:
    """The route's `model` of a JSON `body`, or the error Litestar would answer: malformed JSON is a 400
    (ClientException, Litestar's message), a wrong type or value a ValidationException naming the field.

    The strict conversion only checks (a lax one would take `"8"` for 8); the model is then built by Litestar's own
    lax conversion of the value as decoded, so a whole float inside a free-form field (a tool schema's `1.0`) stays
    the float the client sent."""
    try:
        value = decode_json_in_pieces(body or b"null")
    except msgspec.DecodeError as exc:
        raise ClientException(str(exc)) from None  # Litestar's answer (its SerializationException's message)
    try:
        msgspec.convert(whole_floats_as_ints(value), model, strict=True, str_keys=True)
        return msgspec.convert(value, model, strict=False, str_keys=True)
    except msgspec.ValidationError as exc:
        raise ValidationException(detail=str(exc), extra=[{"message": str(exc), "key": _field(str(exc))}]) from None


_ANY = msgspec.json.Decoder()
_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])
_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_JSON_WHITESPACE = b" \t\n\r"


def decode_json_in_pieces(body: bytes, piece_bytes: int = DECODE_PIECE_BYTES) -> Any:
    """`msgspec.json.decode(body)`, the same value or the same error, decoded so that no one C call reads more than
    ~`piece_bytes` of it: an array or object longer than that is first split into its items' raw JSON (a scan that
    builds none of them), each decoded the same way. A body the pieces do not decode (malformed, nested too deeply
    for the recursion) is decoded whole, which raises its error as a whole decode words it."""
    try:
        _check_utf8(body)
        return _decode_piece(body.lstrip(_JSON_WHITESPACE), piece_bytes)
    except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError):
        return _ANY.decode(body)


def _check_utf8(body: bytes) -> None:
    """UnicodeDecodeError unless `body` is UTF-8, checked DECODE_PIECE_BYTES at a time. The pieces alone would miss
    a bad byte inside an object member that a later duplicate key replaces (the scan that splits an object keeps the
    last value of a key and never decodes the others), which the whole decode refuses."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    for at in range(0, len(body), DECODE_PIECE_BYTES):
        decoder.decode(body[at:at + DECODE_PIECE_BYTES])
    decoder.decode(b"", final=True)


def _decode_piece(raw: bytes | msgspec.Raw, piece_bytes: int) -> Any:
    if len(raw) <= piece_bytes:
        return _ANY.decode(raw)
    head = memoryview(raw)[:1].tobytes()  # a Raw starts at its value's first byte
    if head == b"[":
        return [_decode_piece(item, piece_bytes) for item in _ITEMS.decode(raw)]
    if head == b"{":
        return {key: _decode_piece(item, piece_bytes) for key, item in _MEMBERS.decode(raw).items()}
    return _ANY.decode(raw)  # one long string or number


class BodyRequest(Request):
    """The app's request class: for a route whose body is a model (json_body_model), `json()` is that model,
    validated once (validated_body), in a worker thread when the body is over OFF_LOOP_BODY_BYTES. Litestar's body
    extractor calls it for the route's `data`."""

    async def json(self) -> Any:
        model = json_body_model(self.route_handler)
        if model is None:
            return await super().json()
        state = self.scope.setdefault("state", {})
        if BODY_KEY not in state:
            body = await self.body()
            state[BODY_KEY] = (await asyncio.to_thread(validated_body, body, model) if len(body) > OFF_LOOP_BODY_BYTES
                               else validated_body(body, model))
        return state[BODY_KEY]


# Whole floats up to 2**53 are exact integers; a larger one (1e300) stays a float (no JSON integer field holds it).
_EXACT_FLOAT_INTS = 2**53


def whole_floats_as_ints(value: Any) -> Any:
    """The decoded JSON `value` with every whole-number float (`8.0`, not `8.5`) made an int, at any depth: it passes
    the strict check where an integer is expected, and still passes where a float is (msgspec takes an int there).

    A list or object without a whole float is returned itself, not copied: a body of a million small values (read
    in a worker thread) would otherwise allocate a million more objects, and each garbage collection they bring on
    holds the GIL, which the event loop needs."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT_FLOAT_INTS:
        return int(value)
    if isinstance(value, list):
        items = [whole_floats_as_ints(item) for item in value]
        return value if all(new is old for new, old in zip(items, value)) else items
    if isinstance(value, dict):
        members = {key: whole_floats_as_ints(item) for key, item in value.items()}
        return value if all(members[key] is item for key, item in value.items()) else members
    return value


def _field(message: str) -> str | None:
    """The path msgspec names (`... - at `$.messages[0].role``) without its `$.` root."""
    _, at, path = message.rpartition(" - at `$")
    return path.rstrip("`").lstrip(".") or None if at else None
