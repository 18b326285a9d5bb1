"""Graceful shutdown: SIGTERM stops admission, lets running requests finish within a grace, then ends each
remaining stream with its protocol's error event and final frame.

    drain = Drain()                      # app.state.drain (ninfer.serve.app)
    ShutdownGate(app, drain)             # ASGI middleware: counts requests; while draining, refuses new ones
    await drain.run(grace_s)             # what the CLI's SIGTERM handler runs before telling uvicorn to exit

While draining, a new request is answered 503 (529 on Anthropic routes, its "overloaded") with `Retry-After`, in the
protocol's error shape; `/health` answers too (503), so a load balancer stops sending. When the grace runs out,
`Drain.ending` is set: every stream still running (ninfer.serve.sse watches it) sends ServerShuttingDownError as its
protocol's error frame, then its final frame (OpenAI's `[DONE]`), and closes, which cancels its engine request.
Uvicorn's own shutdown (closing the listeners, then waiting for connections) would instead cut streams mid-frame.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from typing import Any

from ninfer.serve.errors import ANTHROPIC_PREFIX, ServerShuttingDownError, body_for_path, describe

DEFAULT_GRACE_S = 30.0  # a typical answer at CPU speeds; `ninfer-serve --shutdown-grace`
END_WAIT_S = 5.0  # after the grace: how long ended streams get to send their last frames
RETRY_AFTER_S = 5


class Drain:
    def __init__(self) -> None:
        self.draining = False
        self.ending = asyncio.Event()  # set when the grace is over: streams end now
        self.active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.active += 1
        self._idle.clear()

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._idle.set()

    async def run(self, grace_s: float) -> None:
        """Stops admission, waits up to `grace_s` for running requests, then ends the rest (up to END_WAIT_S)."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
            return
        except TimeoutError:
            pass
        self.ending.set()
        try:
            await asyncio.wait_for(self._idle.wait(), END_WAIT_S)
        except TimeoutError:
            pass


CURRENT_DRAIN: contextvars.ContextVar[Drain | None] = contextvars.ContextVar("ninfer_drain", default=None)


def refusal_status(path: str) -> int:
    return 529 if path.startswith(ANTHROPIC_PREFIX) else 503


class ShutdownGate:
    """ASGI middleware (outermost but for the request counter): see the module doc."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        drain: Drain | None = getattr(scope["app"].state, "drain", None) if scope["type"] == "http" else None
        if drain is None:
            await self._app(scope, receive, send)
            return
        if drain.draining:
            await _refuse(scope, send)
            return
        drain.enter()
        token = CURRENT_DRAIN.set(drain)
        try:
            await self._app(scope, receive, send)
        finally:
            CURRENT_DRAIN.reset(token)
            drain.leave()


async def _refuse(scope: Any, send: Any) -> None:
    path = scope.get("path", "")
    info = describe(ServerShuttingDownError("the server is shutting down; retry on another instance or later"))
    body = json.dumps(body_for_path(path, info)).encode()
    await send({"type": "http.response.start", "status": refusal_status(path),
                "headers": [(b"content-type", b"application/json"), (b"retry-after", str(RETRY_AFTER_S).encode()),
                            (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
