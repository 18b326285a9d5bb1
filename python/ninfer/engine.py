"""The async engine API over `ninfer._engine` (DESIGN.md, "The Python-facing engine API").

The C++ engine runs its own scheduler thread and queues events. One pump thread here drains them (the GIL is
released while it waits) and hands each to its request's asyncio queue with `call_soon_threadsafe`, so a slow
consumer only lets its own queue grow and never stalls the engine or other requests.

Constrained requests (structured output) carry a `TokenConstraint`. Before such a request samples, the C++ engine
posts a mask request (before the step's forward) and waits, after the forward, for the answer; the pump computes
every mask of the step with one hold of the GIL and hands them back. No Python ever runs on the scheduler thread,
and unconstrained requests never wait for Python.

The pump holds the native engine, never the `Engine`, so an engine nobody closed is still collected; a
`weakref.finalize` closes it then, or at interpreter exit (before Python finalizes, while the pump can still take
the GIL: a daemon thread woken inside a native call after that point aborts the process).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import tokenizers

from ninfer import _engine, errors
from ninfer.artifact.reader import read_artifact
from ninfer.frontend.chat import ChatTemplate, RenderedPrompt

_PUMP_WAIT_S = 0.05
_KV_CAPACITY_AUTO = -1  # the C++ engine's kKvCapacityAuto

# The values the C++ engine accepts for EngineOptions' string fields (configs and CLIs check against these at start).
BACKENDS = ("auto", "cpu", "cuda")
KV_DTYPES = ("bf16", "fp8", "int8", "f32")
CUDA_GEMMS = ("auto", "twin")
SPEC_METHODS = ("none", "mtp")
MAX_DRAFT_TOKENS = 5
OPTION_CHOICES: Mapping[str, tuple[str, ...]] = {
    "backend": BACKENDS, "kv_dtype": KV_DTYPES, "cuda_gemm": CUDA_GEMMS, "spec": SPEC_METHODS,
}


@dataclass(frozen=True)
class EngineOptions:
    backend: str = "auto"  # auto (cuda when a GPU is usable, else cpu) | cpu | cuda
    max_context: int = 4096
    # tokens in the KV pool; None = max_context * max_concurrency; "auto" = the most that fits in device
    # memory after the weights with 1 GiB to spare (CUDA; on the CPU backend as None)
    kv_capacity: int | Literal["auto"] | None = None
    max_concurrency: int = 1  # lanes, 1..8
    max_queue: int = 16  # requests that may wait for a lane
    kv_dtype: str = "bf16"  # f32 | bf16 | fp8 | int8
    # tokens per prefill chunk, a multiple of 64; 0 = auto: 512 on the CPU backend, on CUDA the largest chunk up to
    # 8192 the memory plan allows (memory_plan()["prefill_chunk"] says which). Decoding lanes wait at most one chunk.
    prefill_chunk: int = 0
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


# The sampler's stage names (llama.cpp's), and the order a request that names none runs them in.
SAMPLER_STAGES: tuple[str, ...] = tuple(_engine.SamplerStage.__members__)
DEFAULT_SAMPLER_ORDER: tuple[str, ...] = tuple(stage.name for stage in _engine.sampler_default_order())


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


def _tokenizer(source: Any) -> tokenizers.Tokenizer:
    """The artifact's tokenizer.json; a bad one (its checksum can be valid: the writer's input was bad) is an
    ArtifactError, not the tokenizers library's multi-line exception."""
    if not isinstance(source, str):
        raise errors.ArtifactError(f"the artifact's tokenizer is a {type(source).__name__}, not tokenizer.json text")
    try:
        return tokenizers.Tokenizer.from_str(source)
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises plain Exception for every parse error
        reason = " ".join(str(exc).split())[:200]
        raise errors.ArtifactError(f"the artifact's tokenizer.json is not a valid tokenizer: {reason}") from None


