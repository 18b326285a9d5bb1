"""Anthropic Messages: `POST /v1/messages` (streamed and not) and `POST /v1/messages/count_tokens`.

A translator over `ninfer.serve.generation`. Messages and their content blocks become chat messages: `text` ->
content, `thinking` -> `reasoning_content`, `tool_use` -> `tool_calls`, `tool_result` -> a `tool` message; `system`
goes first. The pipeline's output becomes content blocks in order: `thinking` (with an empty signature: nothing is
signed here), `text`, and `tool_use` (its `input` parsed from the call's arguments). Streaming is Anthropic's event
sequence: `message_start`, then per block `content_block_start` / `content_block_delta` (`thinking_delta`,
`text_delta`, `input_json_delta`) / `content_block_stop`, then `message_delta` (stop reason and usage) and
`message_stop`. Errors use Anthropic's shape `{type: "error", error: {type, message}}` (ninfer.serve.errors picks it
by path), also as a mid-stream `error` event.

`thinking: {type: enabled | adaptive}` turns the model's reasoning on, `{type: disabled}` off; without it the
template's default applies (on for Qwen3.5). `budget_tokens` is accepted but not enforced; `output_config.effort`
goes to the template as `reasoning_effort`. `tool_choice` `any` / `tool` and `strict` tools are advisory (the engine
cannot force a call; the message says so under `ninfer.tool_choice`) and `none` hides the tools. Usage follows Anthropic:
`input_tokens` excludes the prompt tokens read from the cache, which are `cache_read_input_tokens`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, post
from litestar.params import JSONBody
from msgspec import Meta

from ninfer.errors import NinferError
from ninfer.frontend.chat import is_media_part
from ninfer.frontend.chat_media import tag_media_parts
from ninfer.serve.answer import answer, prepare
from ninfer.serve.custom_tools import AnthropicTool
from ninfer.serve.errors import InvalidRequestError, anthropic_body, describe
from ninfer.serve.fields import OutputTokens, StopStrings, Temperature, TopK, TopP
from ninfer.serve.gate import LeaseDependency
from ninfer.serve.generation import (
    ChatPrompt,
    Generation,
    GenerationParams,
    GenerationResult,
    prepare_prompt,
    sampling_overrides,
)
from ninfer.serve.openai_common import advisory_tool_choice, new_id, stop_strings
from ninfer.serve.output_blocks import REASONING, TEXT, Block, BlockDelta, BlockStart, BlockStop, OutputBlocks
from ninfer.serve.sse import sse_frame, sse_response
from ninfer.serve.structured import OutputFormatField, anthropic_output_format

_STOP_REASONS = {"length": "max_tokens", "cancelled": "end_turn"}


class Thinking(msgspec.Struct, kw_only=True):
    type: Literal["enabled", "adaptive", "between_tools", "disabled"] | None = None  # None: the template's default
    budget_tokens: int | None = None  # accepted, not enforced


class OutputConfig(msgspec.Struct, kw_only=True):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # the template's reasoning_effort
    format: OutputFormatField | None = None


# The content blocks served, by role (chat_messages reads them; msgspec types them as objects, the document gives
# each kind's fields, and chat_messages refuses any other block). An image needs a model with the vision tower.
_TEXT_BLOCK = {"type": "object", "required": ["type", "text"],
               "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_USER_BLOCKS = [
    _TEXT_BLOCK,
    {"required": ["type", "source"], "properties": {"type": {"const": "image"}, "source": {"type": "object"}}},
    {"required": ["type"], "properties": {"type": {"const": "tool_result"}, "content": {
        "anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_BLOCK}, {"type": "null"}]}}},
]
_ASSISTANT_BLOCKS = [
    _TEXT_BLOCK,
    {"required": ["type"], "properties": {"type": {"enum": ["thinking", "redacted_thinking"]}}},
    {"required": ["type", "name"], "properties": {"type": {"const": "tool_use"}, "name": {"type": "string"},
                                                  "input": {"type": "object"}}},
]


def _blocks(kinds: list[dict[str, Any]]) -> dict[str, Any]:
    return {"properties": {"content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"anyOf": kinds}}]}}}


_BLOCKS_BY_ROLE = {"if": {"properties": {"role": {"const": "user"}}}, "then": _blocks(_USER_BLOCKS),
                   "else": _blocks(_ASSISTANT_BLOCKS)}
TextBlocks = list[Annotated[dict[str, Any], Meta(extra_json_schema=_TEXT_BLOCK)]]  # system


class AnthropicMessage(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | Annotated[list[dict[str, Any]], Meta(min_length=1)]


class CountTokensRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    messages: Annotated[list[Annotated[AnthropicMessage, Meta(extra_json_schema=_BLOCKS_BY_ROLE)]],
                        Meta(min_length=1)]
    system: str | TextBlocks | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormatField | None = None  # the older place of output_config.format


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: OutputTokens
    stop_sequences: StopStrings | None = None
    stream: bool = False
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None


# -- request -> chat prompt ------------------------------------------------------------------------------------


def _text(blocks: str | list[Any] | None, where: str) -> str:
    """Text of a string or of text blocks (tool_result content, system)."""
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    if not isinstance(blocks, list):  # tool_result content is not typed by the request schema
        raise InvalidRequestError(f"{where}: content must be a string or a list of text blocks, "
                                  f"got {type(blocks).__name__}")
    texts = []
    for block in blocks:
        if (
            not isinstance(block, Mapping)
            or block.get("type") != "text"
            or not isinstance(block.get("text"), str)
        ):
            kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
            raise InvalidRequestError(f"{where}: this model takes text only, got a {kind!r} block")
        texts.append(block["text"])
    return "\n".join(texts)


def _tool_call(block: Mapping[str, Any]) -> dict[str, Any]:
    name, arguments = block.get("name"), block.get("input", {})
    if not isinstance(name, str) or not isinstance(arguments, Mapping):
        raise InvalidRequestError("a tool_use block needs a string name and an object input")
    return {
        "id": block.get("id"),
        "type": "function",
        "function": {"name": name, "arguments": dict(arguments)},
    }


def _user_messages(content: str | list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """A user turn: its tool results become tool messages (first, as they answer the previous turn), its text one
    user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tools, texts = [], []
    for block in tag_media_parts(content, f"messages[{index}].content"):
        if block.get("type") == "tool_result":
            result = _text(block.get("content"), f"messages[{index}] tool_result")
            tools.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": result})
        else:
            texts.append(block)
    # Text and image blocks stay a list when there is an image (the template places it); else they join as text.
    media = any(is_media_part(b) for b in texts)
    user = [b for b in texts if b.get("type") == "text" or is_media_part(b)] if media else None
    if user is not None and len(user) != len(texts):
        user = None  # another kind of block: _text names it
    return tools + ([{"role": "user", "content": user or _text(texts, f"messages[{index}]")}] if texts else [])


