"""The OpenAPI document (`/docs/openapi.json`), finished so that it describes the server as it answers.

Litestar derives the paths, parameters and success responses from the route handlers. Three things it gets wrong
or cannot know are put right here, each from the same source the server itself uses:

- Request bodies: the schema of each body is msgspec's own JSON Schema of the body model, the one the request is
  validated with (Litestar's translation loses bounds of 0, such as `top_k >= 0`).
- Errors: every error status an operation can answer, with the body it really carries: OpenAI's
  `{"error": {...}}`, or Anthropic's `{"type": "error", ...}` on `/v1/messages` routes (ninfer.serve.errors decides
  both). The statuses follow from what stands in front of the handler: 400 for any request (validation), 401 unless
  the route is public (ninfer.serve.auth), 413 and 415 for a JSON body (size, Content-Type), 404 / 429 / 503 for a
  request the model gate pins a model for (unknown model; engine full; model unavailable), 503 for any request
  while the server shuts down (529 on the Anthropic routes), and the handler's own `raises`.
- Streaming: a generation route whose body has `stream` answers either JSON or `text/event-stream`; an event
  stream's schema is that of one event (OpenAPI before 3.2: `schema` describes each event, as its fields).
- Bodies a handler reads itself (`opt["json_object_body"]`: the decision contract, score, rerank, which check their
  fields by hand): a required JSON object, without the fields' schema.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

import msgspec
from litestar import Request
from litestar.exceptions import HTTPException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.plugins import JsonRenderPlugin

from ninfer.serve.errors import ANTHROPIC_PREFIX, AnthropicErrorBody, OpenAIErrorBody
from ninfer.serve.gate import GATE_EXEMPT
from ninfer.serve.sse import EVENT_STREAM
from ninfer.serve.strict_body import json_body_model

REF = "#/components/schemas/{name}"
OVERLOADED = "Overloaded (Anthropic's 529: the server is shutting down)"
# One server-sent event, as readers parse it (ninfer.serve.sse writes `event`, `data` and comments).
SSE_EVENT = {"type": "object", "properties": {"event": {"type": "string"}, "data": {"type": "string"},
                                              "id": {"type": "string"}, "retry": {"type": "integer"}}}
JSON_OBJECT_BODY = "json_object_body"  # route opt: the handler reads a JSON object body itself


def _error_statuses(handler: HTTPRouteHandler, method: str, anthropic: bool) -> set[int]:
    opt = handler.opt or {}
    # validation; the server shutting down (ninfer.serve.shutdown: 529, "overloaded", on the Anthropic routes)
    statuses = {400, 529 if anthropic else 503}
    if not opt.get("public"):
        statuses.add(401)
    if json_body_model(handler) is not None:
        statuses |= {413, 415}
    if method == "POST" and not opt.get(GATE_EXEMPT):
        statuses |= {404, 429, 503}
    statuses.update(opt.get("error_statuses", ()))  # a route's own (e.g. the decision contract's 422)
    for exc in handler.raises or ():
        if isinstance(exc, type) and issubclass(exc, HTTPException):
            statuses.add(exc.status_code)
    return statuses


def _error_body(handler: HTTPRouteHandler, anthropic: bool) -> type:
    """The error body a route answers: its own (`opt["error_body"]`, e.g. TypeSafe's on /v1/systemone), else the
    protocol's."""
    return (handler.opt or {}).get("error_body") or (AnthropicErrorBody if anthropic else OpenAIErrorBody)


def _error_response(status: int, body: type) -> dict[str, Any]:
    name = body.__name__
    return {"description": OVERLOADED if status == 529 else HTTPStatus(status).phrase,
            "content": {"application/json": {"schema": {"$ref": REF.format(name=name)}}}}


def finish(document: dict[str, Any], handlers: dict[tuple[str, str], HTTPRouteHandler]) -> dict[str, Any]:
    """The document with request bodies, error responses and streaming answers as the server has them.
    `handlers`: (METHOD, path as the document spells it) -> its route handler."""
    models = {key: model for key, handler in handlers.items() if (model := json_body_model(handler)) is not None}
    bodies = {OpenAIErrorBody, AnthropicErrorBody} | {b for h in handlers.values() if (b := (h.opt or {}).get("error_body"))}
    _, components = msgspec.json.schema_components([*models.values(), *sorted(bodies, key=lambda b: b.__name__)],
                                                   ref_template=REF)
    document.setdefault("components", {}).setdefault("schemas", {}).update(components)
    for path, item in document.get("paths", {}).items():
        for method, operation in item.items():
            handler = handlers.get((method.upper(), path))
            if handler is None or not isinstance(operation, dict):
                continue
            model = models.get((method.upper(), path))
            if (handler.opt or {}).get(JSON_OBJECT_BODY):
                operation["requestBody"] = {"required": True,
                                            "content": {"application/json": {"schema": {"type": "object"}}}}
            if model is not None:
                operation["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": REF.format(name=model.__name__)}}}}
                if "stream" in model.__struct_fields__:
                    success = operation["responses"][str(handler.status_code)]
                    content = success.setdefault("content", {})
                    content[EVENT_STREAM] = {}
            responses = operation.setdefault("responses", {})
            for answer in responses.values():
                if EVENT_STREAM in (answer.get("content") or {}):
                    answer["content"][EVENT_STREAM] = {"schema": SSE_EVENT}
            anthropic = path.startswith(ANTHROPIC_PREFIX)
            body = _error_body(handler, anthropic)
            for status in _error_statuses(handler, method.upper(), anthropic):
                responses[str(status)] = _error_response(status, body)
    return document


class ServedDocument(JsonRenderPlugin):
    """Serves `finish`ed document at `/docs/openapi.json` (built once, at the first request)."""

    def __init__(self) -> None:
        super().__init__()
        self._rendered: bytes | None = None

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        if self._rendered is None:
            document = json.loads(self.render_json(request, openapi_schema))
            self._rendered = json.dumps(finish(document, route_handlers(request.app))).encode()
        return self._rendered


def route_handlers(app: Any) -> dict[tuple[str, str], HTTPRouteHandler]:
    found: dict[tuple[str, str], HTTPRouteHandler] = {}
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            if not isinstance(handler, HTTPRouteHandler) or not handler.include_in_schema:
                continue
            for method in handler.http_methods:
                found[(method, route.path_format)] = handler
    return found
