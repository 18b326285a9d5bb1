"""The protocol-independent generation pipeline that every generation route translates.

    prompt (chat messages or text or token ids) -> tokens -> engine.generate -> text -> stop strings
        -> reasoning split -> tool-call parsing -> Deltas; then one GenerationResult

API (protocol modules use only this):

    prompt = await prepare_prompt(model, ChatPrompt(messages, tools=..., enable_thinking=..., ...))   # or TextPrompt
        PreparedPrompt(token_ids, text, starts_in_reasoning, is_chat); raises EngineError (400) on template refusal.
    gen = start_generation(model, prompt, GenerationParams(max_tokens=..., stop=[...], ...), tools=..., call=...)
        Checks the context (ContextOverflowError), builds the engine Request from the request's sampling values over
        the artifact's defaults, and submits it (Engine.submit): a full queue raises EngineBusyError *here*, before
        any response is started, so a route can still answer 429. `call` (ninfer.serve.calls) follows the engine
        request for /slots and control.
    async for delta in gen.deltas():        # Delta(content, reasoning, tool_calls, logprobs), in output order
        ...
    gen.result                              # GenerationResult, complete once deltas() is exhausted
    result = await gen.run()                # non-streaming: drains deltas() and returns the result

    gens = start_generations(model, prompt, GenerationParams(n=3, ...), ...)    # n > 1 (OpenAI's `n`)
        One engine request of n choices (Engine.submit_choices: one prefill, forked), a Generation each.
    async for index, delta in merged_deltas(gens):   # every choice's deltas as they come; delta None: it finished
        ...
    combined_usage(results)                 # the prompt counted once, the completions summed

Leaving `deltas()` early (or cancelling the task running it) cancels the engine request: close the iterator
explicitly (`aclose`, or `ninfer.serve.sse`, which does) so the lane is freed at once rather than at garbage
collection.

Semantics the protocols share:
- `finish_reason` is `stop` (end-of-sequence token or a stop string; `stop_string` says which), `length`
  (max_tokens or the context), or `cancelled`. A protocol turns `stop` with tool calls into its own
  `tool_calls` / `tool_use`.
- Reasoning is split only for chat prompts (and not when `GenerationParams.split_reasoning` is False); tool calls
  are parsed only when `tools` is given. A tool call written inside the reasoning ends it and is returned as a call.
- Stop strings apply to the raw generated text (reasoning included), matched across token boundaries.
- `usage.reasoning_tokens` counts tokens generated while the reasoning block was open.
- With `GenerationParams.report_progress`, the first Deltas carry only `progress` (PrefillProgress), one per
  prefill chunk, the last with every prompt token processed; they count nothing and end nothing.
- Logprobs ride on the first delta emitted after the tokens arrive (text can be held back by the stop-string and
  tag matchers); every generated token up to the end (or the stop string) is reported exactly once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from ninfer.engine import (
    Engine,
    GenerationEvent,
    PrefillProgress,
    Request,
    RequestStream,
    SamplingParams,
    Timings,
    TokenConstraint,
)
from ninfer.errors import MediaError
from ninfer.frontend.chat_media import MediaPart, extract_media
from ninfer.frontend.reasoning import ReasoningDelta, ReasoningParser
from ninfer.frontend.stop_strings import StopStringMatcher
from ninfer.frontend.text import TextStream
from ninfer.frontend.tool_calls import (
    ContentDelta,
    ParseIssue,
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    tool_name_problem,
)
from ninfer.frontend.vision_prompt import PromptMedia
from ninfer.serve.disconnect import departure
from ninfer.serve.errors import ContextOverflowError, InvalidRequestError, TextOverflowError
from ninfer.serve.fields import MAX_TOP_LOGPROBS
from ninfer.serve.structured import check_schema

if TYPE_CHECKING:
    from ninfer.serve.calls import Call


class ServedModel(Protocol):
    """What the pipeline needs of a served model (`ninfer.serve.state.ServedModel` is the real one)."""

    engine: Engine
    preserve_thinking: bool | None
    default_max_tokens: int | None  # for a request that names none; None: to the end of the context

    def sampling_defaults(self, *, thinking: bool) -> SamplingParams: ...

    def record_generation(self, result: GenerationResult) -> None: ...

    def record_disconnect_release(self, seconds: float) -> None: ...


@dataclass(frozen=True)
class ChatPrompt:
    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]] | None = None  # the request's tools (chat form), all of them checked
    hide_tools: bool = False  # tool_choice none: the template is not given them, and no call is parsed
    add_generation_prompt: bool = True
    continue_final_message: bool | None = None  # None: continue a final text-only assistant message
    enable_thinking: bool | None = None  # None: the template's default (on for Qwen3.5)
    reasoning_effort: str | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None

    @property
    def shown_tools(self) -> Sequence[Mapping[str, Any]] | None:
        """The tools given to the template and to the tool-call parser."""
        return None if self.hide_tools else self.tools


@dataclass(frozen=True)
class TextPrompt:
    text: str | None = None
    token_ids: Sequence[int] | None = None  # exactly one of text / token_ids


@dataclass(frozen=True)
class PreparedPrompt:
    token_ids: list[int]
    text: str | None  # None for a prompt given as token ids
    starts_in_reasoning: bool
    is_chat: bool
    media: PromptMedia | None = None  # the images / videos behind the prompt's vision placeholders


def sampling_overrides(**values: Any) -> dict[str, Any]:
    """The sampling values a request sets, by SamplingParams' field names (None: not set, the model's default
    applies). A name SamplingParams does not have is a bug of the caller: TypeError."""
    unknown = values.keys() - SamplingParams.__dataclass_fields__.keys()
    if unknown:
        raise TypeError(f"not SamplingParams fields: {', '.join(sorted(unknown))}")
    return {name: value for name, value in values.items() if value is not None}


@dataclass(frozen=True)
class GenerationParams:
    """What a request asks of one generation; what it leaves out is the model's default."""

    max_tokens: int | None = None  # None: the model's default; UNTIL_CONTEXT_END: up to the end of the context
    # SamplingParams' fields the request sets (`sampling_overrides`), over the model's defaults. `order` is a
    # sequence of stage names; DRY's breakers are given as strings, below, and become token ids here.
    sampling: Mapping[str, Any] = field(default_factory=dict)
    dry_sequence_breakers: Sequence[str] | None = None  # None: DRY_SEQUENCE_BREAKERS
    stop: Sequence[str] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    split_reasoning: bool = True
    constraint: TokenConstraint | None = None  # structured output: the per-step token mask (one request only)
    report_progress: bool = False  # a progress-only Delta after each prefill chunk (llama.cpp's return_progress)
    n: int = 1  # choices: continuations of one prefill (start_generations)
    # n > 1 with a constraint: choices 1 .. n - 1's own (a constraint keeps state); `constraint` is choice 0's
    choice_constraints: tuple[TokenConstraint, ...] = ()


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    bytes: list[int]
    top: tuple[tuple[str, float, list[int]], ...] = ()


