"""Resumable conversation streams (llama.cpp's `X-Conversation-Id` protocol, as llama-ui speaks it).

Every streamed chat request that carries `X-Conversation-Id` (llama-ui sends `<conv>` or `<conv>::<model>`) is
recorded byte for byte under that id by `StreamRecorder`, an ASGI middleware. Such a request is detached
from its client: when the client goes away (a page reload) the generation keeps running and keeps recording, so a
reader that comes back loses nothing:

    POST   /v1/streams/lookup {conversation_ids: [...]} -> [{conversation_id, is_done, total_bytes, started_at, ...}]
    GET    /v1/stream?conv_id=<id>&from=<byte offset>   -> the recorded bytes from the offset, then the live tail
    DELETE /v1/stream?conv_id=<id>                      -> forget it (a running generation is cancelled)
    POST   /v1/chat/completions/control {id, action}        -> cancel (`stop`) exactly the addressed generation, or
                                                                end its reasoning (`reasoning_end`: requests sent
                                                                with reasoning_control, ninfer.serve.reasoning_control)

One conversation, several clients (two tabs on one conversation send the same X-Conversation-Id): a new request on
a conversation whose recorded generation is still running cancels that generation, which ends for its own client
with `finish_reason: "cancelled"`; the new one gets the recording. So the key names one generation at a time, and
replay, DELETE and control by conversation id address the latest (control by completion id addresses its own).

Memory is bounded: at most MAX_STREAMS streams and MAX_TOTAL_BYTES bytes; the oldest finished streams are evicted
first, then the oldest running ones (whose readers then get what is left). A stream larger than MAX_STREAM_BYTES stops
recording: the client that made the request still gets everything, but a replay reader's stream ends where the
recording stopped (with no `[DONE]`). No generation runs on with neither a recording nor its client: one whose
client has left is cancelled when its recording is evicted or stops, and one whose recording is gone is cancelled
when its client leaves.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args

import msgspec
from litestar import Request, delete, get, post
from litestar.exceptions import NotFoundException
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from ninfer.serve.asgi_headers import scope_header
from ninfer.serve.calls import Call
from ninfer.serve.errors import Conflict, InvalidRequestError
from ninfer.serve.gate import EXEMPT, RouterDependency, lease_of
from ninfer.serve.sse import EVENT_STREAM, sse_response

MAX_STREAMS = 64
MAX_TOTAL_BYTES = 64 * 2**20
MAX_STREAM_BYTES = 16 * 2**20
RECORDED_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
StopAction = Literal["stop", "cancel"]
EndReasoningAction = Literal["reasoning_end", "end_reasoning"]  # llama-ui sends the first
ControlAction = Literal[StopAction, EndReasoningAction]  # the body model's (and so the document's) enum
STOP_ACTIONS = get_args(StopAction)


@dataclass(eq=False)
class RecordedStream:
    key: str  # the X-Conversation-Id value: "<conversation>" or "<conversation>::<model>"
    model: str
    created: float = field(default_factory=time.time)
    completed: float = 0.0
    data: bytearray = field(default_factory=bytearray)
    done: bool = False
    truncated: bool = False
    call: Call | None = None
    client_gone: bool = False  # the client that made the request has left: the recording is all that is left
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def summary(self) -> dict[str, Any]:
        """llama-ui's ApiStreamSession."""
        return {"conversation_id": self.key, "is_done": self.done, "total_bytes": len(self.data),
                "started_at": int(self.created * 1000), "completed_at": int(self.completed * 1000),
                "model": self.model}

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def append(self, chunk: bytes, limit: int) -> int:
        """Records a chunk; returns how many bytes were kept."""
        if self.truncated or not chunk:
            return 0
        if len(self.data) + len(chunk) > limit:
            self.truncated = True
            self._wake()
            return 0
        self.data += chunk
        self._wake()
        return len(chunk)

    def finish(self) -> None:
        self.done = True
        self.completed = time.time()
        self._wake()

    async def read_from(self, offset: int) -> AsyncIterator[bytes]:
        """The bytes from `offset`, then each new chunk as it is recorded, until the stream ends."""
        while True:
            changed = self.changed
            if offset < len(self.data):
                chunk = bytes(self.data[offset:])
                offset += len(chunk)
                yield chunk
                continue
            if self.done or self.truncated:
                return
            await changed.wait()


