"""The model router: several configured models, one resident engine at a time, swapped on demand.

    router = ModelRouter(config)                         # a RouterConfig (ninfer.serve.router_config)
    await router.start()                                 # the 1-second TTL ticker; nothing is loaded, no warm-up
    async with await router.acquire("qwen") as served:   # loads or swaps as needed, then pins the model
        ... served.engine ...                            # (HTTP requests get this from ninfer.serve.gate)
    router.request_load("qwen") / request_unload("qwen") # fire-and-forget; progress goes to router.events
    router.close()

Lifecycle of a swap (A resident, a request for B arrives): B's ticket waits in FIFO order; new requests for A that
arrive after it wait too, so B cannot starve, and every request that waited for B's load is admitted with it. Once
A's in-flight requests finish (a request pins its model for as long as its response streams), A is closed (`Engine.close` frees all its memory) and B is opened in a worker thread, gated
on readiness under `health_check_timeout`. A load that fails marks B `failed` with the reason; the requests that
waited for it get a 503 naming it, the server keeps running, and a later request retries. Requests wait at most
`load_wait_timeout` for their model (a 503 with Retry-After when that runs out). The router never caps concurrency:
each engine's own bounded FIFO answers 429 when full.

Every status change is published to `router.events` subscribers (the `/models/sse` feed) in the order it happened.

A model with a prefix-cache host tier (host_kv_mib / host_state_slots) comes back warm: the router keeps the tier
when it closes the engine (the engine moves what its GPU cache held there first, as far as the tier has room) and
hands it to the model's next engine, whose first requests reuse what it holds. Host memory is therefore bounded by
the sum of the configured models' tiers, allocated at each model's first load and kept for the router's lifetime.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from litestar.exceptions import HTTPException

from ninfer import _engine
from ninfer.engine import Engine, EngineOptions, EngineStats
from ninfer.errors import NinferError
from ninfer.serve.calls import Call, failure_summary
from ninfer.serve.metrics import ServerMetrics
from ninfer.serve.router_config import ModelSpec, RouterConfig, single_model_config
from ninfer.serve.state import ServedModel

log = logging.getLogger("ninfer.serve.router")

TICK_S = 1.0
RETRY_AFTER_S = 5
EVENT_QUEUE_LIMIT = 256  # per SSE subscriber; a reader that falls this far behind is dropped
RECENT_ERRORS = 20  # what the dashboard's "recent errors" keeps: load failures and server-side request failures


class ModelNotFoundError(HTTPException):
    status_code = 404


class ModelUnavailableError(HTTPException):
    """The model failed to load, or did not become ready within the wait bound."""

    status_code = 503



# -- runtime state -------------------------------------------------------------------------------------------------

UNLOADED, LOADING, LOADED, FAILED = "unloaded", "loading", "loaded", "failed"


@dataclass(eq=False)
class ModelEntry:
    spec: ModelSpec
    status: str = UNLOADED
    failure: str | None = None
    served: ServedModel | None = None
    pins: int = 0
    last_used: float = 0.0
    loaded_at: float | None = None
    load_seconds: float | None = None
    progress: float = 0.0  # of the load in progress (0..1), as the status feed reports it
    load_cancelled: bool = False  # /models/unload arrived while it loaded: close it as soon as the load ends
    waiting: str | None = None  # why its wanted load has not started: "waiting for N requests on MODEL"
    calls: list[Call] = field(default_factory=list)  # in-flight HTTP requests pinning it, oldest first
    # HTTP requests that ended while the engine still held a generation of theirs (a client that left: the engine
    # frees its lane at its next step): /slots shows them until then, as the engine's counters do
    leaving: list[Call] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    def call_ended(self, call: Call) -> None:
        self.calls.remove(call)
        self.leaving.append(call)
        self.lane_holders()

    def lane_holders(self) -> list[Call]:
        """The calls whose generations the resident engine may still hold in a lane or its queue: those in flight,
        and those that ended before the engine let go (dropped here once it has, or once their engine is gone)."""
        engine = self.served.engine if self.served is not None else None
        self.leaving = [call for call in self.leaving if call.holds_engine(engine)]
        return self.calls + self.leaving


@dataclass(eq=False)
class _Ticket:
    """A wish for `entry` to be resident (None: for nothing to be resident, i.e. an unload)."""

    entry: ModelEntry | None
    failure: str | None = None
    batched: bool = False  # waited through the load of its model: admitted with that load's whole batch


@dataclass(frozen=True)
class StatusEvent:
    model: str
    status: str
    failure: str | None
    at: float
    progress: float = 0.0  # of a load (1.0 once loaded)
    waiting: str | None = None  # ModelEntry.waiting


class Lease:
    """A pin on the resident model, held for `call` (None: a pin of the router's own, e.g. /models/load);
    `async with` releases it."""

    def __init__(self, router: ModelRouter, entry: ModelEntry, call: Call | None = None) -> None:
        self._router = router
        self.entry = entry
        self.call = call
        self._released = False

    @property
    def served(self) -> ServedModel:
        assert self.entry.served is not None
        return self.entry.served

    async def release(self) -> None:
        if not self._released:
            self._released = True
            if self.call is not None and self.call in self.entry.calls:
                self.entry.call_ended(self.call)
            await self._router._release(self.entry)

    async def __aenter__(self) -> ServedModel:
        return self.served

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


_ZERO_STATS = EngineStats(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)

# (path, options, progress, host_tier): `progress(fraction)` may be called from the loading thread (Engine.open's
# contract); host_tier is the one the model's last engine left, or None.
OpenEngine = Callable[[Path, EngineOptions, Callable[[float], None], "_engine.HostTier | None"], Awaitable[Engine]]


def host_tier_key(spec: ModelSpec) -> tuple[Any, ...] | None:
    """Which host tier a model's engines share: one per artifact file, KV dtype and tier size (None: it has none).
    The tier itself checks the artifact's identity (its manifest) when an engine attaches, and starts empty when the
    file changed."""
    o = spec.options
    if not o.prefix_cache or not (o.host_kv_mib or o.host_state_slots):
        return None
    return (str(spec.path.resolve()), o.kv_dtype, o.host_kv_mib, o.host_state_slots)


class ModelRouter:
    """The configured models by name, one resident at a time (see the module doc). Handlers get it from the
    `router` dependency (ninfer.serve.gate)."""

    def __init__(self, config: RouterConfig, *, open_engine: OpenEngine = Engine.open,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        """`clock` (monotonic seconds) and `sleep` are the ticker's: tests drive both to step through its ticks."""
        self.config = config
        self._open_engine = open_engine
        self._clock = clock
        self._sleep = sleep
        self._entries = {spec.name: ModelEntry(spec) for spec in config.models}
        self._names = {name: entry for entry in self._entries.values() for name in (entry.name, *entry.spec.aliases)}
        self._resident: ModelEntry | None = None
        self._tickets: list[_Ticket] = []
        self._cond = asyncio.Condition()
        self._busy: asyncio.Task[None] | None = None  # the one swap or unload in progress
        self._ticker: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._subscribers: set[asyncio.Queue[StatusEvent | None]] = set()
        self._call_ids = iter(range(1, 2**62))
        # Recent (time, model, one-line message), for the dashboard: load failures, and requests the engine failed
        # (each engine's on_failure).
        self.errors: deque[tuple[float, str, str]] = deque(maxlen=RECENT_ERRORS)
        # Loads past their health-check timeout, still running, each a task that closes its engine once it opens
        # (held: the loop keeps only weak references). The next load waits for them: one engine in memory at a time.
        self._abandoned_loads: set[asyncio.Task[None]] = set()
        self.started = time.time()
        self.metrics = ServerMetrics(self.resident_stats)
        # Host tiers outlive their engines (see the module doc), by host_tier_key.
        self.host_tiers: dict[tuple[Any, ...], _engine.HostTier] = {}

    @classmethod
    def serving(cls, served: ServedModel, **kwargs: Any) -> ModelRouter:
        """A one-model router around an engine the caller already opened (resident at once, never unloaded)."""
        engine = served.engine
        router = cls(single_model_config(engine.info.path, served.model_id, engine.options,
                                         served.preserve_thinking), **kwargs)
        entry = router._entries[served.model_id]
        engine.on_failure = router._error_recorder(served.model_id)
        served.metrics = router.metrics
        entry.served, entry.status, entry.loaded_at = served, LOADED, time.time()
        router._resident = entry
        return router

    # -- what handlers and status routes read --------------------------------------------------------------------

    @property
    def entries(self) -> list[ModelEntry]:
        return list(self._entries.values())

    @property
    def models(self) -> list[ServedModel]:
        """The loaded models (zero or one)."""
        return [e.served for e in self._entries.values() if e.served is not None]

    @property
    def resident(self) -> ModelEntry | None:
        return self._resident

    def resident_stats(self) -> EngineStats:
        resident = self._resident
        if resident is None or resident.served is None:
            return _ZERO_STATS
        return resident.served.engine.stats()

    def lookup(self, name: str | None) -> ModelEntry:
        """The entry a request names. No name: the resident model, else the first configured one. With one model
        every name is that model (as llama.cpp answers any name with its one model)."""
        if len(self._entries) == 1:
            return next(iter(self._entries.values()))
        if name is None or name == "":
            return self._resident or next(iter(self._entries.values()))
        entry = self._names.get(name)
        if entry is None:
            raise ModelNotFoundError(detail=f"model {name!r} is not served here; known models: "
                                            f"{', '.join(self._entries)}")
        return entry

    def find_call(self, *, completion_id: str | None = None, conversation_id: str | None = None) -> Call | None:
        """The in-flight call with this completion id or conversation id; the newest, for a conversation that a
        second request took over (ninfer.serve.streams: one generation per conversation)."""
        for entry in self._entries.values():
            for call in reversed(entry.calls):
                if completion_id is not None and completion_id in call.completion_ids:
                    return call
                if conversation_id is not None and call.conversation_id == conversation_id:
                    return call
        return None

    # -- lifecycle -----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._ticker = asyncio.create_task(self._tick(), name="ninfer-router-ttl")

    def close(self) -> None:
        """Stops the ticker and closes the resident engine (the app's lifespan calls this at shutdown)."""
        for task in (self._ticker, self._busy, *self._background):
            if task is not None:
                task.cancel()
        for entry in self._entries.values():
            if entry.served is not None:
                entry.served.engine.close()
                entry.served = None
                entry.status = UNLOADED
        for queue in self._subscribers:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)  # ends each /models/sse feed

    async def acquire(self, name: str | None, *, wait_s: float | None = None, call: Call | None = None) -> Lease:
        """Pins the named model, loading or swapping to it first. Raises ModelNotFoundError, or
        ModelUnavailableError when it fails to load or is not ready within `wait_s` (default: the config's)."""
        entry = self.lookup(name)
        await self._wait_for(_Ticket(entry), self.config.load_wait_s if wait_s is None else wait_s)
        if call is not None:
            entry.calls.append(call)
        return Lease(self, entry, call)

    def new_call(self, model: str, path: str, conversation_id: str | None) -> Call:
        return Call(next(self._call_ids), model, path, conversation_id)

    def request_load(self, name: str | None) -> ModelEntry:
        """llama.cpp's /models/load: returns at once; the status feed reports the load."""
        entry = self.lookup(name)

        async def load() -> None:
            try:
                lease = await self.acquire(entry.name, wait_s=float("inf"))
            except ModelUnavailableError:
                return  # reported as `failed` on the feed
            await lease.release()

        self._spawn(load())
        return entry

    def request_unload(self, name: str | None = None) -> list[ModelEntry]:
        """Unloads the named model (None: whatever is resident) once its in-flight requests finish; returns the
        entries that will be unloaded (empty when it is neither loaded nor loading nor waited for).

        A model that is loading, or that requests are waiting to load, has its load cancelled: the waiting requests
        get a 503, and an engine whose load is under way (its thread cannot be interrupted) is closed as soon as it
        is open, and never becomes resident. The feed reports `unloaded` then (llama-ui's "cancel load")."""
        if name is None:
            targets = [e for e in self._entries.values() if e is self._resident or e.status == LOADING]
        else:
            targets = [self.lookup(name)]
        unloading = []
        for target in targets:
            if target is self._resident:
                self._unload_when_free()
            elif target.status == LOADING or any(t.entry is target for t in self._tickets):
                self._spawn(self._cancel_load(target))
            else:
                continue
            unloading.append(target)
        return unloading

    def subscribe(self) -> asyncio.Queue[StatusEvent | None]:
        queue: asyncio.Queue[StatusEvent | None] = asyncio.Queue(EVENT_QUEUE_LIMIT)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[StatusEvent | None]) -> None:
        self._subscribers.discard(queue)

    # -- internals -----------------------------------------------------------------------------------------------

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _unload_when_free(self) -> None:
        """Unloads the resident model once nothing pins it (a ticket for no model)."""
        self._spawn(self._wait_for(_Ticket(None), float("inf")))

    async def _cancel_load(self, entry: ModelEntry) -> None:
        async with self._cond:
            for ticket in self._tickets:
                if ticket.entry is entry and ticket.failure is None and not self._satisfied(ticket):
                    ticket.failure = f"the load of model {entry.name!r} was cancelled (/models/unload)"
            if entry.status == LOADING:
                entry.load_cancelled = True  # _swap closes it once its load ends
            elif self._resident is entry:  # its load ended before this ran: unload it as asked
                self._unload_when_free()
            self._cond.notify_all()

    def _publish(self, entry: ModelEntry) -> None:
        event = StatusEvent(entry.name, entry.status, entry.failure, time.time(), entry.progress, entry.waiting)
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:  # a stalled reader: end its feed rather than grow without bound
                self._subscribers.discard(queue)

    def _set_status(self, entry: ModelEntry, status: str, failure: str | None = None) -> None:
        entry.status, entry.failure = status, failure
        entry.progress = 1.0 if status == LOADED else 0.0
        if failure is not None:
            self.record_error(entry.name, f"failed to load: {failure}")
        self._publish(entry)

    def record_error(self, model: str, message: str) -> None:
        self.errors.append((time.time(), model, message))

    def _error_recorder(self, model: str) -> Callable[[NinferError, bool], None]:
        """An engine's `on_failure`: lists what failed on the server's side (ninfer.serve.calls.failure_summary)."""
        def record(exc: NinferError, started: bool) -> None:
            summary = failure_summary(exc, started=started)
            if summary is not None:
                self.record_error(model, summary)

        return record

    def _explain_waits(self) -> None:
        """Sets each entry's `waiting` (published when it changes): a model whose requests wait for the resident
        model's in-flight requests to finish before it can be loaded. Called with the condition's lock held."""
        resident = self._resident
        for entry in self._entries.values():
            waits = (resident is not None and resident is not entry and resident.pins > 0
                     and entry.status in (UNLOADED, FAILED)
                     and any(t.entry is entry and t.failure is None for t in self._tickets))
            message = None
            if waits:
                assert resident is not None
                message = f"waiting for {resident.pins} request{'s' if resident.pins > 1 else ''} on {resident.name}"
            if message != entry.waiting:
                entry.waiting = message
                self._publish(entry)

    def _satisfied(self, ticket: _Ticket) -> bool:
        """A ticket is granted when its wish holds and no older ticket wishes otherwise (FIFO fairness)."""
        if ticket.entry is None:
            return self._resident is None
        if self._resident is not ticket.entry or ticket.entry.status != LOADED:
            return False
        if ticket.batched:
            return True
        for other in self._tickets:
            if other is ticket:
                return True
            if other.entry is not ticket.entry:
                return False
        return True

    async def _wait_for(self, ticket: _Ticket, wait_s: float) -> None:
        deadline = self._clock() + wait_s
        async with self._cond:
            self._tickets.append(ticket)
            try:
                while True:
                    if ticket.failure is not None:
                        raise ModelUnavailableError(detail=ticket.failure, headers={"Retry-After": str(RETRY_AFTER_S)})
                    if self._satisfied(ticket):
                        if ticket.entry is not None:
                            ticket.entry.pins += 1
                            ticket.entry.last_used = self._clock()
                        return
                    self._start_next_swap()
                    self._explain_waits()
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        assert ticket.entry is not None  # unload tickets wait without a bound
                        raise ModelUnavailableError(
                            detail=f"model {ticket.entry.name!r} was not ready within {wait_s:g} s "
                                   f"({ticket.entry.status})", headers={"Retry-After": str(RETRY_AFTER_S)})
                    try:
                        await asyncio.wait_for(self._cond.wait(), min(remaining, 3600.0))
                    except TimeoutError:
                        pass
            finally:
                self._tickets.remove(ticket)
                self._explain_waits()
                self._cond.notify_all()

    async def _release(self, entry: ModelEntry) -> None:
        async with self._cond:
            entry.pins -= 1
            entry.last_used = self._clock()
            self._start_next_swap()
            self._explain_waits()
            self._cond.notify_all()

    def _start_next_swap(self) -> None:
        """Starts the swap (or unload) the oldest unsatisfied ticket asks for, once the resident model is idle.
        Called with the condition's lock held."""
        if self._busy is not None and not self._busy.done():
            return
        resident = self._resident
        if resident is not None and resident.pins > 0:
            return  # drain first: in-flight requests pin their model
        if any(self._satisfied(t) for t in self._tickets if t.entry is not None):
            return  # requests granted the resident model are waking up to pin it: let them in first
        for ticket in self._tickets:
            if ticket.failure is not None or self._satisfied(ticket):
                continue
            if ticket.entry is None and resident is None:
                continue
            self._busy = asyncio.create_task(self._swap(ticket.entry), name="ninfer-router-swap")
            return

    async def _swap(self, target: ModelEntry | None) -> None:
        old = self._resident
        if old is not None and old is not target and not await self._unload(old):
            await self._finish_op()  # it was pinned again meanwhile: the next release reconsiders
            return
        if target is None or target is self._resident:
            await self._finish_op()
            return
        target.load_cancelled = False
        self._set_status(target, LOADING)
        started = self._clock()
        failure = await self._open(target)
        if target.load_cancelled:  # /models/unload came while it loaded
            target.load_cancelled = False
            await self._close_served(target)
            async with self._cond:
                self._set_status(target, UNLOADED)
            await self._finish_op()
            return
        async with self._cond:
            if failure is None:
                target.load_seconds = self._clock() - started
                target.loaded_at = time.time()
                target.last_used = self._clock()
                self._resident = target
                self._set_status(target, LOADED)
                # Everyone who waited for this load goes in together: one swap per batch, not per request.
                for ticket in self._tickets:
                    ticket.batched = ticket.batched or ticket.entry is target
            else:
                log.error("model %s failed to load: %s", target.name, failure)
                self._set_status(target, FAILED, failure)
                for ticket in self._tickets:
                    if ticket.entry is target:
                        ticket.failure = f"model {target.name!r} failed to load: {failure}"
            self._cond.notify_all()
        await self._finish_op()

    async def _finish_op(self) -> None:
        async with self._cond:
            self._busy = None
            self._start_next_swap()
            self._cond.notify_all()

    def _progress_reporter(self, target: ModelEntry) -> Callable[[float], None]:
        """`progress(fraction)` for the loading thread: publishes the fraction on the loop while this load is the
        one in progress (a load abandoned at its health-check timeout reports nothing more)."""
        loop = asyncio.get_running_loop()
        busy = self._busy

        def publish(fraction: float) -> None:
            if self._busy is busy and target.status == LOADING and fraction > target.progress:
                target.progress = fraction
                self._publish(target)

        return lambda fraction: loop.call_soon_threadsafe(publish, min(max(fraction, 0.0), 0.999))

    async def _open(self, target: ModelEntry) -> str | None:
        """Opens the target's engine and gates on readiness; returns the failure reason, or None when ready."""
        spec = target.spec
        timeout = self.config.health_check_timeout_s
        if self._abandoned_loads:  # their memory is not free until they end (bounded like a load)
            _, running = await asyncio.wait(self._abandoned_loads, timeout=timeout)
            if running:
                return (f"an earlier load that outlived its health-check timeout is still running, so its memory is "
                        f"not free yet (waited {timeout:g} s)")
        tier_key = host_tier_key(spec)
        tier = self.host_tiers.get(tier_key) if tier_key is not None else None
        opening = asyncio.ensure_future(self._open_engine(spec.path, spec.options, self._progress_reporter(target),
                                                          tier))
        done, _ = await asyncio.wait({opening}, timeout=timeout)
        if not done:
            # The load thread cannot be interrupted: close whatever it produces once it finishes; it never becomes
            # resident (this load has failed).
            closing = asyncio.create_task(self._close_when_opened(opening), name="ninfer-router-abandoned-load")
            self._abandoned_loads.add(closing)
            closing.add_done_callback(self._abandoned_loads.discard)
            return f"not ready within the health-check timeout of {timeout:g} s"
        try:
            engine = opening.result()
        except NinferError as exc:
            return str(exc)
        except Exception as exc:  # a load must never take the server down; the reason goes to the status feed
            log.exception("unexpected error while loading %s", spec.name)
            return f"{type(exc).__name__}: {exc}"
        try:
            engine.stats()  # readiness: the scheduler answers
        except NinferError as exc:
            engine.close()
            return f"not ready: {exc}"
        if tier_key is not None and engine.host_tier is not None:
            self.host_tiers[tier_key] = engine.host_tier
        engine.on_failure = self._error_recorder(spec.name)
        served = ServedModel(spec.name, engine,
                             preserve_thinking=spec.preserve_thinking, metrics=self.metrics,
                             sampling_override=spec.sampling, default_max_tokens=spec.max_tokens)
        target.served = served
        return None

    @staticmethod
    async def _close_when_opened(opening: asyncio.Future[Engine]) -> None:
        try:
            engine = await opening
        except Exception as exc:  # noqa: BLE001 - nothing to close; the load was reported failed at its timeout
            log.info("a load abandoned at its health-check timeout failed later: %s", exc)
            return
        log.info("closing %s, whose load finished after its health-check timeout", engine.info.path)
        await asyncio.to_thread(engine.close)

    async def _close_served(self, entry: ModelEntry) -> None:
        """Closes the entry's engine (`Engine.close` frees all its memory) and drops it."""
        served, entry.served = entry.served, None
        if served is None:
            return
        engine = served.engine
        del served
        await asyncio.to_thread(engine.close)
        del engine
        gc.collect()  # nothing of the old model may outlive the swap

    async def _unload(self, entry: ModelEntry) -> bool:
        """Closes the resident engine unless a request pins it; returns whether it did."""
        async with self._cond:
            if entry.pins > 0:
                return False
            self._resident = None
            entry.loaded_at = None
        await self._close_served(entry)
        self._set_status(entry, UNLOADED)
        return True

    def now(self) -> float:
        """The router's monotonic clock (`last_used` is on it)."""
        return self._clock()

    def effective_ttl(self, entry: ModelEntry) -> float:
        return self.config.ttl_s if entry.spec.ttl_s is None else entry.spec.ttl_s

    def idle_past_ttl(self) -> ModelEntry | None:
        """The resident model if it has been idle for its effective TTL or longer, with nothing in flight, waiting
        or swapping: what the ticker unloads. Called with the condition's lock held."""
        entry = self._resident
        if (entry is None or entry.pins or self._tickets or (self._busy and not self._busy.done())
                or entry.status != LOADED):
            return None
        ttl = self.effective_ttl(entry)
        return entry if ttl > 0 and self._clock() - entry.last_used >= ttl else None

    async def _tick(self) -> None:
        """Every TICK_S, unloads the model `idle_past_ttl` names (so it goes at most TICK_S after its TTL ran out)."""
        while True:
            await self._sleep(TICK_S)
            async with self._cond:
                entry = self.idle_past_ttl()
                if entry is not None:
                    log.info("model %s idle for %g s: unloading", entry.name, self.effective_ttl(entry))
                    self._busy = asyncio.create_task(self._swap(None), name="ninfer-router-ttl-unload")
