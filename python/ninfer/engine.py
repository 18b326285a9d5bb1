"""The async engine API over `ninfer._engine` (DESIGN.md, "The Python-facing engine API").

The C++ engine runs its own scheduler thread and queues events. One pump thread here drains them (the GIL is
released while it waits) and hands each to its request's asyncio queue with `call_soon_threadsafe`, so a slow
consumer only lets its own queue grow and never stalls the engine or other requests.

Constrained requests (structured output) carry a `TokenConstraint`. Before such a request samples, the C++ engine
posts a mask request (before the step's forward) and waits, after the forward, for the answer; the pump computes
every mask of the step with one hold of the GIL and hands them back. With speculative decoding, a constraint that
can mask draft rows (`DraftTokenConstraint`) gets the round's drafts and answers with a mask per verified row. No
Python ever runs on the scheduler thread, and unconstrained requests never wait for Python.

The pump holds the native engine, never the `Engine`, so an engine nobody closed is still collected; a
`weakref.finalize` closes it then, or at interpreter exit (before Python finalizes, while the pump can still take
the GIL: a daemon thread woken inside a native call after that point aborts the process).
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, Protocol, Self

import numpy as np

from ninfer import _engine, errors
from ninfer.artifact.reader import read_artifact
from ninfer.frontend.media_limits import MediaLimits
from ninfer.frontend.text import Frontend
from ninfer.frontend.vision_prompt import PromptMedia

_PUMP_WAIT_S = 0.05
_KV_CAPACITY_AUTO = -1  # the C++ engine's kKvCapacityAuto

# The values the C++ engine accepts for EngineOptions' string fields (configs and CLIs check against these at start).
BACKENDS = ("auto", "cpu", "cuda")
KV_DTYPES = ("bf16", "fp8", "int8", "nvfp4", "k8v4", "f32")
CUDA_GEMMS = ("auto", "twin", "streamed")
SPEC_METHODS = ("none", "mtp")
MAX_DRAFT_TOKENS = 5
OPTION_CHOICES: Mapping[str, tuple[str, ...]] = {
    "backend": BACKENDS, "kv_dtype": KV_DTYPES, "cuda_gemm": CUDA_GEMMS, "spec": SPEC_METHODS,
}


@dataclass(frozen=True)
class EngineOptions:
    backend: str = "auto"  # auto (cuda when a GPU is usable, else cpu) | cpu | cuda
    max_context: int = 4096
    # tokens in the KV pool; None = a context per lane (decision lanes included) and 256 tokens per decision row;
    # "auto" = the most that fits in device memory after the weights with 1 GiB to spare, at most that (CUDA; on
    # the CPU backend as None)
    kv_capacity: int | Literal["auto"] | None = None
    max_concurrency: int = 1  # lanes, 1..8
    max_queue: int = 16  # requests that may wait for a lane
    # lanes that run decision jobs only (their own queue of max_queue places), 0..8; 0 refuses decisions
    decision_lanes: int = 1
    # questions of one decision job in flight at once (forks of its context, one forward pass), 1..64; more run
    # as rounds
    decision_rows: int = 16
    kv_dtype: str = "bf16"  # f32 | bf16 | fp8 | int8 | nvfp4 | k8v4 (docs/cli.md)
    # tokens per prefill chunk, a multiple of 64; 0 = auto: 512 on the CPU backend, on CUDA the largest chunk up to
    # 8192 the memory plan allows (memory_plan()["prefill_chunk"] says which). Decoding lanes wait at most one chunk.
    prefill_chunk: int = 0
    # the prefill chunk while other lanes decode (a long prompt then holds their tokens back by one such pass), a
    # multiple of 64 up to prefill_chunk; 0 = auto: prefill_chunk on the CPU backend, at most 2048 on CUDA
    decoding_prefill_chunk: int = 0
    threads: int = 0  # 0 = all cores
    verify_checksums: bool = True
    cuda_graphs: bool = True  # decode passes as CUDA graphs (cuda backend)
    device_sampling: bool = True  # sample on the GPU (cuda backend; False: copy logits, sample on the host)
    # the cuda backend's prefill GEMM: "auto" (the fastest path each weight allows) | "twin" (the f32 twin for every
    # weight: results independent of how prompt rows are batched, as the decode GEMV's are)
    cuda_gemm: str = "auto"
    cuda_op_times: bool = False  # time every op of eager passes (cuda backend): memory_plan()["op_times"]
    # speculative decoding: "none" | "mtp" (the model's MTP head drafts `draft_tokens`, 1..5, per round; lossless;
    # the cpu backend only for now: docs/speculative-decoding.md)
    spec: str = "none"
    draft_tokens: int = 3
    vision: bool = False  # load the vision tower: prompts may carry images and video
    media_limits: MediaLimits = field(default_factory=MediaLimits)  # what media may cost (with vision)
    # exact-prefix reuse: 64-token KV blocks (and Gated DeltaNet state snapshots) stay cached for later prompts that
    # start with them (docs/prefix-cache.md)
    prefix_cache: bool = True
    # GDN state slots, one per lane and the rest snapshots; 0 = auto: 2 x max_concurrency + 4 with the prefix cache
    device_state_slots: int = 0
    # tokens between interior state snapshots of a long prompt, a multiple of 64; 0 = auto: max(4096, 2 x chunk)
    snapshot_interval: int = 0
    # the prefix cache's host tier (docs/prefix-cache.md): MiB of host memory for the KV blocks the device evicts,
    # and state snapshots it holds (one state image each); 0 and 0 = none. `Engine.host_tier` hands it to the next
    # engine of the model (the router does), which resumes from what it holds.
    host_kv_mib: int = 0
    host_state_slots: int = 0


# The sampler's stage names (llama.cpp's), and the order a request that names none runs them in.
SAMPLER_STAGES: tuple[str, ...] = tuple(_engine.SamplerStage.__members__)
DEFAULT_SAMPLER_ORDER: tuple[str, ...] = tuple(stage.name for stage in _engine.sampler_default_order())
# llama.cpp's other spellings of the stage names (common_sampler_types_from_names).
SAMPLER_ALIASES = {"nucleus": "top_p", "top-p": "top_p", "top-k": "top_k", "typical_p": "typ_p", "typical": "typ_p",
                   "typ-p": "typ_p", "typ": "typ_p", "min-p": "min_p", "temp": "temperature",
                   "top-n-sigma": "top_n_sigma"}


def sampler_stages(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """llama.cpp's sampler names (a request's `samplers`, a GGUF file's general.sampling.sequence) as stage names,
    and the names among them that the sampler has no stage for."""
    order = [SAMPLER_ALIASES.get(n, n) for n in names]
    return order, [n for n, stage in zip(names, order, strict=True) if stage not in SAMPLER_STAGES]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # llama.cpp's stages (ninfer._engine's sampler; off at these values). On a device backend a request that uses
    # any of them samples on the host.
    penalty_last_n: int = -1  # the penalties count the last this many tokens of prompt + output (-1: all)
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_breakers: tuple[int, ...] = ()  # token ids a repeat may not extend across
    order: tuple[str, ...] = ()  # stage names (SAMPLER_STAGES); empty: DEFAULT_SAMPLER_ORDER
    seed: int | None = None


class TokenConstraint(Protocol):
    """Per-request token mask source (ninfer.serve.structured.TokenConstraint is the grammar one). The engine calls
    `fill_next_mask(tokens sampled since the last call, mask)` before each sampled token, first with () right after
    prefill; `mask` is uint32, `(vocab_size + 31) // 32` words, bit t % 32 of word t // 32 allowing token t. It
    returns False to leave the step unconstrained. An exception ends the request with an EngineError."""

    def fill_next_mask(self, new_token_ids: Sequence[int], mask: np.ndarray) -> bool: ...


class DraftTokenConstraint(TokenConstraint, Protocol):
    """A TokenConstraint that can also mask a speculative round's draft rows, so its request decodes speculatively
    (with spec on; a plain TokenConstraint's request decodes one token per step). `fill_draft_masks(new tokens,
    drafts, masks)` commits the new tokens as fill_next_mask does, then writes into masks[i] (masks is [len(drafts)
    + 1, words]) the mask after drafts[:i] without committing them, and returns one flag per row it speaks for
    (True: masks[i] applies, False: unconstrained), at least one, at most len(drafts) + 1. It stops at the first
    draft its own mask forbids (that row's mask still given: the correction is drawn under it) and wherever it
    cannot know a later row's mask; the engine verifies only len(flags) - 1 drafts. Every row's mask must be the
    one fill_next_mask would give had the drafts before it been sampled: that is what keeps speculation lossless."""

    def fill_draft_masks(
        self, new_token_ids: Sequence[int], drafts: Sequence[int], masks: np.ndarray
    ) -> list[bool]: ...


@dataclass(frozen=True)
class Request:
    prompt_tokens: Sequence[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_new_tokens: int = 256
    stop_token_ids: Sequence[int] | None = None  # None: the model's end-of-sequence ids
    logprobs: bool = False
    top_logprobs: int = 0
    constraint: TokenConstraint | None = None  # used by one request only: it keeps state
    report_progress: bool = False  # a progress event (GenerationEvent.progress) after each prefill chunk
    media: PromptMedia | None = None  # the prompt's images / videos (frontend.vision_prompt.prompt_media)


@dataclass(frozen=True)
class PrefillProgress:
    """How far the prompt has been prefilled, after one prefill chunk."""

    total: int  # prompt tokens
    cached: int  # reused from a prefix cache, counted in `processed` too (0: no prefix reuse yet)
    processed: int  # prompt tokens in the request's cache now, cached ones included; the last event has total
    elapsed_s: float  # since the prefill began (admission into a lane)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int


@dataclass(frozen=True)
class Timings:
    queue_s: float
    ttft_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    total_s: float
    draft_n: int = 0  # speculative decoding: MTP drafts verified for the request
    draft_n_accepted: int = 0  # and accepted


@dataclass(frozen=True)
class GenerationEvent:
    """New tokens of one request; the last event has `finish_reason` (stop | length | cancelled), usage, timings.

    A request with `report_progress` also gets events that carry only `progress`, one per prefill chunk, all before
    its first token."""

    request_id: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    progress: PrefillProgress | None = None
    cached_tokens: int = 0  # prompt tokens the prefix cache served the request (on every event with tokens too)


@dataclass(frozen=True)
class PrefixCacheStats:
    """The prefix cache: what it holds now and what it did since the engine opened (all 0 when it is off)."""

    cached_blocks: int = 0  # 64-token KV blocks in the index
    cached_snapshots: int = 0  # Gated DeltaNet state snapshots in the index
    total_state_slots: int = 0  # lanes' and snapshots' (0: the model keeps no state)
    lookups: int = 0  # admissions that looked for a cached prefix
    hits: int = 0  # ... and reused one
    cached_tokens: int = 0  # prompt tokens reused
    restores: int = 0  # state snapshots copied into a lane from the device tier
    evicted_blocks: int = 0  # that left the device tier (moved to the host tier, or forgotten without one)
    evicted_snapshots: int = 0
    # The host tier (docs/prefix-cache.md; all 0 without one): what it holds now and its room, what moved there from
    # the device, what it forgot (GDSF), and what admissions restored from it.
    host_blocks: int = 0
    host_snapshots: int = 0
    host_pages: int = 0
    host_slots: int = 0
    host_stored_blocks: int = 0
    host_stored_snapshots: int = 0
    host_evicted_blocks: int = 0
    host_evicted_snapshots: int = 0
    host_restored_blocks: int = 0
    host_restored_snapshots: int = 0


@dataclass(frozen=True)
class EngineStats:
    lanes: int
    busy_lanes: int
    queued: int
    kv_capacity_tokens: int
    kv_free_tokens: int
    free_state_slots: int
    requests_finished: int
    tokens_generated: int
    tokens_prefilled: int
    resident_bytes: int
    draft_tokens: int = 0  # speculative decoding, over all requests: drafts verified
    draft_tokens_accepted: int = 0  # and accepted
    decision_lanes: int = 0
    busy_decision_lanes: int = 0
    forward_passes: int = 0  # model passes run (one step's slices, every lane's and decision row's, are one)
    prefix: PrefixCacheStats = PrefixCacheStats()


@dataclass(frozen=True)
class ModelInfo:
    path: str
    arch: str
    max_context: int
    vocab_size: int
    num_layers: int
    hidden_size: int
    modalities: tuple[str, ...]
    kv_dtype: str
    max_concurrency: int
    artifact_bytes: int
    # The artifact's recipe name and how many tensors each encoding holds (e.g. {"recipe": "groupwise-int",
    # "tensors": {"int4": 96, "bf16": 7}}).
    encoding: dict[str, Any]


_HOST_TIER_FIELDS = tuple(f.name for f in fields(PrefixCacheStats) if f.name.startswith("host_"))


def _native_options(options: EngineOptions) -> _engine.EngineOptions:
    if options.backend not in BACKENDS:
        raise errors.EngineError(f"unknown backend {options.backend!r} (use {', '.join(BACKENDS)})")
    native = _engine.EngineOptions()
    native.backend = options.backend
    native.cuda_graphs = options.cuda_graphs
    native.device_sampling = options.device_sampling
    native.cuda_gemm = options.cuda_gemm
    native.cuda_op_times = options.cuda_op_times
    native.spec = options.spec
    native.draft_tokens = options.draft_tokens
    native.max_context = options.max_context
    native.kv_capacity = _KV_CAPACITY_AUTO if options.kv_capacity == "auto" else options.kv_capacity or 0
    native.max_concurrency = options.max_concurrency
    native.max_queue = options.max_queue
    native.decision_lanes = options.decision_lanes
    native.decision_rows = options.decision_rows
    native.kv_dtype = options.kv_dtype
    native.prefill_chunk = options.prefill_chunk
    native.decoding_prefill_chunk = options.decoding_prefill_chunk
    native.threads = options.threads
    native.verify_checksums = options.verify_checksums
    native.vision = options.vision
    native.prefix_cache = options.prefix_cache
    native.device_state_slots = options.device_state_slots
    native.snapshot_interval = options.snapshot_interval
    native.host_kv_mib = options.host_kv_mib
    native.host_state_slots = options.host_state_slots
    return native


def _check_range(what: str, value: int, low: int, high: int, bounds: str) -> None:
    """The native request's integers are fixed-width: a value outside [low, high) is refused here, typed, instead of
    failing the bindings' conversion."""
    if not low <= value < high:
        raise errors.EngineError(f"invalid {what} = {value} (must be in {bounds})")


# The SamplingParams fields that go to the engine's struct as they are (the others need converting).
_PLAIN_SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams) if f.name not in ("dry_breakers", "order", "seed"))


def native_sampling(s: SamplingParams) -> _engine.SamplingParams:
    """The engine's SamplingParams, checked (an EngineError names the field and its range)."""
    _check_range("sampling value: top_k", s.top_k, 0, 2**31, "[0, 2^31)")
    for name in ("penalty_last_n", "dry_allowed_length", "dry_penalty_last_n"):
        _check_range(f"sampling value: {name}", getattr(s, name), -(2**31), 2**31, "int32")
    unknown = [stage for stage in s.order if stage not in SAMPLER_STAGES]
    if unknown:
        raise errors.EngineError(f"unknown sampler {unknown[0]!r} (known: {', '.join(SAMPLER_STAGES)})")
    sampling = _engine.SamplingParams()
    for name in _PLAIN_SAMPLING_FIELDS:
        setattr(sampling, name, getattr(s, name))
    sampling.dry_breakers = list(s.dry_breakers)
    sampling.order = [_engine.SamplerStage.__members__[stage] for stage in s.order]
    if s.seed is not None:
        _check_range("sampling value: seed", s.seed, 0, 2**64, "[0, 2^64)")
        sampling.has_seed, sampling.seed = True, s.seed
    _engine.sampling_params_validate(sampling)
    return sampling


def _native_request(request: Request, default_stops: Sequence[int], vocab_size: int) -> _engine.GenerationRequest:
    s = request.sampling
    ids = request.prompt_tokens
    if ids and not (-(2**31) <= min(ids) and max(ids) < 2**31):  # int32 ids; the engine checks the vocabulary
        position, bad = next((i, t) for i, t in enumerate(ids) if not 0 <= t < vocab_size)
        raise errors.EngineError(f"token id {bad} at position {position} is outside the vocabulary of {vocab_size}")
    _check_range("top_logprobs", request.top_logprobs, 0, 2**31, "[0, 2^31)")
    _check_range("max_new_tokens", request.max_new_tokens, 0, 2**63, "[0, 2^63)")
    sampling = native_sampling(s)
    sampling.logprobs = request.logprobs
    sampling.top_logprobs = request.top_logprobs
    native = _engine.GenerationRequest()
    native.prompt = list(request.prompt_tokens)
    native.sampling = sampling
    native.max_new_tokens = request.max_new_tokens
    stops = default_stops if request.stop_token_ids is None else request.stop_token_ids
    native.stop_token_ids = list(stops)
    native.constrained = request.constraint is not None
    native.masks_drafts = callable(getattr(request.constraint, "fill_draft_masks", None))
    native.report_progress = request.report_progress
    if request.media is not None:
        m = request.media
        native.set_media([(np.ascontiguousarray(item.pixel_values, dtype=np.float32), tuple(item.grid_thw), list(starts))
                          for item, starts in zip(m.inputs, m.group_starts, strict=True)],
                         np.ascontiguousarray(m.positions.T), m.delta)
    return native


def _event(ev: Any) -> GenerationEvent:
    if ev.kind == "progress":
        p = ev.progress
        progress = PrefillProgress(p.total, p.cached, p.processed, p.elapsed_s)
        return GenerationEvent(ev.request_id, (), progress=progress)
    finished = ev.finish != "none"
    return GenerationEvent(
        request_id=ev.request_id,
        token_ids=tuple(ev.tokens),
        logprobs=tuple(ev.logprobs) if ev.logprobs else None,
        top_logprobs=tuple(tuple(alts) for alts in ev.top_logprobs) if ev.top_logprobs else None,
        finish_reason=ev.finish if finished else None,
        usage=Usage(ev.usage.prompt_tokens, ev.usage.cached_tokens, ev.usage.generated_tokens) if finished else None,
        timings=Timings(ev.timings.queue_s, ev.timings.ttft_s, ev.timings.prefill_tokens_per_s,
                        ev.timings.decode_tokens_per_s, ev.timings.total_s, ev.timings.draft_n,
                        ev.timings.draft_n_accepted) if finished else None,
        cached_tokens=ev.usage.cached_tokens,
    )


def _error(error_type: str, message: str) -> errors.NinferError:
    cls = getattr(errors, error_type, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.NinferError)):
        cls = errors.EngineError
    return cls(message)


_Route = tuple[asyncio.AbstractEventLoop, asyncio.Queue]


def _deliver(route: _Route, ev: Any) -> None:
    try:
        route[0].call_soon_threadsafe(route[1].put_nowait, ev)
    except RuntimeError:  # its event loop is closed: nobody is listening any more
        pass


class _EventPump:
    """The thread that drains the native engine: events to their requests' queues, mask requests to their
    constraints. Owns the native engine's lifetime (`close`)."""

    def __init__(self, native: Any) -> None:
        self.native = native
        self.routes: dict[int, _Route] = {}
        self.constraints: dict[int, tuple[TokenConstraint, np.ndarray]] = {}
        # cancelled requests whose caller wants to know when their lane is free (Engine.generate's on_cancel_freed)
        self.freed_watchers: dict[int, Callable[[float], None]] = {}
        self.lock = threading.Lock()  # submit + registration is atomic against dispatch
        self.mask_words = (native.vocab_size + 31) // 32
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="ninfer-engine-pump", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            closing = self.closed
            news = self.native.next_events(_PUMP_WAIT_S)
            if news.mask_requests:
                self._fill_masks(news.mask_requests)
            with self.lock:
                for ev in news.events:
                    route = self.routes.get(ev.request_id)
                    if route is not None:
                        _deliver(route, ev)
                    if ev.finish != "none":
                        self.routes.pop(ev.request_id, None)
                        self.constraints.pop(ev.request_id, None)
                        watcher = self.freed_watchers.pop(ev.request_id, None)
                        if watcher is not None:
                            watcher(time.perf_counter())
            if closing and not news.events:
                return

    def _fill_masks(self, requests: Sequence[Any]) -> None:
        for req in requests:
            with self.lock:
                entry = self.constraints.get(req.request_id)
            if entry is None:
                continue  # it ended meanwhile
            constraint, masks = entry
            drafts = tuple(req.drafts)
            if len(masks) < len(drafts) + 1:  # (a round's rows: each request's buffer grows to the most it saw)
                masks = np.zeros((len(drafts) + 1, self.mask_words), dtype=np.uint32)
                with self.lock:
                    if req.request_id in self.constraints:
                        self.constraints[req.request_id] = (constraint, masks)
            try:
                if drafts:
                    rows = [bool(r) for r in constraint.fill_draft_masks(tuple(req.new_tokens), drafts,
                                                                        masks[: len(drafts) + 1])]
                    if not 1 <= len(rows) <= len(drafts) + 1:
                        raise ValueError(f"{len(rows)} mask rows for a round of {len(drafts)} drafts")
                else:
                    rows = [constraint.fill_next_mask(tuple(req.new_tokens), masks[0])]
            except Exception as exc:  # noqa: BLE001 - any failure of the constraint ends its request, typed
                self.native.fail_mask(req.request_id, f"the request's token constraint failed: {exc}")
                continue
            if drafts:
                self.native.provide_masks(req.request_id, masks, rows)
            else:
                self.native.provide_mask(req.request_id, masks[0] if rows[0] else None)

    def close(self) -> None:
        """Ends every request (`cancelled`), stops the native engine and this thread. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.native.close()  # releases the GIL: a pump waiting for it finishes its round and sees `closed`
        if threading.current_thread() is not self.thread:
            self.thread.join()


class GenerationObserver(Protocol):
    """Follows one request (Engine.submit's `observer`): the server's per-call activity for /slots and control."""

    def submitted(self, request_id: int) -> None: ...

    def received(self, event: GenerationEvent) -> None: ...

    def ended(self) -> None: ...  # the stream is closed, finished or not, or the submit was refused

    # The engine let go of the request: its lane (or queue place) and KV are free, as engine.stats() counts them.
    # After its last event was read, at once; for a stream closed early, when the cancel's final event arrives
    # (later than `ended`, at the engine's next step); for a refused submit, with `ended`.
    def released(self) -> None: ...


class RequestStream:
    """The events of one submitted request (`Engine.submit`), in order; the last has `finish_reason`. An engine
    error that ends the request is raised from the iteration. `aclose()` (which leaving `generate` early calls)
    cancels the request if it has not finished."""

    def __init__(self, engine: Engine, request_id: int, queue: asyncio.Queue, observer: GenerationObserver | None,
                 on_cancel_freed: Callable[[float], None] | None) -> None:
        self.request_id = request_id
        self._engine = engine
        self._queue = queue
        self._observer = observer
        self._on_cancel_freed = on_cancel_freed
        self._loop = asyncio.get_running_loop()  # where the observer is told `released`
        self._received = 0
        self._finished = False
        self._closed = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        if self._finished or self._closed:
            raise StopAsyncIteration
        ev = await self._queue.get()
        self._finished = ev.finish != "none"
        if self._finished and self._observer is not None:
            self._observer.released()
        if ev.finish == "error":
            error = _error(ev.error_type, ev.error_message)
            self._engine._report_failure(error, started=self._received > 0)
            await self.aclose()
            raise error
        self._received += 1
        event = _event(ev)
        if self._observer is not None:
            self._observer.received(event)
        if self._finished:
            await self.aclose()
        return event

    def __del__(self) -> None:
        # A stream dropped unread (a response that never began reading it) must not leave its request running.
        if not (self._finished or self._closed):
            self._cancel()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._finished:
            with self._engine._pump.lock:
                self._engine._pump.routes.pop(self.request_id, None)
        else:
            self._cancel()
        if self._observer is not None:
            self._observer.ended()

    def _cancel(self) -> None:
        """Cancels the unfinished request. When its final event arrives (its lane is free then), the pump thread
        calls `on_cancel_freed` and tells the observer `released`; at once, if it had ended already."""
        pump = self._engine._pump
        freed = _cancel_freed_watcher(self._on_cancel_freed, self._observer, self._loop)
        with pump.lock:
            pump.routes.pop(self.request_id, None)
            pump.freed_watchers[self.request_id] = freed  # before the cancel, whose event may come at once
        if not self._engine.cancel(self.request_id):
            with pump.lock:  # it had ended already: no final event is coming
                pump.freed_watchers.pop(self.request_id, None)
            _tell_released(self._observer, self._loop)


def _cancel_freed_watcher(on_cancel_freed: Callable[[float], None] | None, observer: GenerationObserver | None,
                          loop: asyncio.AbstractEventLoop) -> Callable[[float], None]:
    """What the pump calls when a cancelled request's final event arrives. It holds no stream (so no engine): a
    stream dropped unread must not keep its engine alive until then (nor be revived by its own `__del__`)."""
    def freed(at: float) -> None:
        if on_cancel_freed is not None:
            on_cancel_freed(at)
        _tell_released(observer, loop)
    return freed


def _tell_released(observer: GenerationObserver | None, loop: asyncio.AbstractEventLoop) -> None:
    if observer is not None:
        try:
            loop.call_soon_threadsafe(observer.released)
        except RuntimeError:  # its event loop is closed: nobody is watching any more
            pass


# The share of a load done after each of its steps, as `Engine(..., progress=)` reports it. The native loader has no
# progress callback of its own; its one step (mapping the artifact, checking and placing every tensor) is most of a
# load, and building the tokenizer, which takes seconds for large vocabularies, comes after it.
LOAD_PROGRESS = {"header": 0.05, "weights": 0.85, "tokenizer": 0.95}


class Engine:
    """One loaded model. Create with `await Engine.open(...)` (or `Engine.open_sync`); `close()` frees it (so does
    garbage collection, and interpreter exit)."""

    supports_token_constraints = True  # Request.constraint is honoured

    def __init__(self, path: str | Path, options: EngineOptions,
                 progress: Callable[[float], None] | None = None, host_tier: _engine.HostTier | None = None) -> None:
        """`host_tier`: the prefix cache's host tier an earlier engine of this model left (`Engine.host_tier`): its
        conversations resume from it. Its size must be the options' host_kv_mib and host_state_slots."""
        report = progress or (lambda fraction: None)  # called on the loading thread
        artifact = read_artifact(path)
        report(LOAD_PROGRESS["header"])
        native = _engine.Engine(str(path), _native_options(options), host_tier)
        report(LOAD_PROGRESS["weights"])
        self.options = options
        try:
            self.frontend = Frontend(artifact.frontend, native.eos_token_ids, vision=options.vision,
                                     media_limits=options.media_limits)
        except errors.ArtifactError as exc:
            native.close()  # its memory now, not at garbage collection
            raise errors.ArtifactError(f"{path}: {exc}") from None
        report(LOAD_PROGRESS["tokenizer"])
        config = artifact.config
        self.info = ModelInfo(
            path=str(path), arch=config["arch"], max_context=options.max_context, vocab_size=config["vocab_size"],
            num_layers=config["num_layers"], hidden_size=config["hidden_size"],
            modalities=("text", "image", "video") if options.vision else ("text",),
            kv_dtype=options.kv_dtype, max_concurrency=options.max_concurrency,
            artifact_bytes=Path(path).stat().st_size,
            encoding={"recipe": artifact.recipe.get("name"),
                      "tensors": dict(Counter(t["encoding"] for t in artifact.tensors))})
        # Told of each request the engine refused or ended with an error: (error, whether it had started, i.e.
        # produced an event first). The router records the server-side ones for the dashboard.
        self.on_failure: Callable[[errors.NinferError, bool], None] | None = None
        self._native = native
        self._pump = _EventPump(native)
        self._finalizer = weakref.finalize(self, _EventPump.close, self._pump)

    @property
    def _closed(self) -> bool:
        return self._pump.closed

    @property
    def host_tier(self) -> _engine.HostTier | None:
        """The prefix cache's host tier (None without one). `close()` leaves the prefix cache in it: handed to the
        next engine of the same model, it resumes from there."""
        return self._native.host_tier

    @classmethod
    def open_sync(cls, path: str | Path, options: EngineOptions | None = None) -> Engine:
        return cls(path, options or EngineOptions())

    @classmethod
    async def open(cls, path: str | Path, options: EngineOptions | None = None,
                   progress: Callable[[float], None] | None = None,
                   host_tier: _engine.HostTier | None = None) -> Engine:
        """Loads in a worker thread so the event loop keeps running; `progress(fraction)` is called on that thread
        after each step of the load (LOAD_PROGRESS). `host_tier`: see `Engine()`."""
        return await asyncio.to_thread(cls, path, options or EngineOptions(), progress, host_tier)

    def submit(self, request: Request, *, observer: GenerationObserver | None = None,
               on_cancel_freed: Callable[[float], None] | None = None) -> RequestStream:
        """Queues a request from inside a running event loop and returns its event stream. What the engine refuses
        at admission (a full queue: EngineBusyError; a request that can never fit: CapacityError; an invalid value:
        EngineError) is raised here, before any event. `observer` is told of the request's events as they are read;
        `on_cancel_freed`: see `generate`."""
        return self.submit_choices(request, 1, observers=[observer], on_cancel_freed=[on_cancel_freed])[0]

    def submit_choices(self, request: Request, n: int, *,
                       constraints: Sequence[TokenConstraint | None] | None = None,
                       observers: Sequence[GenerationObserver | None] | None = None,
                       on_cancel_freed: Sequence[Callable[[float], None] | None] | None = None
                       ) -> list[RequestStream]:
        """`n` continuations of one prompt (OpenAI's `n`), as `submit` queues one: the engine prefills the prompt
        once and forks it, and choice i samples as the request alone would with seed `seed + i` (unseeded: a seed of
        its own). They take n lanes at once, admitted together. A token constraint keeps state, so each choice
        needs its own: `constraints` (one per choice, replacing `request.constraint`). `observers` and
        `on_cancel_freed`: one per choice, as `submit` takes them. Cancelling the first choice before the prompt
        is in cancels them all (the others wait for its prefill)."""
        if self._closed:
            raise errors.EngineError("the engine is closed")
        observers = list(observers) if observers is not None else [None] * n
        freed = list(on_cancel_freed) if on_cancel_freed is not None else [None] * n
        try:
            if constraints is None:
                if n > 1 and request.constraint is not None:
                    raise errors.EngineError("a token constraint keeps state: give each of the n choices its own")
                constraints = [request.constraint] * n
            if not len(constraints) == len(observers) == len(freed) == n:
                raise errors.EngineError(f"n = {n} choices need {n} constraints, observers and on_cancel_freed")
            if any(c is not None for c in constraints) and any(c is None for c in constraints):
                raise errors.EngineError("either every choice has a token constraint or none has")
            native = _native_request(replace(request, constraint=constraints[0]), self.frontend.eos_token_ids,
                                     self.info.vocab_size)
            native.choices = n
            queues: list[asyncio.Queue] = [asyncio.Queue() for _ in range(n)]
            pump = self._pump
            loop = asyncio.get_running_loop()
            with pump.lock:
                first_id = self._native.submit(native)
                for i, (queue, constraint) in enumerate(zip(queues, constraints, strict=True)):
                    pump.routes[first_id + i] = (loop, queue)
                    if constraint is not None:
                        pump.constraints[first_id + i] = (constraint, np.zeros((1, pump.mask_words), dtype=np.uint32))
        except errors.NinferError as exc:
            self._report_failure(exc, started=False)
            for observer in observers:
                if observer is not None:
                    observer.released()
                    observer.ended()
            raise
        streams = []
        for i, (queue, observer, watcher) in enumerate(zip(queues, observers, freed, strict=True)):
            if observer is not None:
                observer.submitted(first_id + i)
            streams.append(RequestStream(self, first_id + i, queue, observer, watcher))
        return streams

    def _report_failure(self, exc: errors.NinferError, *, started: bool) -> None:
        if self.on_failure is not None:
            self.on_failure(exc, started)

    async def generate(self, request: Request, on_cancel_freed: Callable[[float], None] | None = None
                       ) -> AsyncIterator[GenerationEvent]:
        """Streams the request's events (submitted at the first step: use `submit` to have admission errors at
        once). Leaving the loop early (or being cancelled) cancels the request; then `on_cancel_freed`, if given, is
        called on the pump thread with the `time.perf_counter()` at which the engine's final event arrived, i.e. its
        lane (or queue place) was free (the server times disconnects so)."""
        stream = self.submit(request, on_cancel_freed=on_cancel_freed)
        try:
            async for event in stream:
                yield event
        finally:
            await stream.aclose()

    def cancel(self, request_id: int) -> bool:
        """Ends a queued or running request; its lane and KV are free by the time its last event arrives."""
        return bool(self._native.cancel(request_id)) if not self._closed else False

    async def score(self, token_ids: Sequence[int]) -> list[float]:
        """logprob of token i given tokens[:i], for i = 1 .. n - 1."""
        return await asyncio.to_thread(self.score_sync, token_ids)

    def score_sync(self, token_ids: Sequence[int]) -> list[float]:
        if self._closed:
            raise errors.EngineError("the engine is closed")
        return list(self._native.score(list(token_ids)))

    async def decide(self, context: Sequence[int], questions: Sequence[tuple[Sequence[int], Sequence[int]]]
                     ) -> list[list[float]]:
        """A decision job: `context` prefilled once and forked per question; each question `(suffix, candidates)`
        answers the log-softmax over its candidate tokens at its suffix's last token (lm-head rows of the candidates
        only). Cancelling the caller cancels the job, which frees its lane, rows and pages."""
        if self._closed:
            raise errors.EngineError("the engine is closed")
        native = _engine.DecisionRequest()
        native.context = list(context)
        rows = []
        for suffix, candidates in questions:
            q = _engine.DecisionQuestion()
            q.suffix, q.candidates = list(suffix), list(candidates)
            rows.append(q)
        native.questions = rows
        queue: asyncio.Queue = asyncio.Queue()
        pump = self._pump
        with pump.lock:
            request_id = self._native.submit_decision(native)
            pump.routes[request_id] = (asyncio.get_running_loop(), queue)
        finished = False
        try:
            ev = await queue.get()
            finished = True
            if ev.finish == "error":
                raise _error(ev.error_type, ev.error_message)
            if ev.finish != "stop":
                raise errors.EngineError(f"the decision ended without answers ({ev.finish})")
            return [list(lp) for lp in ev.decision_logprobs]
        finally:
            with pump.lock:
                pump.routes.pop(request_id, None)
            if not finished:
                self.cancel(request_id)

    def memory_plan(self) -> dict[str, Any]:
        """The device memory plan in bytes (weights, kv_pool, gdn_states, workspace, headroom), the KV capacity,
        the CUDA graphs' measured bytes, count and replays, and a one-line `summary`; backend "cpu": host memory."""
        return dict(self._native.memory_plan())

    def stats(self) -> EngineStats:
        s = self._native.stats()
        return EngineStats(s.lanes, s.busy_lanes, s.queued, s.kv_capacity_tokens, s.kv_free_tokens,
                           s.free_state_slots, s.requests_finished, s.tokens_generated, s.tokens_prefilled,
                           s.resident_bytes, s.draft_tokens, s.draft_tokens_accepted, s.decision_lanes,
                           s.busy_decision_lanes, s.forward_passes,
                           PrefixCacheStats(s.cached_blocks, s.cached_snapshots, s.total_state_slots, s.prefix_lookups,
                                            s.prefix_hits, s.prefix_cached_tokens, s.prefix_restores,
                                            s.prefix_evicted_blocks, s.prefix_evicted_snapshots,
                                            **{f: getattr(s, f) for f in _HOST_TIER_FIELDS}))

    def close(self) -> None:
        """Ends every request (`cancelled`), stops the threads and frees the model. Idempotent."""
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