@dataclass(frozen=True)
class Delta:
    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    progress: PrefillProgress | None = None  # a prefill progress report: no other field is set


@dataclass(frozen=True)
class GenerationUsage:
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reasoning_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class GenerationResult:
    content: str
    reasoning: str
    tool_calls: list[ToolCall]
    tool_issues: list[ParseIssue]
    finish_reason: str  # stop | length | cancelled
    stop_string: str | None
    usage: GenerationUsage
    timings: Timings
    logprobs: list[TokenLogprob] = field(default_factory=list)


UNTIL_CONTEXT_END = -1  # max_tokens of a request that asks for no limit (llama.cpp's -1)
# llama.cpp's default DRY sequence breakers: a repeat does not extend across a token that contains one.
DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")


# How many characters of text one token can cover at most, times this slack, bounds a text's token count from
# below without tokenizing it: a tokenizer's normalizer can fold a few characters into one (NFKC, combining marks),
# which the longest vocabulary entry alone does not account for.
NORMALIZATION_SLACK = 4


async def prepare_prompt(model: ServedModel, prompt: ChatPrompt | TextPrompt) -> PreparedPrompt:
    """Renders and tokenizes a prompt with the model's own template and tokenizer, off the event loop (a long
    prompt takes the CPU for seconds, which would delay every other request and stream). A text whose length alone
    proves it cannot fit the context is refused before it is tokenized (TextOverflowError)."""
    frontend = model.engine.frontend
    n_ctx = model.engine.info.max_context
    if isinstance(prompt, TextPrompt):
        if prompt.token_ids is not None:
            return PreparedPrompt(list(prompt.token_ids), None, False, is_chat=False)
        text = prompt.text or ""
        _refuse_overlong_text(len(text), frontend.max_token_chars, n_ctx)
        return PreparedPrompt(await asyncio.to_thread(frontend.encode, text), text, False, is_chat=False)
    # Off the event loop too: a tool's schema is compiled to check it, and a large one takes seconds; the media
    # are looked for in every content part, which can be hundreds of thousands.
    messages, media_parts = await asyncio.to_thread(_checked_media, prompt)
    if media_parts and frontend.vision is None:
        raise MediaError(media_parts[0].part, "this server runs without the vision tower: images and video "
                                              "need ninfer-serve --vision")
    rendered = await asyncio.to_thread(
        frontend.render,
        messages,
        tools=prompt.shown_tools or None,
        add_generation_prompt=prompt.add_generation_prompt,
        continue_final_message=prompt.continue_final_message,
        enable_thinking=prompt.enable_thinking,
        preserve_thinking=model.preserve_thinking,
        reasoning_effort=prompt.reasoning_effort,
        chat_template_kwargs=prompt.chat_template_kwargs,
    )
    _refuse_overlong_text(len(rendered.text), frontend.max_token_chars, n_ctx)
    if media_parts:
        token_ids, media = await asyncio.to_thread(frontend.encode_with_media, rendered.text, media_parts)
        return PreparedPrompt(token_ids, rendered.text, rendered.starts_in_reasoning, is_chat=True, media=media)
    token_ids = await asyncio.to_thread(frontend.encode, rendered.text)
    return PreparedPrompt(token_ids, rendered.text, rendered.starts_in_reasoning, is_chat=True)