class Frontend:
    """What the artifact says about text: tokenizer, chat template, special tokens and generation defaults."""

    def __init__(self, frontend: Mapping[str, Any], eos_token_ids: Sequence[int]) -> None:
        source = frontend.get("tokenizer_json")
        # Artifacts converted from a checkpoint without a tokenizer take and give token ids only.
        self.tokenizer = None if source is None else _tokenizer(source)
        special = frontend.get("special_tokens") or {}
        self.eos_token_ids: tuple[int, ...] = tuple(special.get("eos") or eos_token_ids)
        self.bos_token_id: int | None = special.get("bos")
        self.generation_defaults: dict[str, Any] = dict(frontend.get("generation_defaults") or {})
        self._token_texts: list[str] | None = None
        self._containing: dict[tuple[str, ...], tuple[int, ...]] = {}
        templates = frontend.get("chat_templates") or {}
        source = templates.get("default")
        self.chat_template = None if source is None else ChatTemplate(
            source, bos_token=self._token_text(self.bos_token_id),
            eos_token=self._token_text(self.eos_token_ids[0] if self.eos_token_ids else None))

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters of text one token can stand for: the longest vocabulary entry (added tokens
        included). Byte-level and metaspace vocabularies spell each token with at least one character per character
        it decodes to, so a text of N characters has at least N / max_token_chars tokens."""
        tokenizer = self._require_tokenizer()
        return max(1, max(len(piece) for piece in tokenizer.get_vocab(with_added_tokens=True)))

    def _token_text(self, token_id: int | None) -> str:
        if token_id is None or self.tokenizer is None:
            return ""
        return self.tokenizer.id_to_token(token_id) or ""

    def _require_tokenizer(self) -> tokenizers.Tokenizer:
        if self.tokenizer is None:
            raise errors.EngineError("this model's artifact has no tokenizer: send token ids")
        return self.tokenizer

    def encode(self, text: str) -> list[int]:
        """Text (a rendered prompt, with its special tokens written out) -> ids; no BOS is added."""
        return self._require_tokenizer().encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._require_tokenizer().decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def tokens_containing(self, pieces: tuple[str, ...]) -> tuple[int, ...]:
        """The ids of the tokens whose text contains one of `pieces` (DRY's sequence breakers), sorted; the
        vocabulary is decoded once per model."""
        if pieces not in self._containing:
            if self._token_texts is None:
                tokenizer = self._require_tokenizer()
                ids = [[i] for i in range(tokenizer.get_vocab_size(with_added_tokens=True))]
                self._token_texts = tokenizer.decode_batch(ids, skip_special_tokens=False)
            self._containing[pieces] = tuple(i for i, text in enumerate(self._token_texts)
                                             if any(piece in text for piece in pieces))
        return self._containing[pieces]

    def render(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> RenderedPrompt:
        """Chat messages -> prompt text through the artifact's template (tools, enable_thinking, ...)."""
        if self.chat_template is None:
            raise errors.EngineError("this model has no chat template; send a plain prompt")
        return self.chat_template.render(messages, **options)


class TextStream:
    """Turns a growing list of token ids into text deltas, holding back an incomplete UTF-8 character.

    Incremental: a step decodes only the tokens since the last delta, together with the tokens of that delta as
    context (a decoder may render a token differently at the start of a text, e.g. a SentencePiece word's leading
    space), so a whole generation costs linear, not quadratic, decoding."""

    def __init__(self, frontend: Frontend) -> None:
        self._frontend = frontend
        self._tokens: list[int] = []
        self._context = 0  # tokens[_context:_emitted] produced the last delta: context for the next decode
        self._emitted = 0  # tokens before this index are in the text already given out

    def push(self, token_ids: Sequence[int]) -> str:
        self._tokens.extend(token_ids)
        # Both windows start where the text was complete (a delta never ends inside a character), so their
        # decodes are a prefix of, and the tail of, the whole text's decode.
        context = self._frontend.decode(self._tokens[self._context:self._emitted])
        text = self._frontend.decode(self._tokens[self._context:])
        if text.endswith("\ufffd") or len(text) <= len(context):
            return ""
        self._context, self._emitted = self._emitted, len(self._tokens)
        return text[len(context):]


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
    native.kv_dtype = options.kv_dtype
    native.prefill_chunk = options.prefill_chunk
    native.threads = options.threads
    native.verify_checksums = options.verify_checksums
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
    native.report_progress = request.report_progress
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
            constraint, mask = entry
            try:
                constrained = constraint.fill_next_mask(tuple(req.new_tokens), mask)
            except Exception as exc:  # noqa: BLE001 - any failure of the constraint ends its request, typed
                self.native.fail_mask(req.request_id, f"the request's token constraint failed: {exc}")
                continue
            self.native.provide_mask(req.request_id, mask if constrained else None)

    def close(self) -> None:
        """Ends every request (`cancelled`), stops the native engine and this thread. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.native.close()  # releases the GIL: a pump waiting for it finishes its round and sees `closed`
        if threading.current_thread() is not self.thread:
            self.thread.join()


# The share of a load done after each of its steps, as `Engine(..., progress=)` reports it. The native loader has no
# progress callback of its own; its one step (mapping the artifact, checking and placing every tensor) is most of a
# load, and building the tokenizer, which takes seconds for large vocabularies, comes after it.
LOAD_PROGRESS = {"header": 0.05, "weights": 0.85, "tokenizer": 0.95}


class Engine:
    """One loaded model. Create with `await Engine.open(...)` (or `Engine.open_sync`); `close()` frees it (so does
    garbage collection, and interpreter exit)."""

    supports_token_constraints = True  # Request.constraint is honoured

    def __init__(self, path: str | Path, options: EngineOptions,
                 progress: Callable[[float], None] | None = None) -> None:
        report = progress or (lambda fraction: None)  # called on the loading thread
        artifact = read_artifact(path)
        report(LOAD_PROGRESS["header"])
        native = _engine.Engine(str(path), _native_options(options))
        report(LOAD_PROGRESS["weights"])
        self.options = options
        try:
            self.frontend = Frontend(artifact.frontend, native.eos_token_ids)
        except errors.ArtifactError as exc:
            native.close()  # its memory now, not at garbage collection
            raise errors.ArtifactError(f"{path}: {exc}") from None
        report(LOAD_PROGRESS["tokenizer"])
        config = artifact.config
        self.info = ModelInfo(
            path=str(path), arch=config["arch"], max_context=options.max_context, vocab_size=config["vocab_size"],
            num_layers=config["num_layers"], hidden_size=config["hidden_size"], modalities=("text",),
            kv_dtype=options.kv_dtype, max_concurrency=options.max_concurrency,
            artifact_bytes=Path(path).stat().st_size,
            encoding={"recipe": artifact.recipe.get("name"),
                      "tensors": dict(Counter(t["encoding"] for t in artifact.tensors))})
        self._native = native
        self._pump = _EventPump(native)
        self._finalizer = weakref.finalize(self, _EventPump.close, self._pump)

    @property
    def _closed(self) -> bool:
        return self._pump.closed

    @classmethod
    def open_sync(cls, path: str | Path, options: EngineOptions | None = None) -> Engine:
        return cls(path, options or EngineOptions())

    @classmethod
    async def open(cls, path: str | Path, options: EngineOptions | None = None,
                   progress: Callable[[float], None] | None = None) -> Engine:
        """Loads in a worker thread so the event loop keeps running; `progress(fraction)` is called on that thread
        after each step of the load (LOAD_PROGRESS)."""
        return await asyncio.to_thread(cls, path, options or EngineOptions(), progress)

    def submit(self, request: Request) -> tuple[int, asyncio.Queue]:
        """Queues a request from inside a running event loop; returns its id and the queue its events reach."""
        if self._closed:
            raise errors.EngineError("the engine is closed")
        native = _native_request(request, self.frontend.eos_token_ids, self.info.vocab_size)
        queue: asyncio.Queue = asyncio.Queue()
        pump = self._pump
        with pump.lock:
            request_id = self._native.submit(native)
            pump.routes[request_id] = (asyncio.get_running_loop(), queue)
            if request.constraint is not None:
                pump.constraints[request_id] = (request.constraint, np.zeros(pump.mask_words, dtype=np.uint32))
        return request_id, queue

    async def generate(self, request: Request, on_cancel_freed: Callable[[float], None] | None = None
                       ) -> AsyncIterator[GenerationEvent]:
        """Streams the request's events. Leaving the loop early (or being cancelled) cancels the request; then
        `on_cancel_freed`, if given, is called on the pump thread with the `time.perf_counter()` at which the
        engine's final event arrived, i.e. its lane (or queue place) was free (the server times disconnects so)."""
        request_id, queue = self.submit(request)
        finished = False
        try:
            while not finished:
                ev = await queue.get()
                finished = ev.finish != "none"
                if ev.finish == "error":
                    raise _error(ev.error_type, ev.error_message)
                yield _event(ev)
        finally:
            pump = self._pump
            with pump.lock:
                pump.routes.pop(request_id, None)
                if not finished and on_cancel_freed is not None:  # before the cancel, whose event may come at once
                    pump.freed_watchers[request_id] = on_cancel_freed
            if not finished and not self.cancel(request_id):
                with pump.lock:  # it had ended already: no final event is coming
                    pump.freed_watchers.pop(request_id, None)

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

    def memory_plan(self) -> dict[str, Any]:
        """The device memory plan in bytes (weights, kv_pool, gdn_states, workspace, headroom), the KV capacity,
        the CUDA graphs' measured bytes, count and replays, and a one-line `summary`; backend "cpu": host memory."""
        return dict(self._native.memory_plan())

    def stats(self) -> EngineStats:
        s = self._native.stats()
        return EngineStats(s.lanes, s.busy_lanes, s.queued, s.kv_capacity_tokens, s.kv_free_tokens,
                           s.free_state_slots, s.requests_finished, s.tokens_generated, s.tokens_prefilled,
                           s.resident_bytes, s.draft_tokens, s.draft_tokens_accepted)

    def close(self) -> None:
        """Ends every request (`cancelled`), stops the threads and frees the model. Idempotent."""
        self._finalizer()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