def _assistant_message(content: str | list[dict[str, Any]], index: int) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    message: dict[str, Any] = {"role": "assistant"}
    texts, thinking, calls = [], [], []
    for block in content:
        kind = block.get("type")
        if kind == "text":
            texts.append(block)
        elif kind == "thinking":
            thinking.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue  # opaque to this server
        elif kind == "tool_use":
            calls.append(_tool_call(block))
        else:
            raise InvalidRequestError(
                f"messages[{index}]: assistant content block type {kind!r} is not served"
            )
    message["content"] = _text(texts, f"messages[{index}]")
    if thinking:
        message["reasoning_content"] = "\n".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message


def chat_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": _text(body.system, "system")}] if body.system else []
    for index, message in enumerate(body.messages):
        if message.role == "user":
            messages.extend(_user_messages(message.content, index))
        else:
            messages.append(_assistant_message(message.content, index))
    return messages


def chat_tools(body: CountTokensRequest) -> list[dict[str, Any]] | None:
    if not body.tools:
        return None
    result = []
    for tool in body.tools:
        if not isinstance(tool.get("name"), str) or tool.get("type") not in (None, "custom"):
            raise InvalidRequestError(
                f"only client tools with a name and input_schema are served, got type {tool.get('type')!r}"
            )
        schema = tool.get("input_schema")  # anything but an object or null is a 400 (as on the other routes)
        function = {"name": tool["name"], "parameters": {"type": "object"} if schema is None else schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        result.append({"type": "function", "function": function})
    return result


def _enable_thinking(thinking: Thinking | None) -> bool | None:
    if thinking is None or thinking.type is None:
        return None
    return thinking.type != "disabled"


def chat_prompt(body: CountTokensRequest) -> ChatPrompt:
    return ChatPrompt(
        messages=chat_messages(body),
        tools=chat_tools(body),
        hide_tools=(body.tool_choice or {}).get("type") == "none",
        enable_thinking=_enable_thinking(body.thinking),
        reasoning_effort=body.output_config.effort if body.output_config is not None else None,
    )


def output_format(body: CountTokensRequest) -> Any:
    fmt = body.output_config.format if body.output_config is not None else None
    return anthropic_output_format(fmt if fmt is not None else body.output_format)


# -- output ----------------------------------------------------------------------------------------------------


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        value = None
    # The parser always emits an object; anything else would be its bug, kept visible rather than dropped.
    return value if isinstance(value, dict) else {"_raw_arguments": arguments}


class _Shape:
    def __init__(self, model_id: str, tool_note: dict[str, Any] | None = None) -> None:
        self.id = new_id("msg")
        self.model = model_id
        self.tool_note = tool_note  # advisory tool_choice / strict, reported as `ninfer.tool_choice`
        self._tool_ids: dict[int, str] = {}

    def tool_id(self, block: Block) -> str:
        return self._tool_ids.setdefault(block.index, new_id("toolu"))

    def content_block(self, block: Block, *, done: bool) -> dict[str, Any]:
        text = block.text if done else ""
        if block.kind == REASONING:
            return {"type": "thinking", "thinking": text, "signature": ""}
        if block.kind == TEXT:
            return {"type": "text", "text": text}
        return {
            "type": "tool_use",
            "id": self.tool_id(block),
            "name": block.name,
            "input": _tool_input(block.text) if done else {},
        }

    def message(
        self, content: list[dict[str, Any]], result: GenerationResult | None, prompt_tokens: int
    ) -> dict[str, Any]:
        usage = _usage(result, prompt_tokens)
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": _stop_reason(result) if result else None,
            "stop_sequence": result.stop_string if result else None,
            "usage": usage,
        }
        return message | ({"ninfer": {"tool_choice": self.tool_note}} if self.tool_note else {})