class StreamRegistry:
    def __init__(self, max_streams: int = MAX_STREAMS, max_total_bytes: int = MAX_TOTAL_BYTES,
                 max_stream_bytes: int = MAX_STREAM_BYTES) -> None:
        self.max_streams = max_streams
        self.max_total_bytes = max_total_bytes
        self.max_stream_bytes = max_stream_bytes
        self._streams: OrderedDict[str, RecordedStream] = OrderedDict()
        self._bytes = 0

    @property
    def total_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._streams)

    def open(self, key: str, model: str, call: Call | None) -> RecordedStream:
        """A fresh recording under this X-Conversation-Id. An earlier one under the same key is replaced, and its
        generation cancelled if it still runs (the module doc: one generation per conversation)."""
        earlier = self.remove(key)
        if earlier is not None and not earlier.done and earlier.call is not None:
            earlier.call.cancel()
        stream = RecordedStream(key, model, call=call)
        self._streams[key] = stream
        self._evict()
        return stream

    def append(self, stream: RecordedStream, chunk: bytes) -> None:
        if self._streams.get(stream.key) is not stream:
            return  # evicted or deleted while running
        self._bytes += stream.append(chunk, self.max_stream_bytes)
        if stream.truncated:
            cancel_if_orphaned(stream)
        self._evict()

    def holds(self, stream: RecordedStream) -> bool:
        """Whether the stream is still recorded (not evicted, deleted, replaced or truncated)."""
        return self._streams.get(stream.key) is stream and not stream.truncated

    def find(self, stream_id: str) -> RecordedStream | None:
        return self._streams.get(stream_id)

    def all(self) -> list[RecordedStream]:
        return list(self._streams.values())

    def lookup(self, conversation_ids: list[str]) -> list[RecordedStream]:
        wanted = set(conversation_ids)
        return [s for s in self._streams.values() if s.key in wanted]

    def remove(self, key: str) -> RecordedStream | None:
        stream = self._streams.pop(key, None)
        if stream is not None:
            self._bytes -= len(stream.data)
            stream.truncated = True  # readers end
            stream._wake()
        return stream

    def _evict(self) -> None:
        while len(self._streams) > self.max_streams or self._bytes > self.max_total_bytes:
            finished = [s for s in self._streams.values() if s.done]
            victim = finished[0] if finished else next(iter(self._streams.values()))
            self.remove(victim.key)
            cancel_if_orphaned(victim)


def cancel_if_orphaned(stream: RecordedStream) -> None:
    """Cancels the stream's generation if it runs with neither its client nor a recording to read it."""
    if stream.client_gone and not stream.done and stream.call is not None:
        stream.call.cancel()


