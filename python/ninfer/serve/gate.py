"""How an HTTP request reaches its model: `ModelGate` (ASGI middleware) pins the model a POST body names for as long
as the response is being sent, and hands the route the pin as its `lease` dependency.

    @post("/v1/...")
    async def handler(data: JSONBody[Body], lease: LeaseDependency) -> Any:
        served = lease.served          # the loaded model the body names (ninfer.serve.state.ServedModel)
        call = lease.call              # the HTTP call it runs for (ninfer.serve.calls): /slots, control

Routes that need no engine (management, streams, tools) are marked `opt=EXEMPT` (GATE_EXEMPT) and are not gated.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import msgspec
from litestar import Request
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide

from ninfer.serve.asgi_headers import scope_header
from ninfer.serve.auth import refusal
from ninfer.serve.router import Lease, ModelRouter
from ninfer.serve.strict_body import json_body_model, media_type_refusal

GATE_EXEMPT = "router_gate_exempt"  # route opt: this POST route needs no engine (management, streams, tools)
EXEMPT = {GATE_EXEMPT: True}
LEASE_KEY = "ninfer_lease"  # where the gate leaves the lease in the request's scope state


def lease_of(scope: Any) -> Lease | None:
    """The lease the gate took for this request (None for a request it did not gate)."""
    return (scope.get("state") or {}).get(LEASE_KEY)


def _router(state: State) -> ModelRouter:
    return state.router


def _lease(request: Request) -> Lease:
    lease = lease_of(request.scope)
    if lease is None:
        raise RuntimeError(f"{request.url.path} asks for a lease, but ModelGate did not gate it (a GET, or EXEMPT)")
    return lease


DEPENDENCIES = {"router": Provide(_router, sync_to_thread=False), "lease": Provide(_lease, sync_to_thread=False)}
# How a route handler asks for them: a parameter named `router` / `lease` of this type (Litestar matches named
# dependencies by the parameter's name; Litestar 3 requires the explicit marker).
RouterDependency: TypeAlias = NamedDependency[ModelRouter]
LeaseDependency: TypeAlias = NamedDependency[Lease]


class _ModelField(msgspec.Struct):
    model: Any = None


def _body_model(body: bytes) -> str | None:
    """The body's `model`, decoded without building the rest (a long conversation costs a scan, not a copy)."""
    try:
        model = msgspec.json.decode(body, type=_ModelField).model if body else None
    except (msgspec.DecodeError, RecursionError):
        return None  # the handler answers malformed (or too deeply nested, or non-object) JSON with a 400
    return model if isinstance(model, str) else None


class ModelGate:
    """ASGI middleware: every POST route not marked GATE_EXEMPT is a model request. It reads the body's `model`,
    acquires it from the router (loading or swapping, waiting with a bound), leaves the lease in the scope state for
    the route's `lease` dependency, and holds the pin until the response, streamed or not, has been sent.

    What the route would refuse before looking at the model passes through ungated, so that it never loads or swaps
    one: a request without a valid API key (the guard answers 401), a body labelled as something else than JSON
    (ninfer.serve.strict_body answers 415), and a body over `max_body_bytes` (Litestar answers 413 while reading
    the rest)."""

    def __init__(self, app: Any, *, max_body_bytes: int) -> None:
        self._app = app
        self._max_body_bytes = max_body_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        handler = scope.get("route_handler")
        if (scope["type"] != "http" or scope.get("method") != "POST" or handler is None
                or (handler.opt or {}).get(GATE_EXEMPT) or refusal(ASGIConnection(scope), handler.opt)
                or json_body_model(handler) is not None and media_type_refusal(scope_header(scope, b"content-type"))):
            await self._app(scope, receive, send)
            return
        router = scope["app"].state.router
        chunks, size, more = [], 0, True
        while more and size <= self._max_body_bytes:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": more}
            return await receive()

        if size > self._max_body_bytes:
            await self._app(scope, replay, send)
            return

        entry = router.lookup(_body_model(body))
        call = router.new_call(entry.name, scope.get("path", ""), scope_header(scope, b"x-conversation-id"))
        lease = await router.acquire(entry.name, call=call)
        scope.setdefault("state", {})[LEASE_KEY] = lease
        try:
            await self._app(scope, replay, send)
        finally:
            await lease.release()
