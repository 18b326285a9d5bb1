"""OpenAI Chat Completions: `POST /v1/chat/completions` (and llama.cpp's `/chat/completions`).

A thin translator over `ninfer.serve.generation`: the request becomes a ChatPrompt and GenerationParams, the
pipeline's Deltas become `chat.completion.chunk`s, its result a `chat.completion`. Reasoning is returned as
`reasoning_content` (message and delta), as llama.cpp, vLLM and DeepSeek do.

`return_progress: true` (llama.cpp's; llama-ui sends it on every streamed request) streams a chunk per prefill chunk,
before the first token: an empty delta and a top-level `prompt_progress {total, cache, processed, time_ms}`.

`reasoning_control: true` (llama.cpp's, which llama-ui sends) lets `POST /v1/chat/completions/control` end the
generation's reasoning while it runs (ninfer.serve.reasoning_control).

Tool calls: `tool_choice: "none"` hides the tools from the template and does not parse calls. `"required"`, a
named function and `strict: true` are advisory (the engine cannot force a call): the response's `ninfer.tool_choice`
says so, and parse diagnostics (a truncated call, an unknown tool) are in `ninfer.tool_parse_issues`. Custom
(freeform) tools are served through `ninfer.serve.custom_tools`; a streamed custom call arrives whole, in one delta
after the text, since its raw input is known only once the call's arguments are complete.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, post
from litestar.params import JSONBody
from msgspec import Meta

from ninfer.engine import PrefillProgress
from ninfer.frontend.tool_calls import ParseIssue, ToolCallDelta
from ninfer.serve.answer import answer_choices, prepare
from ninfer.serve.custom_tools import ChatTool, call_input, chat_form_tools, chat_history_call
from ninfer.serve.errors import InvalidRequestError
from ninfer.serve.fields import MaxTokens, TopLogprobs
from ninfer.serve.gate import LeaseDependency
from ninfer.serve.generation import (
    ChatPrompt,
    Delta,
    Generation,
    GenerationResult,
    TokenLogprob,
    combined_usage,
    merged_deltas,
)
from ninfer.serve.openai_common import (
    DONE_FRAME,
    ReasoningEffort,
    SamplingFields,
    ToolChoice,
    advisory_tool_choice,
    generation_params,
    include_usage,
    live_timings_json,
    logprob_json,
    new_id,
    stream_error_frame,
    template_role,
    timings_json,
    usage_json,
)
from ninfer.serve.reasoning_control import ReasoningControl
from ninfer.serve.sse import PING_INTERVAL_S, sse_frame, sse_response
from ninfer.serve.structured import ResponseFormat, chat_response_format

ChatRole = Literal["system", "developer", "user", "assistant", "tool"]


# A content part (ninfer.frontend.chat reads them): text, or an image or video, which only a model with the vision
# tower takes (a 400 naming the part otherwise). msgspec types the parts as objects; the document gives each kind's
# fields, and the frontend refuses any other part.
PART_KINDS: list[dict[str, Any]] = [
    {"type": "object", "required": ["type", "text"],
     "properties": {"type": {"enum": ["text", "input_text", "output_text"]}, "text": {"type": "string"}}},
    {"required": ["type"], "properties": {"type": {"enum": ["image_url", "video_url", "input_image"]}}},
    {"required": ["type", "source"], "properties": {"type": {"enum": ["image", "video"]},
                                                    "source": {"type": "object"}}},
    {"required": ["type", "image"], "properties": {"type": {"const": "image"}, "image": {"type": "string"}}},
    {"required": ["type", "video"], "properties": {"type": {"const": "video"}, "video": {"type": "string"}}},
]
ContentPart = Annotated[dict[str, Any], Meta(extra_json_schema={"anyOf": PART_KINDS})]


class ChatMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: ChatRole
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


# A tool message names the call it answers (check_messages also holds it to an earlier assistant message's call,
# which a schema cannot say).
_TOOL_MESSAGE = {"if": {"required": ["role"], "properties": {"role": {"const": "tool"}}},
                 "then": {"required": ["tool_call_id"], "properties": {"tool_call_id": {"type": "string",
                                                                                       "minLength": 1}}}}
ChatMessages = Annotated[list[Annotated[ChatMessage, Meta(extra_json_schema=_TOOL_MESSAGE)]], Meta(min_length=1)]


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: ChatMessages
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    reasoning_effort: ReasoningEffort | None = None
    reasoning_format: str | None = None  # llama.cpp: "none" returns the raw text, reasoning included
    chat_template_kwargs: dict[str, Any] | None = None
    continue_final_message: bool | None = None
    add_generation_prompt: bool | None = None
    reasoning_control: bool = False  # llama.cpp: arms `reasoning_end` through /v1/chat/completions/control
    # llama.cpp: reasoning tokens after which the reasoning is ended (-1: no limit); llama-ui sends the first name
    thinking_budget_tokens: Annotated[int, Meta(ge=-1)] | None = None
    reasoning_budget_tokens: Annotated[int, Meta(ge=-1)] | None = None
    # llama.cpp: seconds between keepalive comments while the stream is silent (-1: none); llama-ui sends 1
    sse_ping_interval: Annotated[float, Meta(ge=-1, le=3600)] | None = None
    return_progress: bool = False  # llama.cpp: streamed `prompt_progress` chunks while the prompt is read
    timings_per_token: bool = False  # llama.cpp: `timings` so far on every streamed chunk (llama-ui sends true)


def _check_messages(messages: Sequence[ChatMessage]) -> None:
    """A tool message answers a call: it names the call's id, which an earlier assistant message made."""
    called: set[str] = set()
    for index, message in enumerate(messages):
        for call in message.tool_calls or ():
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                called.add(call["id"])
        if message.role != "tool":
            continue
        if not message.tool_call_id:
            raise InvalidRequestError(f"messages[{index}]: a tool message needs the tool_call_id it answers",
                                      param=f"messages[{index}].tool_call_id")
        if message.tool_call_id not in called:
            raise InvalidRequestError(
                f"messages[{index}].tool_call_id {message.tool_call_id!r} answers no tool call of an earlier "
                "assistant message", param=f"messages[{index}].tool_call_id")