def _refuse_overlong_text(n_chars: int, max_token_chars: int, n_ctx: int) -> None:
    at_least = n_chars // (max_token_chars * NORMALIZATION_SLACK)
    if at_least >= n_ctx:
        raise TextOverflowError(n_chars, at_least, n_ctx)


def _checked_media(prompt: ChatPrompt) -> tuple[list[dict[str, Any]], list[MediaPart]]:
    """The prompt's tools checked (_check_tools), then its messages and media parts (extract_media)."""
    _check_tools(prompt.tools or ())
    return extract_media(prompt.messages)


def _check_tools(tools: Sequence[Mapping[str, Any]]) -> None:
    """400 for a tool whose name no call could carry (the parsers would give such a call back as plain text), and
    for parameters that are not a JSON Schema structured output would accept (the same check as response_format's:
    a schema the model is shown must be one the server could hold it to)."""
    for index, tool in enumerate(tools):
        function = tool.get("function") or {}
        name = function.get("name")
        problem = tool_name_problem(name) if isinstance(name, str) else None
        if problem:
            shown = name if len(name) <= 40 else name[:40] + "..."
            raise InvalidRequestError(f"tool {index}'s name {shown!r} {problem}", param="tools")
        if "parameters" in function:
            check_schema(function["parameters"], f"tools[{index}].parameters")


def _sampling(model: ServedModel, prompt: PreparedPrompt, params: GenerationParams) -> SamplingParams:
    """The request's sampling values over the model's defaults (DRY's breakers still the defaults' token ids)."""
    defaults = model.sampling_defaults(thinking=prompt.starts_in_reasoning or not prompt.is_chat)
    chosen = dict(params.sampling)
    if "order" in chosen:
        chosen["order"] = tuple(chosen["order"])
    return replace(defaults, **chosen)


def dry_breakers(model: ServedModel, prompt: PreparedPrompt, params: GenerationParams) -> tuple[str, ...] | None:
    """DRY's sequence breakers when the request samples with DRY, else None. Their token ids come from a scan of
    the whole vocabulary (Frontend.tokens_containing: ~0.5 s for 64 breakers, 0.9 s the first time a model is
    asked), so ninfer.serve.answer.prepare makes it in a worker thread and build_request finds it cached."""
    if _sampling(model, prompt, params).dry_multiplier <= 0:
        return None
    return tuple(DRY_SEQUENCE_BREAKERS if params.dry_sequence_breakers is None else params.dry_sequence_breakers)


