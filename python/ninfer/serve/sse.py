"""Server-sent events for the generation routes.

`sse_response(frames)` streams an async iterator of ready-made frames (`sse_frame(data, event=...)`), adding a
keepalive comment when nothing was sent for `ping_interval_s` (None: never; Litestar 2.x has no pings of its own),
and turning a NinferError raised mid-stream into one final error frame (`on_error`), since the status line is already
sent.

Disconnects: Litestar 2.x cancels the sending task when the client goes away, but does not close the iterator, which
then sits at a `yield` until garbage collection, holding its engine lane. `_ClosingStreamingResponse` closes it in
a `finally`, so the generation pipeline's cleanup (which cancels the engine request) runs at once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar.response import Stream
from litestar.response.streaming import ASGIStreamingResponse

from ninfer.errors import NinferError

PING_INTERVAL_S = 15.0
PING_FRAME = b": ping\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_frame(data: Any, event: str | None = None) -> bytes:
    """One SSE frame; `data` is JSON-encoded unless it is already a string (e.g. OpenAI's `[DONE]`)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


async def _with_pings(
    frames: AsyncIterator[bytes], interval_s: float | None, on_error: Callable[[NinferError], bytes] | None
) -> AsyncIterator[bytes]:
    pending: asyncio.Task[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(frames))
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield PING_FRAME
                continue
            task, pending = pending, None
            try:
                frame = task.result()
            except StopAsyncIteration:
                return
            except NinferError as exc:
                if on_error is None:
                    raise
                yield on_error(exc)
                return
            yield frame
    finally:
        if pending is not None:  # the frames generator is suspended inside this task: cancel it there
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        await frames.aclose()


class _ClosingStreamingResponse(ASGIStreamingResponse):
    __slots__ = ()

    async def send_body(self, send: Any, receive: Any) -> None:
        try:
            await super().send_body(send, receive)
        finally:
            await self.iterator.aclose()


class SSEStream(Stream):
    """A Stream whose ASGI response closes its iterator when the client disconnects."""

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> ASGIStreamingResponse:
        # Litestar prefers the route's media type (JSON by default) to the response's own: an event stream must say
        # text/event-stream whatever route returns it (EventSource clients refuse anything else).
        kwargs["media_type"] = self.media_type
        response = super().to_asgi_response(*args, **kwargs)
        # Same slots, one method added: swapping the class keeps every header/cookie rule of Stream's factory.
        response.__class__ = _ClosingStreamingResponse
        return response


def sse_response(
    frames: AsyncIterator[bytes],
    *,
    ping_interval_s: float | None = PING_INTERVAL_S,
    on_error: Callable[[NinferError], bytes] | None = None,
    headers: dict[str, str] | None = None,
) -> SSEStream:
    return SSEStream(
        _with_pings(frames, ping_interval_s, on_error),
        media_type="text/event-stream",
        headers={**SSE_HEADERS, **(headers or {})},
    )