def _stop_reason(result: GenerationResult) -> str:
    if result.stop_string is not None:
        return "stop_sequence"
    if result.tool_calls and result.finish_reason == "stop":
        return "tool_use"
    return _STOP_REASONS.get(result.finish_reason, "end_turn")


def _usage(result: GenerationResult | None, prompt_tokens: int) -> dict[str, Any]:
    cached = result.usage.cached_tokens if result else 0
    return {
        "input_tokens": prompt_tokens - cached,
        "output_tokens": result.usage.completion_tokens if result else 0,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
        "output_tokens_details": {"thinking_tokens": result.usage.reasoning_tokens if result else 0},
    }


class _Run:
    def __init__(self, shape: _Shape, generation: Generation) -> None:
        self.shape, self.generation = shape, generation
        self.blocks = OutputBlocks()
        self.prompt_tokens = len(generation.prompt.token_ids)

    async def run(self) -> dict[str, Any]:
        async for delta in self.generation.deltas():
            self.blocks.feed(delta)
        self.blocks.finish()
        content = [self.shape.content_block(b, done=True) for b in self.blocks.blocks]
        return self.shape.message(content, self.generation.result, self.prompt_tokens)

    async def events(self) -> AsyncIterator[bytes]:
        yield sse_frame(
            {"type": "message_start", "message": self.shape.message([], None, self.prompt_tokens)},
            event="message_start",
        )
        async for delta in self.generation.deltas():
            for event in self.blocks.feed(delta):
                yield self._frame(event)
        for event in self.blocks.finish():
            yield self._frame(event)
        result = self.generation.result
        assert result is not None
        usage = _usage(result, self.prompt_tokens)
        yield sse_frame(
            {
                "type": "message_delta",
                "usage": usage,
                "delta": {"stop_reason": _stop_reason(result), "stop_sequence": result.stop_string},
            },
            event="message_delta",
        )
        yield sse_frame({"type": "message_stop"}, event="message_stop")

    def _frame(self, event: BlockStart | BlockDelta | BlockStop) -> bytes:
        block = event.block
        if isinstance(event, BlockStart):
            payload = {
                "type": "content_block_start",
                "index": block.index,
                "content_block": self.shape.content_block(block, done=False),
            }
        elif isinstance(event, BlockDelta):
            # (never text-less here: an empty BlockDelta carries only logprobs, which this route never asks for)
            if block.kind == REASONING:
                delta = {"type": "thinking_delta", "thinking": event.text}
            elif block.kind == TEXT:
                delta = {"type": "text_delta", "text": event.text}
            else:
                delta = {"type": "input_json_delta", "partial_json": event.text}
            payload = {"type": "content_block_delta", "index": block.index, "delta": delta}
        else:
            payload = {"type": "content_block_stop", "index": block.index}
        return sse_frame(payload, event=payload["type"])