def build_request(model: ServedModel, prompt: PreparedPrompt, params: GenerationParams) -> Request:
    """The engine Request: sampling values from the request over the artifact's defaults, max tokens capped by
    the context. Raises ContextOverflowError when the prompt leaves no room."""
    engine = model.engine
    n_ctx = engine.info.max_context
    n_prompt = len(prompt.token_ids)
    if n_prompt == 0:
        raise InvalidRequestError("the prompt is empty", param="prompt")
    if n_prompt >= n_ctx:
        raise ContextOverflowError(n_prompt, n_ctx)
    room = n_ctx - n_prompt
    wanted = model.default_max_tokens if params.max_tokens is None else params.max_tokens
    max_new = room if wanted is None or wanted == UNTIL_CONTEXT_END else min(wanted, room)
    if max_new < 1:
        raise InvalidRequestError(
            f"max_tokens must be at least 1, got {params.max_tokens}", param="max_tokens"
        )
    if not 0 <= params.top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidRequestError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs")
    sampling = _sampling(model, prompt, params)
    breakers = dry_breakers(model, prompt, params)
    if breakers is not None:  # (prepare has scanned the vocabulary for them, off the event loop: cached)
        sampling = replace(sampling, dry_breakers=engine.frontend.tokens_containing(breakers))
    return Request(
        prompt.token_ids,
        sampling,
        max_new_tokens=max_new,
        logprobs=params.logprobs or params.top_logprobs > 0,
        top_logprobs=params.top_logprobs,
        constraint=params.constraint,
        report_progress=params.report_progress,
        media=prompt.media,
    )


@dataclass(frozen=True)
class LiveTimings:
    """A running generation's figures so far (what llama.cpp's per-chunk `timings` report)."""

    prompt_tokens: int
    completion_tokens: int
    ttft_s: float  # submit -> first token (0 before it)
    decode_s: float  # first token -> now


