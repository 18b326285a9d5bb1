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
from dataclasses import dataclass
from typing import Any

from litestar.response import Stream
from litestar.response.streaming import ASGIStreamingResponse

from ninfer.errors import NinferError
from ninfer.serve.errors import ServerShuttingDownError
from ninfer.serve.shutdown import CURRENT_DRAIN

PING_INTERVAL_S = 15.0
PING_FRAME = b": ping\n\n"
EVENT_STREAM = "text/event-stream"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_frame(data: Any, event: str | None = None) -> bytes:
    """One SSE frame; `data` is JSON-encoded unless it is already a string (e.g. OpenAI's `[DONE]`)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


_END = object()  # the frames are exhausted


@dataclass(frozen=True)
class _Failed:
    error: Exception  # what the frames raised, to be raised (or answered) by the consumer


async def _with_pings(
    frames: AsyncIterator[bytes], interval_s: float | None, on_error: Callable[[NinferError], bytes] | None,
    final_frame: bytes | None = None,
) -> AsyncIterator[bytes]:
    """`frames`, with PING_FRAME after each `interval_s` of silence.

    One task runs the frames into a one-place queue and one sleeps until the next ping is due, so a frame costs a
    queue hand-over: racing each frame against a timeout (a task and an asyncio.wait per frame) cost ~50 us of CPU a
    frame, about a tenth of the server's whole cost per streamed token. The one place keeps the backpressure of a
    plain iteration: the frames advance only as fast as the client takes them."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1)
    last_sent = loop.time()

    async def produce() -> None:
        try:
            async for frame in frames:
                await queue.put(frame)
        except Exception as exc:  # noqa: BLE001 - handed over: the consumer raises it, or answers a NinferError
            await queue.put(_Failed(exc))
            return
        await queue.put(_END)

    async def keep_alive() -> None:
        if interval_s is None:  # no keepalives
            return
        while True:
            due = last_sent + interval_s - loop.time()
            if due > 0:
                await asyncio.sleep(due)
            elif queue.empty():  # silent for interval_s: a frame is neither waiting nor sent
                await queue.put(PING_FRAME)
            else:
                await asyncio.sleep(interval_s)

    async def end_at_shutdown() -> None:
        # The server's grace is over (ninfer.serve.shutdown): the stream ends with its protocol's error.
        drain = CURRENT_DRAIN.get()
        if drain is not None:
            await drain.ending.wait()
            await queue.put(_Failed(ServerShuttingDownError("the server shut down before this answer was complete")))

    producer = asyncio.ensure_future(produce())
    pinger = asyncio.ensure_future(keep_alive())
    ender = asyncio.ensure_future(end_at_shutdown())
    try:
        while True:
            item = await queue.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                if on_error is None or not isinstance(item.error, NinferError):
                    raise item.error
                yield on_error(item.error)
                if final_frame is not None:
                    yield final_frame
                return
            yield item
            last_sent = loop.time()
    finally:
        for task in (ender, pinger, producer):  # the frames generator is suspended inside the producer: cancel it there
            task.cancel()
        await asyncio.gather(ender, pinger, producer, return_exceptions=True)
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
    final_frame: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> SSEStream:
    """`final_frame`: what the protocol sends after an error frame to end a stream (OpenAI's `[DONE]`)."""
    return SSEStream(
        _with_pings(frames, ping_interval_s, on_error, final_frame),
        media_type=EVENT_STREAM,
        headers={**SSE_HEADERS, **(headers or {})},
    )
