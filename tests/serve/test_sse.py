"""The SSE stream's keepalive wrapper (ninfer.serve.sse._with_pings): the frames pass in order and unchanged, a ping
fills each silence of the ping interval (none without one), a NinferError becomes the last frame, any other error is raised, and
closing the stream (a client that left) stops the source where it waits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from ninfer.errors import EngineError
from ninfer.serve.sse import PING_FRAME, _with_pings

FRAMES = [f"data: {i}\n\n".encode() for i in range(50)]


async def _source(frames: list[bytes], pause_s: float = 0.0, error: Exception | None = None,
                  closed: list[str] | None = None) -> AsyncIterator[bytes]:
    try:
        for frame in frames:
            await asyncio.sleep(pause_s)
            yield frame
        if error is not None:
            raise error
        await asyncio.sleep(3600)  # only a source that is closed early gets here
    finally:
        if closed is not None:
            closed.append("closed")


async def _collect(stream: AsyncIterator[bytes], limit: int | None = None) -> list[bytes]:
    out = []
    async for frame in stream:
        out.append(frame)
        if limit is not None and len(out) == limit:
            break
    return out


def test_frames_pass_in_order_without_pings_when_they_come_fast():
    async def run() -> list[bytes]:
        return await _collect(_with_pings(_source(FRAMES, error=EngineError("end")), 30.0, lambda e: b"E"))

    assert asyncio.run(run()) == [*FRAMES, b"E"]


def test_a_silence_gets_pings_and_the_frames_still_come_in_order():
    async def run() -> list[bytes]:
        stream = _with_pings(_source(FRAMES[:3], pause_s=0.35, error=EngineError("end")), 0.1, lambda e: b"E")
        return await _collect(stream)

    out = asyncio.run(run())
    assert [f for f in out if f != PING_FRAME] == [*FRAMES[:3], b"E"]
    # a ping is due 0.1 s into each 0.35 s silence, before the frame (timers fire in deadline order)
    assert out[0] == PING_FRAME and all(out[out.index(f) - 1] == PING_FRAME for f in FRAMES[:3])


def test_no_interval_means_no_pings_in_a_silence():
    async def run() -> list[bytes]:
        return await _collect(_with_pings(_source(FRAMES[:2], pause_s=0.3, error=EngineError("end")), None,
                                          lambda e: b"E"))

    assert asyncio.run(run()) == [*FRAMES[:2], b"E"]


def test_an_engine_error_is_the_last_frame_and_other_errors_are_raised():
    async def run(error: Exception, on_error) -> list[bytes]:
        return await _collect(_with_pings(_source(FRAMES[:2], error=error), 30.0, on_error))

    assert asyncio.run(run(EngineError("boom"), lambda e: f"error: {e}".encode())) == [*FRAMES[:2], b"error: boom"]
    with pytest.raises(EngineError):
        asyncio.run(run(EngineError("boom"), None))
    with pytest.raises(ZeroDivisionError):
        asyncio.run(run(ZeroDivisionError(), lambda e: b"E"))


def test_closing_the_stream_closes_the_source_where_it_waits():
    closed: list[str] = []

    async def run() -> list[bytes]:
        stream = _with_pings(_source(FRAMES[:2], closed=closed), 30.0, None)
        got = await _collect(stream, limit=2)  # the source now waits (for ever) for its next frame
        await stream.aclose()
        return got

    assert asyncio.run(asyncio.wait_for(run(), 30)) == FRAMES[:2]
    assert closed == ["closed"]