class Generation:
    """One running generation. Create with `start_generation`."""

    def __init__(
        self,
        model: ServedModel,
        prompt: PreparedPrompt,
        request: Request,
        params: GenerationParams,
        tools: Sequence[Mapping[str, Any]] | None,
    ) -> None:
        self.prompt = prompt
        self._model = model
        self._engine = model.engine
        self._departure = departure()
        self._loop = asyncio.get_running_loop()
        self._events: RequestStream | None = None  # start_generations submits
        self.choice = 0  # its index among the request's n choices
        self._text = TextStream(self._engine.frontend)
        self._stops = StopStringMatcher(params.stop)
        splitting = prompt.is_chat and params.split_reasoning
        self._reasoning = (
            ReasoningParser(starts_in_reasoning=prompt.starts_in_reasoning) if splitting else None
        )
        self._tools = ToolCallParser(tools) if tools else None
        self._content: list[str] = []
        self._reasoning_text: list[str] = []
        self._logprobs: list[TokenLogprob] = []
        self._pending_logprobs: list[TokenLogprob] = []
        self._completion_tokens = 0
        self._reasoning_tokens = 0
        self._started = time.perf_counter()
        self._first_token_at: float | None = None
        self.result: GenerationResult | None = None

    def _lane_freed(self, freed_at: float) -> None:
        """The engine's pump thread: the cancelled request's lane is free. If its client's departure caused that,
        the time since the server saw the disconnect is recorded (on the event loop's thread)."""
        left_at = self._departure.at if self._departure is not None else None
        if left_at is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._model.record_disconnect_release, freed_at - left_at)
        except RuntimeError:  # the loop is closed: the server is gone
            pass

    async def deltas(self) -> AsyncIterator[Delta]:
        last: GenerationEvent | None = None
        events = self._events
        assert events is not None, "start_generations submits the generation"
        try:
            async for event in events:
                if event.progress is not None:
                    yield Delta(progress=event.progress)
                    continue
                last = event
                if self._stops.stopped is not None:
                    continue  # draining after a stop string: the final event still brings usage and timings
                self._count_tokens(event)
                for delta in self._step_text(self._text.push(event.token_ids), final=False):
                    yield delta
                if self._stops.stopped is not None and event.finish_reason is None:
                    self._engine.cancel(event.request_id)
        finally:
            await events.aclose()
        for delta in self._step_text("", final=True):
            yield delta
        engine_finish = last.finish_reason if last is not None else None
        finish_reason = "stop" if self._stops.stopped is not None else engine_finish or "cancelled"
        self.result = self._finish(finish_reason, last)
        # The metrics count a request's prompt once: with its first choice.
        usage = self.result.usage if self.choice == 0 else replace(self.result.usage, prompt_tokens=0, cached_tokens=0)
        self._model.record_generation(replace(self.result, usage=usage))

    async def run(self) -> GenerationResult:
        async for _ in self.deltas():
            pass
        assert self.result is not None
        return self.result

    def so_far(self) -> LiveTimings:
        first = self._first_token_at
        if first is None:
            return LiveTimings(len(self.prompt.token_ids), 0, 0.0, 0.0)
        return LiveTimings(len(self.prompt.token_ids), self._completion_tokens, first - self._started,
                           time.perf_counter() - first)

    # -- steps ----------------------------------------------------------------------------------------------

    def _count_tokens(self, event: GenerationEvent) -> None:
        """Counts the event's tokens (as reasoning while the block is open) and keeps their logprobs."""
        if event.token_ids and self._first_token_at is None:
            self._first_token_at = time.perf_counter()
        if self._reasoning is not None and self._reasoning.in_reasoning:
            self._reasoning_tokens += len(event.token_ids)
        self._completion_tokens += len(event.token_ids)
        if event.logprobs is not None:
            self._pending_logprobs.extend(self._token_logprobs(event))

    def _step_text(self, piece: str, *, final: bool) -> list[Delta]:
        """Text through stop strings, the reasoning split and the tool-call parser; `final` settles what each
        stage holds back."""
        text = self._stops.feed(piece).text if piece else ""
        if final:
            text += self._stops.flush()
        reasoning, content = "", text
        if self._reasoning is not None:
            split = self._reasoning.feed(text)
            if final:
                tail = self._reasoning.finish()
                split = ReasoningDelta(split.reasoning + tail.reasoning, split.content + tail.content)
            reasoning, content = split.reasoning, split.content
        tool_events: list[ContentDelta | ToolCallDelta] = []
        if self._tools is not None:
            tool_events = self._tools.feed(content) if content else []
            if final:
                tool_events += self._tools.finish()
        else:
            tool_events = [ContentDelta(content)] if content else []
        return self._deltas(reasoning, tool_events, final)

    def _deltas(self, reasoning: str, events: list[ContentDelta | ToolCallDelta], final: bool) -> list[Delta]:
        """Groups the step's output into Deltas, in order; pending logprobs ride on the first one."""
        out: list[Delta] = []
        if reasoning:
            self._reasoning_text.append(reasoning)
            out.append(Delta(reasoning=reasoning))
        calls: list[ToolCallDelta] = []
        for event in events:
            if isinstance(event, ToolCallDelta):
                calls.append(event)
                continue
            if calls:
                out.append(Delta(tool_calls=tuple(calls)))
                calls = []
            if event.text:
                self._content.append(event.text)
                out.append(Delta(content=event.text))
        if calls:
            out.append(Delta(tool_calls=tuple(calls)))
        if self._pending_logprobs and (out or final):
            pending = tuple(self._pending_logprobs)
            self._logprobs.extend(pending)
            self._pending_logprobs.clear()
            out = [replace(out[0], logprobs=pending), *out[1:]] if out else [Delta(logprobs=pending)]
        return out

    def _token_logprobs(self, event: GenerationEvent) -> list[TokenLogprob]:
        decode = self._engine.frontend.decode
        result = []
        for i, (token_id, logprob) in enumerate(zip(event.token_ids, event.logprobs or (), strict=False)):
            alternatives = event.top_logprobs[i] if event.top_logprobs is not None else ()
            top = tuple(_piece(decode, alt_id) + (alt_lp,) for alt_id, alt_lp in alternatives)
            text, raw = _piece(decode, token_id)
            result.append(TokenLogprob(text, logprob, raw, tuple((t, lp, b) for t, b, lp in top)))
        return result

    def _finish(self, finish_reason: str, last: GenerationEvent | None) -> GenerationResult:
        now = time.perf_counter()
        engine_usage = last.usage if last is not None else None
        timings = last.timings if last is not None and last.timings is not None else None
        if timings is None:  # ended by a stop string: the engine's final event was not waited for
            ttft = (self._first_token_at or now) - self._started
            decode_s = now - (self._first_token_at or now)
            timings = Timings(
                0.0,
                ttft,
                0.0,
                (self._completion_tokens - 1) / decode_s if decode_s > 0 else 0.0,
                now - self._started,
            )
        tools = self._tools.result() if self._tools is not None else None
        usage = GenerationUsage(
            prompt_tokens=len(self.prompt.token_ids),
            cached_tokens=engine_usage.cached_tokens if engine_usage is not None else 0,
            completion_tokens=self._completion_tokens,
            reasoning_tokens=self._reasoning_tokens,
        )
        return GenerationResult(
            content="".join(self._content),
            reasoning="".join(self._reasoning_text),
            tool_calls=tools.calls if tools else [],
            tool_issues=tools.issues if tools else [],
            finish_reason=finish_reason,
            stop_string=self._stops.stopped,
            usage=usage,
            timings=timings,
            logprobs=self._logprobs,
        )