class StreamRecorder:
    """ASGI middleware on the chat routes: records the streams of requests with `X-Conversation-Id`, detached from
    their client.

    It sits inside ModelGate (whose lease names the call): the call it records keeps its model pinned while it
    runs."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        lease = lease_of(scope) if scope["type"] == "http" else None
        conversation = scope_header(scope, b"x-conversation-id")
        if (lease is None or lease.call is None or scope.get("path") not in RECORDED_PATHS
                or conversation is None):
            await self._app(scope, receive, send)
            return
        await self._record(scope, receive, send, lease.call, conversation)

    async def _record(self, scope: Any, receive: Any, send: Any, call: Call, conversation: str) -> None:
        registry: StreamRegistry = scope["app"].state.streams
        stream: RecordedStream | None = None
        client_gone, response_done = asyncio.Event(), asyncio.Event()
        body_done = False

        async def detached_receive() -> Any:
            nonlocal body_done
            if not body_done:
                message = await receive()
                if message["type"] == "http.request" and not message.get("more_body", False):
                    body_done = True
                return message
            # After the body the app only learns of a disconnect, which must not cancel the generation: it is held
            # back until the response is complete (Litestar's stream then needs it to finish the request).
            message = await receive()
            await response_done.wait()
            return message

        async def recording_send(message: Any) -> None:
            nonlocal stream
            if message["type"] == "http.response.start":
                # Every successful response is recorded, streamed or not (streams are what readers resume; a
                # whole JSON body is just replayed as is), so the status alone decides.
                if message["status"] == 200:
                    stream = registry.open(conversation, call.model, call)
            elif message["type"] == "http.response.body":
                if stream is not None:
                    registry.append(stream, message.get("body", b""))
                if not message.get("more_body", False):
                    response_done.set()
            if client_gone.is_set():
                return
            try:
                await send(message)
            except OSError:  # the client went away (uvicorn raises ClientDisconnected): keep generating
                client_gone.set()
                if stream is None or not registry.holds(stream):
                    call.cancel()  # nothing records it: nobody could read what it writes
                else:
                    stream.client_gone = True

        try:
            await self._app(scope, detached_receive, recording_send)
        finally:
            if stream is not None:
                stream.finish()


# -- routes --------------------------------------------------------------------------------------------------------

class LookupRequest(msgspec.Struct, kw_only=True):
    conversation_ids: list[str]


class ControlRequest(msgspec.Struct, kw_only=True):
    id: str  # the completion id streamed back as `id` (chatcmpl-...), or a conversation id
    action: ControlAction = "stop"
    model: str | None = None


def _registry(request: Request) -> StreamRegistry:
    return request.app.state.streams


def _find(request: Request, stream_id: str) -> RecordedStream:
    stream = _registry(request).find(stream_id)
    if stream is None:
        raise NotFoundException(detail=f"no recorded stream {stream_id!r}")
    return stream


@post("/v1/streams/lookup", status_code=200, opt=EXEMPT, summary="Recorded streams of these conversations")
async def lookup_streams(data: JSONBody[LookupRequest], request: Request) -> list[dict[str, Any]]:
    return [s.summary() for s in _registry(request).lookup(data.conversation_ids)]


@get("/v1/streams", summary="Every recorded stream")
async def list_streams(request: Request) -> list[dict[str, Any]]:
    return [s.summary() for s in _registry(request).all()]


# A stream is addressed as llama-ui does (`/v1/stream?conv_id=ID`) or by path (`/v1/stream/ID`); the byte offset
# is the `from` query parameter either way.
FromOffset = Annotated[int, QueryParameter(name="from", ge=0)]


def _replay(request: Request, conv_id: str, offset: int) -> Any:
    stream = _find(request, conv_id)
    if offset > len(stream.data):
        raise InvalidRequestError(f"from={offset} is past the {len(stream.data)} bytes recorded", param="from")
    # No pings of its own: a reader counts every byte it got as its next offset, and the recording already holds
    # the original stream's pings.
    return sse_response(stream.read_from(offset), ping_interval_s=None)


def _forget(request: Request, conv_id: str) -> dict[str, Any]:
    stream = _find(request, conv_id)
    if not stream.done and stream.call is not None:
        stream.call.cancel()
    _registry(request).remove(stream.key)
    return {"success": True, "conversation_id": stream.key}


@get("/v1/stream", summary="Replay a recorded stream from a byte offset, then tail it live", media_type=EVENT_STREAM,
     raises=[NotFoundException])
async def read_stream(request: Request, conv_id: FromQuery[str], offset: FromOffset = 0) -> Any:
    return _replay(request, conv_id, offset)


@get("/v1/stream/{conv_id:str}", summary="Replay a recorded stream (addressed by path)", media_type=EVENT_STREAM,
     raises=[NotFoundException])
async def read_stream_at(request: Request, conv_id: FromPath[str], offset: FromOffset = 0) -> Any:
    return _replay(request, conv_id, offset)


@delete("/v1/stream", status_code=200, summary="Forget a recorded stream (cancels its generation if running)",
        raises=[NotFoundException])
async def delete_stream(request: Request, conv_id: FromQuery[str]) -> dict[str, Any]:
    return _forget(request, conv_id)


@delete("/v1/stream/{conv_id:str}", status_code=200, summary="Forget a recorded stream (addressed by path)",
        raises=[NotFoundException])
async def delete_stream_at(request: Request, conv_id: FromPath[str]) -> dict[str, Any]:
    return _forget(request, conv_id)


@post("/v1/chat/completions/control", status_code=200, opt=EXEMPT, raises=[NotFoundException, Conflict],
      summary="Stop, or end the reasoning of, exactly the addressed in-flight generation")
async def control(data: JSONBody[ControlRequest], router: RouterDependency,
                  request: Request) -> dict[str, Any]:
    call = router.find_call(completion_id=data.id) or router.find_call(conversation_id=data.id)
    if call is None:
        raise NotFoundException(detail=f"no in-flight generation {data.id!r}")
    if data.action in STOP_ACTIONS:
        return {"success": True, "id": data.id, "cancelled": call.cancel()}
    controls = call.reasoning_controls()
    if not controls:
        raise Conflict(detail=f"generation {data.id!r} cannot have its reasoning ended: "
                                                      "send the request with reasoning_control: true")
    ended = sum(c.end_reasoning() for c in controls)
    answer: dict[str, Any] = {"success": ended > 0, "id": data.id, "reasoning_ended": ended}
    if not ended:
        answer["message"] = "the generation's reasoning is not open (it has ended, or the model did not open one)"
    return answer


route_handlers = [lookup_streams, list_streams, read_stream, read_stream_at, delete_stream, delete_stream_at, control]
