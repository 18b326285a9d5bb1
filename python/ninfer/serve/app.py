"""The Litestar app: protocol modules mounted over one ModelRouter, with auth, error mapping and metrics.

    app = create_app(open_router, api_keys=frozenset(), protocols=PROTOCOL_MODULES)

`open_router` is called once in the lifespan (in the worker's event loop) and returns the ModelRouter; the lifespan
closes it at shutdown. Each protocol module exports `route_handlers`; the ones listed in PROTOCOL_MODULES that are
importable are mounted (a module another engineer has not landed yet is simply absent). Everything shared is wired
here, once: the `router` and `lease` dependencies (ninfer.serve.gate), the API-key guard (ninfer.serve.auth), the exception
handler that maps every error to the protocol's body (ninfer.serve.errors), the body validation
(ninfer.serve.strict_body: its request class and hook), and the request counter for /metrics.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar, Request, Response, route
from litestar.datastructures import State
from litestar.enums import HttpMethod
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.static_files import create_static_files_router

from ninfer.serve.auth import api_key_guard
from ninfer.serve.disconnect import DisconnectClock
from ninfer.serve.errors import EXCEPTION_HANDLERS
from ninfer.serve.gate import DEPENDENCIES, ModelGate
from ninfer.serve.metrics import RequestCounter
from ninfer.serve.openapi import ServedDocument
from ninfer.serve.router import ModelRouter
from ninfer.serve.shutdown import Drain, ShutdownGate
from ninfer.serve.static_paths import check_static_path
from ninfer.serve.streams import StreamRecorder, StreamRegistry
from ninfer.serve.strict_body import BodyRequest, refuse_wrong_types
from ninfer.serve.tools_registry import ToolRegistry

PROTOCOL_MODULES = (
    "ninfer.serve.misc",
    "ninfer.serve.openai_chat",
    "ninfer.serve.openai_completions",
    "ninfer.serve.responses",
    "ninfer.serve.anthropic",
    # the router's management surface, resumable streams, server tools and the dashboard (issue 7)
    "ninfer.serve.llamacpp",
    "ninfer.serve.streams",
    "ninfer.serve.tools_registry",
    "ninfer.serve.dashboard",
    # decision scoring, per-token scoring and rerank (issue 16)
    "ninfer.serve.decisions",
    "ninfer.serve.scoring",
)

# Generation bodies can be long conversations with file contents; Litestar's default limit is 10 MB.
MAX_BODY_BYTES = 64 * 2**20


def _route_handlers(modules: Sequence[str]) -> list[Any]:
    handlers: list[Any] = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the module exists but something it imports is missing: a real error
                raise
            continue
        handlers.extend(module.route_handlers)
    return handlers


def _allowed_methods(request: Request) -> Response:
    template = request.scope.get("path_template")
    methods = {m for r in request.app.routes if r.path_format == template for m in getattr(r, "methods", ())}
    return Response(None, status_code=204, headers={"Allow": ", ".join(sorted(methods))}, media_type="text/plain")


def _options_handler(handlers: Sequence[Any]) -> Any:
    """One OPTIONS handler for every path served by more than one handler (a GET and a DELETE): Litestar's own
    answers with the methods of the first handler registered at the path only."""
    counts: dict[str, int] = {}
    for handler in handlers:
        for path in getattr(handler, "paths", ()):
            counts[path] = counts.get(path, 0) + 1
    shared = sorted(path for path, n in counts.items() if n > 1)
    if not shared:
        return None
    return route(shared, http_method=[HttpMethod.OPTIONS], include_in_schema=False,
                 sync_to_thread=False)(_allowed_methods)


def _metrics_of(scope: Any) -> Any:
    router = getattr(scope["app"].state, "router", None)
    return router.metrics if router is not None else None


def create_app(open_router: Callable[[], Awaitable[ModelRouter]], *, api_keys: frozenset[str] = frozenset(),
               protocols: Sequence[str] = PROTOCOL_MODULES, webui_dir: str | None = None,
               debug: bool = False) -> Litestar:
    handlers = _route_handlers(protocols)
    options = _options_handler(handlers)
    if options is not None:
        handlers.insert(0, options)  # first: Litestar then makes no OPTIONS handler of its own at those paths
    if webui_dir is not None:  # a UI bundle at /, public like any web page (its API calls carry the key)
        handlers.append(create_static_files_router(path="/", directories=[webui_dir], html_mode=True,
                                                   opt={"public": True}, include_in_schema=False,
                                                   before_request=check_static_path))

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        app.state.router = await open_router()
        app.state.streams, app.state.tools = StreamRegistry(), ToolRegistry()
        app.state.drain = Drain()  # SIGTERM's graceful shutdown (ninfer.serve.shutdown; the CLI runs it)
        await app.state.router.start()  # the TTL ticker
        try:
            yield
        finally:
            app.state.router.close()

    return Litestar(
        route_handlers=handlers,
        dependencies=DEPENDENCIES,
        guards=[api_key_guard],
        exception_handlers=EXCEPTION_HANDLERS,
        before_request=refuse_wrong_types,
        request_class=BodyRequest,  # a route's body model is decoded and validated once, off the loop when large
        # ModelGate pins (loading or swapping to) the model a POST names; StreamRecorder records chat streams;
        # DisconnectClock notes when the app sees a client's disconnect (innermost: a recorded stream, which goes on
        # without its client, does not see it).
        middleware=[lambda app: RequestCounter(app, _metrics_of), ShutdownGate,
                    lambda app: ModelGate(app, max_body_bytes=MAX_BODY_BYTES), StreamRecorder, DisconnectClock],
        lifespan=[lifespan],
        state=State({"api_keys": api_keys}),
        request_max_body_size=MAX_BODY_BYTES,
        openapi_config=OpenAPIConfig(title="ninfer", version="1", path="/docs",
                                     render_plugins=[SwaggerRenderPlugin(), ServedDocument()]),
        debug=debug,
    )
