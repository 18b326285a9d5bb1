"""OpenAI Responses: `POST /v1/responses` (streamed and not), `GET` / `DELETE /v1/responses/{id}`,
`GET /v1/responses/{id}/input_items`, and `POST /v1/responses/input_tokens`.

A translator over `ninfer.serve.generation`. The request's `input` items (and, through `previous_response_id`, the
stored conversation before them) become chat messages; the pipeline's output becomes output items: a `reasoning`
item (its text in `content[].reasoning_text`, as open-weight servers return it; there is no summary), a `message`
item with `output_text`, and one `function_call` item per tool call. Streaming follows the SDK's semantic events
(`response.created`, `response.in_progress`, `response.output_item.added`, `response.content_part.added`,
`response.output_text.delta` / `response.reasoning_text.delta` / `response.function_call_arguments.delta`, their
`.done` events, `response.output_item.done`, then `response.completed` or `response.incomplete`), each with a
`sequence_number`, and no `[DONE]` sentinel.

Responses are kept (unless `store: false`) in a bounded in-process store (`ninfer.serve.response_store`), which is
what `previous_response_id` reads: the stored conversation continues, `instructions` are not carried over (as with
OpenAI). Function and custom (freeform, `ninfer.serve.custom_tools`) tools are served; a custom call is a
`custom_tool_call` item whose input streams as one `response.custom_tool_call_input.delta` once the call is complete.
`tool_choice` other than auto/none is advisory (see chat). `text.format`
json_schema / json_object is checked like chat's `response_format` (`ninfer.serve.structured`).

Logprobs: `include: ["message.output_text.logprobs"]` (or `top_logprobs` > 0, as chat's `top_logprobs` implies
`logprobs`) puts each answer token's logprob, bytes and `top_logprobs` alternatives on the message's `output_text`,
on the `response.output_text.delta` that releases the token and on `response.output_text.done`; reasoning and
tool-call tokens are not shown (the output has no place for them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.datastructures import State
from litestar.exceptions import NotFoundException
from litestar.params import FromPath, FromQuery, JSONBody
from msgspec import Meta

from ninfer.errors import NinferError
from ninfer.frontend.chat import flatten_content
from ninfer.frontend.chat_media import flatten_unless_media
from ninfer.serve.answer import answer, prepare
from ninfer.serve.custom_tools import ResponsesTool, as_function_tool, call_input, function_arguments
from ninfer.serve.errors import InvalidRequestError, describe
from ninfer.serve.fields import OutputTokens, Probability, Temperature, TopK, TopLogprobs, TopP
from ninfer.serve.gate import LeaseDependency
from ninfer.serve.generation import (
    ChatPrompt,
    Generation,
    GenerationParams,
    GenerationResult,
    TokenLogprob,
    prepare_prompt,
    sampling_overrides,
)
from ninfer.serve.openai_chat import PART_KINDS
from ninfer.serve.openai_common import (
    ReasoningEffort,
    ToolChoice,
    advisory_tool_choice,
    logprob_json,
    new_id,
    template_role,
)
from ninfer.serve.output_blocks import (
    REASONING,
    TEXT,
    TOOL_CALL,
    Block,
    BlockDelta,
    BlockEvent,
    BlockStart,
    BlockStop,
    OutputBlocks,
)
from ninfer.serve.response_store import ResponseStore, StoredResponse
from ninfer.serve.sse import SSEStream, sse_frame, sse_response
from ninfer.serve.structured import TextConfig, responses_text_format

OUTPUT_TEXT_LOGPROBS = "message.output_text.logprobs"  # the `include` value that asks for them


# The input items served (items_to_messages reads them; msgspec types them as objects, the document gives each
# kind's fields, and items_to_messages refuses any other item). A message's content parts are chat's.
_CONTENT = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"anyOf": PART_KINDS}}, {"type": "null"}]}
_ITEM_KINDS = [
    {"required": ["role"], "properties": {"type": {"const": "message"}, "content": _CONTENT,
                                          "role": {"enum": ["user", "system", "developer", "assistant"]}}},
    {"required": ["type"], "properties": {"type": {"const": "reasoning"}, "content": {"type": "array"},
                                          "summary": {"type": "array"}}},
    {"required": ["type", "name"], "properties": {"type": {"const": "function_call"}, "name": {"type": "string"},
                                                  "arguments": {"type": "string"}}},
    {"required": ["type", "name", "input"], "properties": {"type": {"const": "custom_tool_call"},
                                                           "name": {"type": "string"}, "input": {"type": "string"}}},
    {"required": ["type"], "properties": {"type": {"enum": ["function_call_output", "custom_tool_call_output"]},
                                          "output": {"anyOf": [{"type": "string"}, {"type": "null"}, {
                                              "type": "array", "items": PART_KINDS[0]}]}}},
]
InputItems = list[Annotated[dict[str, Any], Meta(extra_json_schema={"anyOf": _ITEM_KINDS})]]


class Reasoning(msgspec.Struct, kw_only=True):
    effort: ReasoningEffort | None = None
    summary: str | None = None  # accepted; no summary is generated


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    input: str | InputItems | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    max_output_tokens: OutputTokens | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning: Reasoning | None = None
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    # documented as false only; _check_supported refuses true with the reason
    background: Annotated[bool, Meta(extra_json_schema={"enum": [False]})] | None = None
    stream: bool = False
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_logprobs: TopLogprobs | None = None
    user: str | None = None
    # Extensions, as chat accepts them.
    top_k: TopK | None = None
    min_p: Probability | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class InputTokensRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    input: str | InputItems | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: ToolChoice | None = None
    reasoning: Reasoning | None = None


def response_store(state: State) -> ResponseStore:
    """The app's store, made on first use (its size is the default until ninfer-serve grows an option)."""
    store = state.get("response_store")
    if store is None:
        store = state["response_store"] = ResponseStore()
    return store


