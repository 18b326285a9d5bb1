"""OpenAI custom (freeform) tools, which VS Code Copilot uses (e.g. `apply_patch`): the model's call input is raw
text, not JSON arguments.

Chat templates only know function tools, so a custom tool is shown to the model as a function with one string
parameter, `input`, whose description carries the tool's format (a Lark or regex grammar, or plain text). The call
the model writes is parsed like any function call (every parser: Qwen XML, Hermes JSON, Claude XML); its `input`
argument becomes the custom call's input. The format is described, not enforced (as for `strict`).

Shapes: chat `{"type": "custom", "custom": {name, description, format}}` -> tool call
`{"type": "custom", "custom": {name, input}}`; Responses `{"type": "custom", name, description, format}` ->
`custom_tool_call` item `{call_id, name, input}`, sent back as `custom_tool_call` / `custom_tool_call_output`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from msgspec import Meta

from ninfer.serve.errors import InvalidRequestError

INPUT = "input"  # the one parameter a custom tool has in the template

# The tools each protocol declares, as the OpenAPI document gives them (msgspec types each as an object; the
# converters below refuse the rest, and ninfer.serve.generation a name no call could carry or a schema structured
# output cannot enforce).
_FORMAT = {"anyOf": [{"type": "null"},
                     {"type": "object", "required": ["type"], "properties": {"type": {"const": "text"}}},
                     {"type": "object", "required": ["type", "grammar"], "properties": {
                         "type": {"const": "grammar"}, "grammar": {
                             "type": "object", "required": ["syntax", "definition"], "properties": {
                                 "syntax": {"enum": ["lark", "regex"]}, "definition": {"type": "string"}}}}}]}
_CUSTOM = {"name": {"type": "string", "minLength": 1}, "description": {"type": ["string", "null"]}, "format": _FORMAT}
_PARAMETERS = {"type": "object"}
ChatTool = Annotated[dict[str, Any], Meta(extra_json_schema={"anyOf": [
    {"required": ["type", "custom"], "properties": {"type": {"const": "custom"}, "custom": {
        "type": "object", "required": ["name"], "properties": _CUSTOM}}},
    {"required": ["function"], "properties": {"type": {"not": {"const": "custom"}}, "function": {
        "type": "object", "required": ["name"], "properties": {"name": {"type": "string"},
                                                               "parameters": _PARAMETERS}}}},
]})]
ResponsesTool = Annotated[dict[str, Any], Meta(extra_json_schema={"anyOf": [
    {"required": ["type", "name"], "properties": {"type": {"const": "custom"}, **_CUSTOM}},
    {"required": ["type", "name"], "properties": {"type": {"const": "function"}, "name": {"type": "string"},
                                                  "parameters": _PARAMETERS}},
]})]
AnthropicTool = Annotated[dict[str, Any], Meta(extra_json_schema={
    "required": ["name"], "properties": {"type": {"const": "custom"}, "name": {"type": "string"},
                                         "input_schema": _PARAMETERS}})]


def _format_note(tool_format: Any, param: str) -> str:
    if tool_format is None or (isinstance(tool_format, Mapping) and tool_format.get("type") == "text"):
        return "The raw input text of the tool, free-form."
    grammar = tool_format.get("grammar") if isinstance(tool_format, Mapping) else None
    if (
        not isinstance(grammar, Mapping)
        or tool_format.get("type") != "grammar"
        or grammar.get("syntax") not in ("lark", "regex")
        or not isinstance(grammar.get("definition"), str)
    ):
        raise InvalidRequestError(
            "a custom tool's format must be {type: text} or {type: grammar, grammar: {syntax: lark|regex, "
            "definition}}",
            param=param,
        )
    return f"The raw input text of the tool. It must match this {grammar['syntax']} grammar:\n{grammar['definition']}"


def as_function_tool(custom: Mapping[str, Any], param: str) -> dict[str, Any]:
    """A custom tool definition ({name, description?, format?}) as the chat-form function tool templates read."""
    name = custom.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("a custom tool needs a name", param=param)
    description = custom.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequestError("a custom tool's description must be a string", param=param)
    function: dict[str, Any] = {
        "name": name,
        "parameters": {
            "type": "object",
            "properties": {
                INPUT: {"type": "string", "description": _format_note(custom.get("format"), param)}
            },
            "required": [INPUT],
        },
    }
    if description:
        function["description"] = description
    return {"type": "function", "function": function}


def chat_form_tools(tools: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], frozenset[str]]:
    """Chat Completions tools with custom ones turned into functions, and the custom tools' names."""
    converted: list[dict[str, Any]] = []
    names: set[str] = set()
    for tool in tools:
        if tool.get("type") == "custom":
            custom = tool.get("custom")
            if not isinstance(custom, Mapping):
                raise InvalidRequestError("a custom tool needs a 'custom' object", param="tools")
            function = as_function_tool(custom, "tools")
            names.add(function["function"]["name"])
            converted.append(function)
        else:
            function = tool.get("function")
            if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
                raise InvalidRequestError("a function tool needs a 'function' object with a string name",
                                          param="tools")
            converted.append(dict(tool))
    return converted, frozenset(names)


def call_input(arguments: str) -> str:
    """A parsed call's arguments JSON -> the custom call's raw input. A model that wrote something other than one
    `input` string keeps its text whole (no call text is ever dropped): other or repeated keys (an XML call can
    repeat a parameter), text that is not JSON, or JSON nested too deeply for the decoder."""
    try:
        members = json.loads(arguments, object_pairs_hook=list)  # objects as [(key, value)]: repeats kept
    except (ValueError, RecursionError):
        return arguments
    if isinstance(members, list) and len(members) == 1 and isinstance(members[0], tuple):
        key, value = members[0]
        if key == INPUT and isinstance(value, str):
            return value
    return arguments


def function_arguments(raw_input: Any) -> str:
    """A custom call's input as the function arguments the template renders for earlier turns."""
    return json.dumps({INPUT: raw_input if isinstance(raw_input, str) else ""}, ensure_ascii=False)


def chat_history_call(call: Mapping[str, Any]) -> Mapping[str, Any]:
    """An earlier assistant turn's chat tool call: a custom one in the function form; others unchanged."""
    custom = call.get("custom")
    if call.get("type") != "custom" or not isinstance(custom, Mapping):
        return call
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": custom.get("name"), "arguments": function_arguments(custom.get("input"))},
    }