def stream_error_frame(exc: NinferError) -> bytes:
    return sse_frame(anthropic_body(describe(exc)), event="error")


# -- routes ----------------------------------------------------------------------------------------------------


def _params(body: MessagesRequest) -> GenerationParams:
    return GenerationParams(
        max_tokens=body.max_tokens,
        sampling=sampling_overrides(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k),
        stop=stop_strings(body.stop_sequences, param="stop_sequences"),
    )


def _tool_choice_note(body: MessagesRequest) -> dict[str, Any] | None:
    forcing = (body.tool_choice or {}).get("type") in ("any", "tool")
    strict = any(isinstance(t, Mapping) and t.get("strict") is True for t in body.tools or ())
    return advisory_tool_choice(body.tool_choice, forcing=forcing, strict=strict) if body.tools else None


@post("/v1/messages", status_code=200, summary="Anthropic Messages")
async def create_message(data: JSONBody[MessagesRequest], lease: LeaseDependency, request: Request) -> Any:
    chat = await asyncio.to_thread(chat_prompt, data)  # a walk over every message and block: off the event loop
    prepared = await prepare(lease.served, chat, _params(data), output_format=output_format(data),
                             format_param="output_format.schema")
    shape = _Shape(lease.served.model_id, _tool_choice_note(data))
    return await answer(
        request, lease, prepared, response_id=shape.id,
        whole=lambda generation: _Run(shape, generation).run(),
        stream=(lambda generation: sse_response(_Run(shape, generation).events(), on_error=stream_error_frame))
        if data.stream else None,
    )


@post("/v1/messages/count_tokens", status_code=200, summary="Anthropic token count of a Messages request")
async def count_tokens(data: JSONBody[CountTokensRequest], lease: LeaseDependency) -> dict[str, int]:
    output_format(data)  # checked as on /v1/messages, although a count does not use it
    chat = await asyncio.to_thread(chat_prompt, data)
    return {"input_tokens": len((await prepare_prompt(lease.served, chat)).token_ids)}


route_handlers = [create_message, count_tokens]
