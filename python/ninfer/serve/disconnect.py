"""Non-streaming answers that stop when their client goes away.

Litestar does not cancel a handler whose client disconnected before the response started, so a long non-streaming
generation would hold its lane to the end. `run_while_connected(request, work)` races the work that consumes a
generation (`Generation.run()`, or a route's own loop over its deltas) against the ASGI `http.disconnect` message
and cancels it when the client leaves first: the cancellation reaches the generation's deltas, whose cleanup
cancels the engine request and frees the lane. The handler then ends with 499 ("client closed request"), which
nobody receives. (Streamed answers need nothing of this: Litestar's stream listens for the disconnect itself, and
ninfer.serve.sse closes the generation when it fires.)

Both paths learn of a disconnect from the ASGI `http.disconnect` message, which uvicorn delivers as soon as the
connection is lost: nothing waits for a poll or for the next token. The engine then frees the lane at its next step
boundary. `DisconnectClock` (ASGI middleware) notes when each request's disconnect was seen (`departure()`), so
the pipeline can report how long a departed client's lane took to come free (ninfer.serve.generation).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from litestar import Request
from litestar.exceptions import HTTPException

T = TypeVar("T")

CLIENT_CLOSED_REQUEST = 499


@dataclass
class Departure:
    at: float | None = None  # time.perf_counter() when the server saw the client's http.disconnect


_DEPARTURE: ContextVar[Departure | None] = ContextVar("ninfer_departure", default=None)


def departure() -> Departure | None:
    """The current HTTP request's Departure (None outside one)."""
    return _DEPARTURE.get()


class DisconnectClock:
    """ASGI middleware: stamps the request's Departure when its `receive` first yields `http.disconnect`."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        seen = Departure()

        async def clocked_receive() -> Any:
            message = await receive()
            if message["type"] == "http.disconnect" and seen.at is None:
                seen.at = time.perf_counter()
            return message

        token = _DEPARTURE.set(seen)
        try:
            await self._app(scope, clocked_receive, send)
        finally:
            _DEPARTURE.reset(token)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def run_while_connected(request: Request, work: Awaitable[T]) -> T:
    run = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({run, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (watch, run):
            if not task.done():
                task.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        if run.cancelled() or not run.done():
            await asyncio.gather(run, return_exceptions=True)
    if run.cancelled():
        raise HTTPException(status_code=CLIENT_CLOSED_REQUEST, detail="the client closed the request")
    return run.result()
