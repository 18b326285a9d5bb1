"""Render chat messages into a prompt with a model's own Jinja chat template.

The template runs in the project's template environment (`ninfer.frontend.templates.template_environment`: jinja2's
immutable sandbox, `tojson` that does not HTML-escape, `raise_exception`, loop controls) plus `strftime_now`. Template options (`enable_thinking`,
`preserve_thinking`, `reasoning_effort`, any other `chat_template_kwargs`) are passed only when given, because the
templates test `is defined` and pick their own defaults otherwise (Qwen3.8 keeps thinking when `preserve_thinking`
is undefined).

Messages are normalised first: OpenAI content-part lists become plain text for text-only models, tool-call
`arguments` given as JSON text become objects (the Qwen templates iterate them), and `reasoning` is accepted as a
synonym of `reasoning_content`.

A final assistant message that holds only text is *continued*: the prompt is rendered without a generation prompt
and cut right after that message's text, so the model extends it instead of opening a new turn.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ninfer.errors import EngineError
from ninfer.frontend.reasoning import THINK_END, THINK_START
from ninfer.frontend.templates import template_environment

_TEXT_PART_TYPES = ("text", "input_text", "output_text")
# What chat_media.extract_media leaves of a media part: the chat template writes a vision placeholder for it.
MEDIA_MARKERS = ({"type": "image"}, {"type": "video"})


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    # The prompt ends inside the final assistant message's text (it is continued, not answered).
    continues_final_message: bool
    # The prompt leaves a think block open: the generation starts as reasoning.
    starts_in_reasoning: bool


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = template_environment()
    env.globals["strftime_now"] = _strftime_now  # Llama 3 style templates print today's date
    return env


def is_media_part(part: Any) -> bool:
    """Any protocol's image or video part (frontend.chat_media reads them): OpenAI image_url / video_url,
    Responses input_image, Anthropic image with a source, the CLI's image / video with a path."""
    if not isinstance(part, Mapping):
        return False
    kind = part.get("type")
    return kind in ("image_url", "video_url", "input_image") or (
        kind in ("image", "video") and (isinstance(part.get("source"), Mapping) or isinstance(part.get(kind), str)))


def flatten_content(content: Any, *, role: str) -> Any:
    """OpenAI / Anthropic / Responses content-part lists -> text (parts joined by newlines); text-only models
    refuse other parts."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise EngineError(f"{role} message content must be a string or a list of content parts")
    if any(part in MEDIA_MARKERS for part in content):
        return content  # images / video (frontend.chat_media's markers): the template writes text and placeholders
    texts: list[str] = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _TEXT_PART_TYPES and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            raise EngineError(
                f"this model takes text only; a {role} message has a content part of type {kind!r}"
            )
    return "\n".join(texts)


def _normalise_tool_call(call: Any) -> Any:
    if not isinstance(call, Mapping):
        return call
    call = dict(call)
    function = call.get("function")
    if isinstance(function, Mapping) and isinstance(function.get("arguments"), str):
        function = dict(function)
        try:
            arguments = json.loads(function["arguments"])
        except ValueError:
            arguments = None
        if isinstance(arguments, dict):
            function["arguments"] = arguments
        call["function"] = function
    # The Qwen templates read `tool_call.function` when present and fall back to the call itself.
    return call


def normalise_messages(messages: Sequence[Mapping[str, Any]], *, text_only: bool) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise EngineError(f"messages[{index}] must be an object with a string 'role'")
        msg = copy.deepcopy(dict(message))
        if text_only:
            msg["content"] = flatten_content(msg.get("content"), role=msg["role"])
        if "reasoning_content" not in msg and isinstance(msg.get("reasoning"), str):
            msg["reasoning_content"] = msg["reasoning"]
        if isinstance(msg.get("tool_calls"), list):
            msg["tool_calls"] = [_normalise_tool_call(c) for c in msg["tool_calls"]]
        result.append(msg)
    return result


def _is_text_only_assistant(message: Mapping[str, Any]) -> bool:
    return (
        message.get("role") == "assistant"
        and isinstance(message.get("content"), str)
        and bool(message["content"])
        and not message.get("tool_calls")
    )


def prompt_opens_reasoning(prompt: str, start_tag: str = THINK_START, end_tag: str = THINK_END) -> bool:
    """True when the prompt leaves a think block open (its last `<think>` comes after its last `</think>`)."""
    return prompt.rfind(start_tag) > prompt.rfind(end_tag)


class ChatTemplate:
    """One compiled chat template plus the special tokens it may refer to."""

    def __init__(
        self, source: str, *, bos_token: str = "", eos_token: str = "", text_only: bool = True
    ) -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise EngineError(f"chat template does not compile: {exc.message} (line {exc.lineno})") from exc
        self.source = source  # what /props shows (llama-ui reads it, e.g. to see that the model can think)
        self._bos_token = bos_token
        self._eos_token = eos_token
        self._text_only = text_only

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool | None = None,
        enable_thinking: bool | None = None,
        preserve_thinking: bool | None = None,
        reasoning_effort: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> RenderedPrompt:
        """Render a conversation. `continue_final_message=None` continues a final text-only assistant message
        automatically; True insists (and fails if there is none); False always opens a new turn."""
        msgs = normalise_messages(messages, text_only=self._text_only)
        can_continue = bool(msgs) and _is_text_only_assistant(msgs[-1])
        if continue_final_message and not can_continue:
            raise EngineError("continue_final_message needs a final assistant message with text content only")
        continuing = can_continue if continue_final_message is None else continue_final_message
        variables: dict[str, Any] = dict(chat_template_kwargs or {})
        named = {
            "enable_thinking": enable_thinking,
            "preserve_thinking": preserve_thinking,
            "reasoning_effort": reasoning_effort,
        }
        variables.update({k: v for k, v in named.items() if v is not None})
        variables.update(
            messages=msgs,
            add_generation_prompt=add_generation_prompt and not continuing,
            bos_token=self._bos_token,
            eos_token=self._eos_token,
        )
        if tools:
            variables["tools"] = list(tools)
        try:
            text = self._template.render(**variables)
        except (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError) as exc:
            # Template code runs on client data; whatever it trips on is a refusal of that request, not a crash.
            raise EngineError(f"chat template refused the request: {exc}") from exc
        if continuing:
            text = _cut_after_final_text(text, msgs[-1]["content"])
        return RenderedPrompt(text, continuing, prompt_opens_reasoning(text))


def _cut_after_final_text(prompt: str, final_text: str) -> str:
    """Drop what the template put after the final message's text (its end-of-turn marker, a newline)."""
    for candidate in (final_text, final_text.strip()):
        pos = prompt.rfind(candidate) if candidate else -1
        if pos >= 0:
            return prompt[: pos + len(candidate)]
    raise EngineError(
        "the chat template does not reproduce the final assistant message, so it cannot be continued"
    )
