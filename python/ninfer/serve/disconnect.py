"""Non-streaming answers that stop when their client goes away.

Litestar does not cancel a handler whose client disconnected before the response started, so a long non-streaming
generation would hold its lane to the end. `run_while_connected(request, work)` races the work that consumes a
generation (`Generation.run()`, or a route's own loop over its deltas) against the ASGI `http.disconnect` message
and cancels it when the client leaves first: the cancellation reaches the generation's deltas, whose cleanup
cancels the engine request and frees the lane. The handler then ends with 499 ("client closed request"), which
nobody receives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from litestar import Request
from litestar.exceptions import HTTPException

T = TypeVar("T")

CLIENT_CLOSED_REQUEST = 499


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