def _chat_prompt(body: ChatCompletionRequest) -> ChatPrompt:
    if body.top_logprobs and body.logprobs is not True:
        raise InvalidRequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    kwargs = dict(body.chat_template_kwargs or {})
    enable_thinking = kwargs.pop("enable_thinking", None)
    if body.reasoning_effort == "none":
        enable_thinking = False
    return ChatPrompt(
        messages=template_messages(body.messages),
        tools=_tools(body),
        hide_tools=body.tool_choice == "none",
        add_generation_prompt=body.add_generation_prompt if body.add_generation_prompt is not None else True,
        continue_final_message=body.continue_final_message,
        enable_thinking=enable_thinking if isinstance(enable_thinking, bool) else None,
        reasoning_effort=body.reasoning_effort if body.reasoning_effort != "none" else None,
        chat_template_kwargs=kwargs or None,
    )


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Chat messages as the chat template takes them, checked (the same for a generation and for
    `/apply-template`)."""
    _check_messages(messages)
    return [_template_message(msgspec.to_builtins(m)) for m in messages]


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    message["role"] = template_role(message["role"])
    if message.get("tool_calls"):
        message["tool_calls"] = [chat_history_call(c) for c in message["tool_calls"]]
        # SDKs send `content: null` next to tool calls; templates concatenate the content as text.
        message.setdefault("content", "")
    return message


def _tools(body: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    return chat_form_tools(body.tools)[0] if body.tools else None


def _tool_choice_note(body: ChatCompletionRequest) -> dict[str, Any] | None:
    """What the response says about tool_choice and strict, which the engine cannot enforce."""
    strict = any(
        isinstance(t.get("function"), dict) and t["function"].get("strict") for t in body.tools or ()
    )
    forcing = body.tool_choice == "required" or isinstance(body.tool_choice, dict)
    return advisory_tool_choice(body.tool_choice, forcing=forcing, strict=strict)


def _issues_json(issues: list[ParseIssue]) -> list[dict[str, Any]]:
    return [
        {"kind": i.kind, "message": i.message, "snippet": i.snippet, "discarded_chars": i.discarded_chars}
        for i in issues
    ]


def _finish_reason(result: GenerationResult) -> str:
    if result.tool_calls and result.finish_reason == "stop":
        return "tool_calls"
    return result.finish_reason


class _Shape:
    """The ids and fields every chunk and the final object of one completion share."""

    def __init__(self, body: ChatCompletionRequest, model_id: str) -> None:
        self.id = new_id("chatcmpl")
        self.created = int(time.time())
        self.model = model_id
        self.tool_call_ids: dict[int, str] = {}
        self.tool_note = _tool_choice_note(body)
        self.custom_tools = chat_form_tools(body.tools or ())[1]
        self.streamed_custom_calls: set[int] = set()  # their deltas are held back, see _custom_call_chunk
        self.index = 0  # the choice's

    def choices(self, n: int) -> list[_Shape]:
        """One shape per choice (n > 1): the completion's id and fields, each choice's index and tool-call ids."""
        shapes = [self]
        for index in range(1, n):
            shape = copy.copy(self)
            shape.index, shape.tool_call_ids, shape.streamed_custom_calls = index, {}, set()
            shapes.append(shape)
        return shapes

    def tool_call_json(self, index: int, name: str, arguments: str) -> dict[str, Any]:
        if name in self.custom_tools:
            return {
                "id": self.call_id(index),
                "type": "custom",
                "custom": {"name": name, "input": call_input(arguments)},
            }
        return {
            "id": self.call_id(index),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    def call_id(self, index: int) -> str:
        return self.tool_call_ids.setdefault(index, new_id("call"))

    def envelope(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "ninfer",
        }

    def extras(self, result: GenerationResult) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.tool_note is not None:
            extra["tool_choice"] = self.tool_note
        if result.tool_issues:
            extra["tool_parse_issues"] = _issues_json(result.tool_issues)
        return {"ninfer": extra} if extra else {}


def _message(shape: _Shape, result: GenerationResult) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.content or None}
    if result.tool_calls:
        message["tool_calls"] = [
            shape.tool_call_json(i, c.name, c.arguments) for i, c in enumerate(result.tool_calls)
        ]
    elif message["content"] is None:
        message["content"] = ""
    if result.reasoning:
        message["reasoning_content"] = result.reasoning
    return message


def completion_json(shapes: list[_Shape], results: list[GenerationResult], logprobs: bool) -> dict[str, Any]:
    """The completion of every choice (their usage combined; timings and extras are the first choice's)."""
    choices = [{
        "index": shape.index,
        "message": _message(shape, result),
        "finish_reason": _finish_reason(result),
        "logprobs": {"content": [logprob_json(lp) for lp in result.logprobs]} if logprobs else None,
    } for shape, result in zip(shapes, results, strict=True)]
    return {
        **shapes[0].envelope("chat.completion"),
        "choices": choices,
        "usage": usage_json(combined_usage(results)),
        "timings": timings_json(results[0]),
        **shapes[0].extras(results[0]),
    }


def _tool_call_delta(shape: _Shape, call: ToolCallDelta) -> dict[str, Any] | None:
    if call.name in shape.custom_tools:
        shape.streamed_custom_calls.add(call.index)
    if call.index in shape.streamed_custom_calls:
        return None
    if call.name is not None:
        return {
            "index": call.index,
            "id": shape.call_id(call.index),
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
    return {"index": call.index, "function": {"arguments": call.arguments}}


def _delta_json(shape: _Shape, delta: Delta) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if delta.reasoning:
        out["reasoning_content"] = delta.reasoning
    if delta.content:
        out["content"] = delta.content
    if delta.tool_calls:
        calls = [d for d in (_tool_call_delta(shape, c) for c in delta.tool_calls) if d is not None]
        if calls:
            out["tool_calls"] = calls
    return out


def _custom_call_chunk(shape: _Shape, result: GenerationResult) -> dict[str, Any] | None:
    """The streamed custom calls, whole, from the finished result."""
    calls = [
        {"index": i, **shape.tool_call_json(i, c.name, c.arguments)}
        for i, c in enumerate(result.tool_calls)
        if i in shape.streamed_custom_calls
    ]
    return _chunk(shape, {"tool_calls": calls}) if calls else None


def _chunk(
    shape: _Shape,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    logprobs: list[TokenLogprob] | None = None,
) -> dict[str, Any]:
    choice = {
        "index": shape.index,
        "delta": delta,
        "finish_reason": finish_reason,
        "logprobs": {"content": [logprob_json(lp) for lp in logprobs]} if logprobs is not None else None,
    }
    return {**shape.envelope("chat.completion.chunk"), "choices": [choice]}


def _progress_chunk(shape: _Shape, progress: PrefillProgress) -> dict[str, Any]:
    """A prompt progress chunk. llama-ui reads its top-level `prompt_progress` (`processed - cache` over `total - cache`
    is its percentage, `time_ms` feeds its ETA) besides the chunk's id and model; the delta is empty, so a client that
    accumulates deltas (the SDKs) takes nothing from it."""
    return {
        **_chunk(shape, {}),
        "prompt_progress": {
            "total": progress.total,
            "cache": progress.cached,
            "processed": progress.processed,
            "time_ms": progress.elapsed_s * 1000,
        },
    }


async def _chunks(shapes: list[_Shape], generations: list[Generation], logprobs: bool, usage: bool,
                  timings: bool) -> AsyncIterator[bytes]:
    """The choices' chunks as they come (each with its choice's index), each choice's final chunk when it ends,
    then the usage of them all."""
    for shape in shapes:
        yield sse_frame(_chunk(shape, {"role": "assistant", "content": ""}))
    async for index, delta in merged_deltas(generations):
        shape, generation = shapes[index], generations[index]
        if delta is None:  # this choice has ended
            result = generation.result
            assert result is not None
            custom_calls = _custom_call_chunk(shape, result)
            if custom_calls is not None:
                yield sse_frame(custom_calls)
            final = _chunk(shape, {}, _finish_reason(result))
            final.update(timings=timings_json(result), **shape.extras(result))
            yield sse_frame(final)
            continue
        if delta.progress is not None:
            if index == 0:  # the prompt is prefilled once, by the first choice
                yield sse_frame(_progress_chunk(shape, delta.progress))
            continue
        fields = _delta_json(shape, delta)
        if fields or (logprobs and delta.logprobs):
            chunk = _chunk(shape, fields, logprobs=list(delta.logprobs) if logprobs else None)
            live = generation.so_far()
            if timings and live.completion_tokens >= 2:  # one token has no decode time yet: no rate to give
                chunk["timings"] = live_timings_json(live)
            yield sse_frame(chunk)
    if usage:
        results = [g.result for g in generations]
        yield sse_frame({**shapes[0].envelope("chat.completion.chunk"), "choices": [],
                         "usage": usage_json(combined_usage(results))})  # type: ignore[arg-type]
    yield sse_frame("[DONE]")


async def _whole(shapes: list[_Shape], generations: list[Generation], logprobs: bool) -> dict[str, Any]:
    async for _ in merged_deltas(generations):
        pass
    return completion_json(shapes, [g.result for g in generations], logprobs)  # type: ignore[misc]


def _reasoning_budget(body: ChatCompletionRequest) -> int | None:
    """The request's reasoning budget in tokens, None for no limit (llama.cpp reads reasoning_budget_tokens first)."""
    budget = body.reasoning_budget_tokens if body.reasoning_budget_tokens is not None else body.thinking_budget_tokens
    return None if budget is None or budget < 0 else budget


def _ping_interval(body: ChatCompletionRequest) -> float | None:
    """Seconds between keepalives of this stream: the request's, else the server's; None: no keepalives."""
    if body.sse_ping_interval is None:
        return PING_INTERVAL_S
    return None if body.sse_ping_interval <= 0 else body.sse_ping_interval


@post(["/v1/chat/completions", "/chat/completions"], status_code=200, summary="OpenAI Chat Completions")
async def chat_completions(data: JSONBody[ChatCompletionRequest], lease: LeaseDependency, request: Request) -> Any:
    model = lease.served
    want_logprobs = bool(data.logprobs) or bool(data.top_logprobs)
    max_tokens = data.max_completion_tokens if data.max_completion_tokens is not None else data.max_tokens
    params = generation_params(
        data,
        max_tokens=max_tokens,
        logprobs=want_logprobs,
        top_logprobs=data.top_logprobs or 0,
        split_reasoning=data.reasoning_format != "none",
        report_progress=data.stream and data.return_progress,
    )
    chat = await asyncio.to_thread(_chat_prompt, data)  # a walk over every message: off the event loop
    prepared = await prepare(model, chat, params, output_format=chat_response_format(data.response_format),
                             format_param="response_format")
    budget = _reasoning_budget(data)
    if data.reasoning_control or budget is not None:
        p = prepared.params
        controls = [ReasoningControl(model.engine.frontend, starts_in_reasoning=prepared.prompt.starts_in_reasoning,
                                     inner=inner, budget=budget)
                    for inner in ([p.constraint, *p.choice_constraints] if p.constraint is not None else [None] * p.n)]
        prepared = replace(prepared, params=replace(p, constraint=controls[0], choice_constraints=tuple(controls[1:])))
    shape = _Shape(data, model.model_id)
    shapes = shape.choices(prepared.params.n)
    return await answer_choices(
        request, lease, prepared, response_id=shape.id,
        whole=lambda generations: _whole(shapes, generations, want_logprobs),
        stream=(lambda generations: sse_response(
            _chunks(shapes, generations, want_logprobs, include_usage(data), data.timings_per_token),
            on_error=stream_error_frame, final_frame=DONE_FRAME, ping_interval_s=_ping_interval(data),
        )) if data.stream else None,
    )


route_handlers = [chat_completions]