# -- input -> chat messages ------------------------------------------------------------------------------------


def _item_with_id(item: Mapping[str, Any]) -> dict[str, Any]:
    """An input item as /input_items lists it: with an id, and string content as an input_text part."""
    stored = dict(item)
    kind = stored.setdefault("type", "message")
    if not isinstance(kind, str):
        raise InvalidRequestError(f"an input item's type must be a string, got {type(kind).__name__}",
                                  param="input")
    prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
    stored.setdefault("id", new_id(prefix.get(kind, "item")))
    if kind == "message" and isinstance(stored.get("content"), str):
        part = "output_text" if stored.get("role") == "assistant" else "input_text"
        stored["content"] = [{"type": part, "text": stored["content"]}]
    return stored


def input_items(value: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [_item_with_id({"type": "message", "role": "user", "content": value})]
    return [_item_with_id(item) for item in value]


def _reasoning_text(item: Mapping[str, Any]) -> str:
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list):
        raise InvalidRequestError("a reasoning item's content and summary must be lists", param="input")
    return "\n".join(p["text"] for p in parts if isinstance(p, Mapping) and isinstance(p.get("text"), str))


def _function_call(item: Mapping[str, Any]) -> dict[str, Any]:
    name, arguments = item.get("name"), item.get("arguments", "{}")
    if not isinstance(name, str) or not isinstance(arguments, str):
        raise InvalidRequestError(
            "a function_call item needs a string name and string arguments", param="input"
        )
    return {
        "id": item.get("call_id") or item.get("id"),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _custom_tool_call(item: Mapping[str, Any]) -> dict[str, Any]:
    name, raw_input = item.get("name"), item.get("input")
    if not isinstance(name, str) or not isinstance(raw_input, str):
        raise InvalidRequestError(
            "a custom_tool_call item needs a string name and string input", param="input"
        )
    return {
        "id": item.get("call_id") or item.get("id"),
        "type": "function",
        "function": {"name": name, "arguments": function_arguments(raw_input)},
    }


def items_to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input items -> chat messages. A reasoning item's text goes to the assistant message that
    follows it; consecutive function calls join one assistant message."""
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None
    for position, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidRequestError(
                    f"input message role must be user, system, developer or assistant, not {role!r}",
                    param="input",
                )
            message: dict[str, Any] = {
                "role": template_role(role),
                "content": flatten_unless_media(item.get("content"), role=role, where=f"input[{position}].content"),
            }
            if role == "assistant" and reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
            messages.append(message)
        elif kind == "reasoning":
            reasoning = _reasoning_text(item)
        elif kind in ("function_call", "custom_tool_call"):
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant" or reasoning is not None:
                last = {"role": "assistant", "content": ""}
                if reasoning is not None:
                    last["reasoning_content"], reasoning = reasoning, None
                messages.append(last)
            call = _function_call(item) if kind == "function_call" else _custom_tool_call(item)
            last.setdefault("tool_calls", []).append(call)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": flatten_content(output, role="tool") if output is not None else "",
                }
            )
        else:
            raise InvalidRequestError(
                f"input items of type {kind!r} are not served (message, reasoning, function_call, "
                "function_call_output, custom_tool_call and custom_tool_call_output are)",
                param="input",
            )
    return messages


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses' flat function and custom tools -> chat's nested function form, which the templates read."""
    if not tools:
        return None
    result = []
    for tool in tools:
        if tool.get("type") == "custom":
            result.append(as_function_tool(tool, "tools"))
            continue
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise InvalidRequestError(
                f"only function and custom tools (with a name) are served, got type {tool.get('type')!r}",
                param="tools",
            )
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        result.append({"type": "function", "function": function})
    return result


def _previous(store: ResponseStore, response_id: str | None) -> list[dict[str, Any]]:
    if response_id is None:
        return []
    entry = store.get(response_id)
    if entry is None:
        raise NotFoundException(
            f"previous response {response_id!r} not found: it was not stored, was deleted, "
            f"or aged out of the server's store of {store.capacity} responses"
        )
    return entry.conversation


def _chat_prompt(
    body: ResponsesRequest | InputTokensRequest, conversation: list[dict[str, Any]]
) -> ChatPrompt:
    effort = body.reasoning.effort if body.reasoning is not None else None
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    kwargs = dict(getattr(body, "chat_template_kwargs", None) or {})
    enable_thinking = kwargs.pop("enable_thinking", None)
    if effort == "none":
        enable_thinking = False
    if not system and not conversation:
        raise InvalidRequestError("input is empty", param="input")
    return ChatPrompt(
        messages=system + conversation,
        tools=chat_tools(body.tools),
        hide_tools=body.tool_choice == "none",
        enable_thinking=enable_thinking if isinstance(enable_thinking, bool) else None,
        reasoning_effort=effort if effort != "none" else None,
        chat_template_kwargs=kwargs or None,
    )


# -- output items ----------------------------------------------------------------------------------------------


class _Shape:
    """The response object's fields that do not depend on the output, and the ids of its items."""

    def __init__(self, body: ResponsesRequest, model_id: str) -> None:
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self.body = body
        self.model = model_id
        self._item_ids: dict[int, str] = {}
        self._call_ids: dict[int, str] = {}
        self.sequence_number = 0
        self.custom_tools = frozenset(t.get("name") for t in body.tools or () if t.get("type") == "custom")
        self.logprobs = wants_logprobs(body)

    def logprobs_json(self, logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
        return [logprob_json(lp) for lp in logprobs] if self.logprobs else []

    def output_text(self, text: str, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": self.logprobs_json(logprobs)}

    def is_custom_call(self, block: Block) -> bool:
        return block.kind == TOOL_CALL and block.name in self.custom_tools

    def item_id(self, block: Block) -> str:
        prefix = (
            "ctc"
            if self.is_custom_call(block)
            else {REASONING: "rs", TEXT: "msg", TOOL_CALL: "fc"}[block.kind]
        )
        return self._item_ids.setdefault(block.index, new_id(prefix))

    def call_id(self, block: Block) -> str:
        return self._call_ids.setdefault(block.index, new_id("call"))

    def item(self, block: Block, *, done: bool) -> dict[str, Any]:
        status = "completed" if done else "in_progress"
        text = block.text if done else ""
        if block.kind == REASONING:
            content = [{"type": "reasoning_text", "text": text}] if done else []
            return {
                "id": self.item_id(block),
                "type": "reasoning",
                "summary": [],
                "content": content,
                "status": status,
            }
        if block.kind == TEXT:
            content = [self.output_text(text, block.logprobs)] if done else []
            return {
                "id": self.item_id(block),
                "type": "message",
                "role": "assistant",
                "status": status,
                "content": content,
            }
        if self.is_custom_call(block):
            return {
                "id": self.item_id(block),
                "type": "custom_tool_call",
                "call_id": self.call_id(block),
                "name": block.name,
                "input": call_input(text) if done else "",
                "status": status,
            }
        return {
            "id": self.item_id(block),
            "type": "function_call",
            "call_id": self.call_id(block),
            "name": block.name,
            "arguments": text,
            "status": status,
        }

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        result: GenerationResult | None,
        extras: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body = self.body
        usage = None
        if result is not None:
            u = result.usage
            usage = {
                "input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.cached_tokens},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
                "total_tokens": u.total_tokens,
            }
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": body.reasoning.effort if body.reasoning is not None else None, "summary": None},
            "store": body.store,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "top_logprobs": body.top_logprobs,
            "text": body.text or {"format": {"type": "text"}},
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
            "tools": body.tools or [],
            "truncation": body.truncation or "disabled",
            "metadata": body.metadata or {},
            "usage": usage,
            "user": body.user,
            **({"ninfer": extras} if extras else {}),
        }


def wants_logprobs(body: ResponsesRequest) -> bool:
    return OUTPUT_TEXT_LOGPROBS in (body.include or ()) or bool(body.top_logprobs)


def _status(result: GenerationResult) -> str:
    return {"length": "incomplete", "cancelled": "cancelled"}.get(result.finish_reason, "completed")


def _extras(body: ResponsesRequest, result: GenerationResult) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    forcing = body.tool_choice == "required" or isinstance(body.tool_choice, dict)
    strict = any(t.get("strict") for t in body.tools or ())
    if note := advisory_tool_choice(body.tool_choice, forcing=forcing, strict=strict):
        extra["tool_choice"] = note
    if result.tool_issues:
        extra["tool_parse_issues"] = [
            {"kind": i.kind, "message": i.message, "snippet": i.snippet, "discarded_chars": i.discarded_chars}
            for i in result.tool_issues
        ]
    return extra


def output_messages(blocks: list[Block], shape: _Shape) -> list[dict[str, Any]]:
    """The output as one assistant chat message, for the stored conversation."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(b.text for b in blocks if b.kind == TEXT),
    }
    reasoning = "".join(b.text for b in blocks if b.kind == REASONING)
    if reasoning:
        message["reasoning_content"] = reasoning
    calls = [
        {"id": shape.call_id(b), "type": "function", "function": {"name": b.name, "arguments": b.text}}
        for b in blocks
        if b.kind == TOOL_CALL
    ]
    if calls:
        message["tool_calls"] = calls
    return [message]


class _Run:
    """One request's generation and everything its response is made from."""

    def __init__(
        self,
        body: ResponsesRequest,
        shape: _Shape,
        generation: Generation,
        store: ResponseStore,
        conversation: list[dict[str, Any]],
        items: list[dict[str, Any]],
    ) -> None:
        self.body, self.shape, self.generation = body, shape, generation
        self.store, self.conversation, self.items = store, conversation, items
        self.blocks = OutputBlocks()

    def final(self) -> dict[str, Any]:
        result = self.generation.result
        assert result is not None
        output = [self.shape.item(b, done=True) for b in self.blocks.blocks]
        response = self.shape.response(_status(result), output, result, _extras(self.body, result))
        if self.body.store:
            conversation = self.conversation + output_messages(self.blocks.blocks, self.shape)
            self.store.put(StoredResponse(response, self.items, conversation))
        return response

    async def run(self) -> dict[str, Any]:
        async for delta in self.generation.deltas():
            self.blocks.feed(delta)
        self.blocks.finish()
        return self.final()

    def frame(self, event: str, **fields: Any) -> bytes:
        payload = {"type": event, "sequence_number": self.shape.sequence_number, **fields}
        self.shape.sequence_number += 1
        return sse_frame(payload, event=event)

    async def events(self) -> AsyncIterator[bytes]:
        started = self.shape.response("in_progress", [], None)
        yield self.frame("response.created", response=started)
        yield self.frame("response.in_progress", response=started)
        async for delta in self.generation.deltas():
            for event in self.blocks.feed(delta):
                for frame in self._frames(event):
                    yield frame
        for event in self.blocks.finish():
            for frame in self._frames(event):
                yield frame
        response = self.final()
        done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        yield self.frame(done, response=response)

    def _frames(self, event: BlockEvent) -> list[bytes]:
        block = event.block
        where = {"item_id": self.shape.item_id(block), "output_index": block.index}
        part = {
            REASONING: lambda text, _logprobs: {"type": "reasoning_text", "text": text},
            TEXT: self.shape.output_text,
        }.get(block.kind)
        if isinstance(event, BlockStart):
            frames = [
                self.frame(
                    "response.output_item.added",
                    output_index=block.index,
                    item=self.shape.item(block, done=False),
                )
            ]
            if part is not None:
                frames.append(
                    self.frame("response.content_part.added", **where, content_index=0, part=part("", ()))
                )
            return frames
        if isinstance(event, BlockDelta):
            if block.kind == TEXT:
                logprobs = self.shape.logprobs_json(event.logprobs)
                return [
                    self.frame(
                        "response.output_text.delta", **where, content_index=0, delta=event.text, logprobs=logprobs
                    )
                ]
            if not event.text:
                return []  # only logprobs, which reasoning and calls have no place for
            if block.kind == REASONING:
                return [
                    self.frame("response.reasoning_text.delta", **where, content_index=0, delta=event.text)
                ]
            if self.shape.is_custom_call(block):
                return []  # arguments JSON, not yet the raw input: sent whole at the stop
            return [self.frame("response.function_call_arguments.delta", **where, delta=event.text)]
        assert isinstance(event, BlockStop)
        text = block.text
        if self.shape.is_custom_call(block):
            raw_input = call_input(text)
            frames = [
                self.frame("response.custom_tool_call_input.delta", **where, delta=raw_input),
                self.frame("response.custom_tool_call_input.done", **where, input=raw_input),
            ]
        elif block.kind == TOOL_CALL:
            frames = [
                self.frame("response.function_call_arguments.done", **where, name=block.name, arguments=text)
            ]
        else:
            done = "response.reasoning_text.done" if block.kind == REASONING else "response.output_text.done"
            extra = {"logprobs": self.shape.logprobs_json(block.logprobs)} if block.kind == TEXT else {}
            frames = [
                self.frame(done, **where, content_index=0, text=text, **extra),
                self.frame("response.content_part.done", **where, content_index=0, part=part(text, block.logprobs)),
            ]
        frames.append(
            self.frame(
                "response.output_item.done", output_index=block.index, item=self.shape.item(block, done=True)
            )
        )
        return frames

    def error_frame(self, exc: NinferError) -> bytes:
        info = describe(exc)
        return self.frame("error", code=info.code or info.kind, message=info.message, param=info.param)


# -- routes ----------------------------------------------------------------------------------------------------


def _check_supported(body: ResponsesRequest) -> None:
    if body.background:
        raise InvalidRequestError(
            "background responses are not served; send background: false", param="background"
        )


def _conversation(body: ResponsesRequest | InputTokensRequest,
                  store: ResponseStore) -> tuple[list[dict[str, Any]], list[dict[str, Any]], ChatPrompt]:
    """The request's input items, the whole conversation they continue, and its chat prompt."""
    items = input_items(body.input)
    conversation = _previous(store, body.previous_response_id) + items_to_messages(items)
    return items, conversation, _chat_prompt(body, conversation)


@post("/v1/responses", status_code=200, summary="OpenAI Responses")
async def create_response(data: JSONBody[ResponsesRequest], lease: LeaseDependency, state: State,
                          request: Request) -> Any:
    _check_supported(data)
    store = response_store(state)
    fmt = responses_text_format(data.text)
    params = GenerationParams(
        max_tokens=data.max_output_tokens,
        sampling=sampling_overrides(temperature=data.temperature, top_p=data.top_p, top_k=data.top_k,
                                    min_p=data.min_p),
        logprobs=wants_logprobs(data),
        top_logprobs=data.top_logprobs or 0,
    )
    items, conversation, chat = await asyncio.to_thread(_conversation, data, store)  # every item: off the loop
    prepared = await prepare(lease.served, chat, params, output_format=fmt, format_param="text.format.schema")
    shape = _Shape(data, lease.served.model_id)

    def run(generation: Generation) -> _Run:
        return _Run(data, shape, generation, store, conversation, items)

    def stream(generation: Generation) -> SSEStream:
        streamed = run(generation)
        return sse_response(streamed.events(), on_error=streamed.error_frame)

    return await answer(request, lease, prepared, response_id=shape.id,
                        whole=lambda generation: run(generation).run(), stream=stream if data.stream else None)


@post("/v1/responses/input_tokens", status_code=200, summary="Count a Responses request's input tokens")
async def count_input_tokens(data: JSONBody[InputTokensRequest], lease: LeaseDependency,
                             state: State) -> dict[str, Any]:
    *_, chat = await asyncio.to_thread(_conversation, data, response_store(state))
    prompt = await prepare_prompt(lease.served, chat)
    return {"object": "response.input_tokens", "input_tokens": len(prompt.token_ids)}


def _stored(state: State, response_id: str) -> StoredResponse:
    entry = response_store(state).get(response_id)
    if entry is None:
        raise NotFoundException(f"response {response_id!r} not found")
    return entry


@get("/v1/responses/{response_id:str}", summary="A stored response", raises=[NotFoundException])
async def get_response(response_id: FromPath[str], state: State) -> dict[str, Any]:
    return _stored(state, response_id).response


@delete("/v1/responses/{response_id:str}", status_code=200, summary="Delete a stored response",
        raises=[NotFoundException])
async def delete_response(response_id: FromPath[str], state: State) -> dict[str, Any]:
    if not response_store(state).delete(response_id):
        raise NotFoundException(f"response {response_id!r} not found")
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@get("/v1/responses/{response_id:str}/input_items", summary="A stored response's input items",
     raises=[NotFoundException])
async def list_input_items(
    response_id: FromPath[str],
    state: State,
    limit: Annotated[int, Meta(ge=1, le=100)] = 20,
    order: FromQuery[Literal["asc", "desc"]] = "desc",
    after: FromQuery[str | None] = None,
) -> Response[dict[str, Any]]:
    items = list(_stored(state, response_id).input_items)
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise InvalidRequestError(f"no input item {after!r} in this response", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return Response(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )


route_handlers = [create_response, count_input_tokens, get_response, delete_response, list_input_items]