def _piece(decode: Any, token_id: int) -> tuple[str, list[int]]:
    text = decode([token_id], skip_special_tokens=False)
    return text, list(text.encode("utf-8"))


def start_generation(
    model: ServedModel,
    prompt: PreparedPrompt,
    params: GenerationParams,
    tools: Sequence[Mapping[str, Any]] | None = None,
    call: Call | None = None,
) -> Generation:
    """Validates, builds the engine request and submits it (see the module doc)."""
    return start_generations(model, prompt, replace(params, n=1), tools, call)[0]


def start_generations(
    model: ServedModel,
    prompt: PreparedPrompt,
    params: GenerationParams,
    tools: Sequence[Mapping[str, Any]] | None = None,
    call: Call | None = None,
) -> list[Generation]:
    """`params.n` generations of one engine request: the prompt prefilled once and forked (Engine.submit_choices;
    choice i samples with seed + i). Each choice takes a lane, so n is at most the model's max_concurrency: 400
    above it. Admission errors are raised here, before the route has started any response."""
    engine = model.engine
    n = params.n
    if n > engine.info.max_concurrency:
        raise InvalidRequestError(
            f"n = {n}: this model runs {engine.info.max_concurrency} generations at once (max_concurrency) and a "
            f"request's choices run together, so n can be at most {engine.info.max_concurrency}", param="n")
    request = build_request(model, prompt, params)
    constraints = ([params.constraint, *params.choice_constraints] if params.constraint is not None else [None] * n)
    if len(constraints) != n:
        raise ValueError(f"n = {n} choices with {len(constraints)} constraints")
    generations = [Generation(model, prompt, request, params, tools) for _ in range(n)]
    observers = [call.track(engine, len(request.prompt_tokens), c) for c in constraints] if call else None
    streams = engine.submit_choices(request, n, constraints=constraints, observers=observers,
                                    on_cancel_freed=[g._lane_freed for g in generations])
    for index, (generation, stream) in enumerate(zip(generations, streams, strict=True)):
        generation._events, generation.choice = stream, index
    return generations


async def merged_deltas(generations: Sequence[Generation]) -> AsyncIterator[tuple[int, Delta | None]]:
    """Every generation's deltas as they come, with its index; `(index, None)` once that one has finished (its
    `result` is set). An error of one ends the iteration with it; leaving early (or being cancelled) closes every
    generation's deltas, which cancels their engine requests."""
    if len(generations) == 1:  # no tasks: the one generation's deltas in this task, as a route without n runs them
        async for delta in generations[0].deltas():
            yield 0, delta
        yield 0, None
        return
    queue: asyncio.Queue[tuple[int, Delta | BaseException | None]] = asyncio.Queue()

    async def forward(index: int, generation: Generation) -> None:
        try:
            async for delta in generation.deltas():
                queue.put_nowait((index, delta))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            queue.put_nowait((index, exc))
            return
        queue.put_nowait((index, None))

    tasks = [asyncio.create_task(forward(i, g)) for i, g in enumerate(generations)]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            running -= item is None
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def combined_usage(results: Sequence[GenerationResult]) -> GenerationUsage:
    """The usage of one request's choices: its prompt (and what the cache served of it) once, every choice's
    completion tokens."""
    first = results[0].usage
    return GenerationUsage(prompt_tokens=first.prompt_tokens, cached_tokens=first.cached_tokens,
                           completion_tokens=sum(r.usage.completion_tokens for r in results),
                           reasoning_tokens=sum(r.usage.reasoning_tokens for r in results))
