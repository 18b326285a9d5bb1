"""Custom (freeform) tools, as VS Code Copilot sends them, through the official `openai` SDK on the live SmolLM2
server: chat (`tools: [{type: custom, custom: {...}}]`) and Responses (`tools: [{type: custom, name, ...}]`), whole
and streamed. SmolLM2 copies the few-shot call form of its history (Qwen XML), so the call is the model's own
text; its raw input, with quotes, braces and newlines that JSON would have to escape, must come back verbatim. A custom
call sent back in the history must reach the template as the function call it was shown as (checked on the tiny
Qwen3.5 server, whose template renders earlier calls' arguments, by the exact prompt length)."""

from __future__ import annotations

import json
import random
import string

import live_servers
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ninfer.serve.custom_tools import as_function_tool, call_input, function_arguments
from ninfer.serve.errors import InvalidRequestError

GRAMMAR = {
    "type": "grammar",
    "grammar": {"syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'},
}
CUSTOM = {"name": "apply_patch", "description": "Apply a patch to a file", "format": GRAMMAR}


def patch(path: str) -> str:
    return f'*** Begin Patch\n*** Update File: {path}\n-x = {{"a": 1}}\n+x = {{"a": 2}}\n*** End Patch'


def _call_text(raw_input: str) -> str:
    return f"<tool_call>\n<function=apply_patch>\n<parameter=input>\n{raw_input}\n</parameter>\n</function>\n</tool_call>"


def _few_shot() -> list[dict]:
    messages: list[dict] = []
    for path in ("app.py", "lib.py"):
        messages += [
            {"role": "user", "content": f"Set a to 2 in {path}"},
            {"role": "assistant", "content": _call_text(patch(path))},
        ]
    return messages + [{"role": "user", "content": "Set a to 2 in main.py"}]


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_chat_custom_tool_call_whole_and_streamed(smollm2_server):
    client = _client(smollm2_server)
    body = {"model": "m", "messages": _few_shot(), "tools": [{"type": "custom", "custom": CUSTOM}],
            "temperature": 0, "max_tokens": 70}
    r, stream = live_servers.concurrently(lambda: client.chat.completions.create(**body),
                                          lambda: list(client.chat.completions.create(**body, stream=True)))
    (call,) = r.choices[0].message.tool_calls
    assert call.type == "custom" and call.custom.name == "apply_patch"
    assert call.custom.input == patch("main.py")
    assert r.choices[0].finish_reason == "tool_calls"

    calls, finish = [], None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            calls += [d.to_dict() for d in choice.delta.tool_calls or ()]
    assert calls == [
        {
            "index": 0,
            "id": calls[0]["id"],
            "type": "custom",
            "custom": {"name": "apply_patch", "input": patch("main.py")},
        }
    ]
    assert finish == "tool_calls"


def _prompt_tokens_of_function_form(server, user_text: str) -> int:
    """Prompt length of the conversation in the function form the server should turn a custom call into."""
    messages = [
        {"role": "user", "content": user_text},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "apply_patch", "arguments": function_arguments(patch("main.py"))},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Done"},
    ]
    frontend = server.engine.frontend
    return len(frontend.encode(frontend.render(messages, tools=[as_function_tool(CUSTOM, "tools")]).text))


def test_chat_history_with_a_custom_call_and_its_result(qwen35_server):
    # The Qwen3.5 template renders earlier calls' arguments: the raw input must reach it as the `input` argument.
    client = _client(qwen35_server)
    history = [
        {"role": "user", "content": "Set a to 2 in main.py"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "custom",
                    "custom": {"name": "apply_patch", "input": patch("main.py")},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Done"},
    ]
    r = client.chat.completions.create(
        model="m", messages=history, tools=[{"type": "custom", "custom": CUSTOM}], temperature=0, max_tokens=2
    )
    assert r.usage.prompt_tokens == _prompt_tokens_of_function_form(qwen35_server, "Set a to 2 in main.py")


def _responses_input() -> list[dict]:
    return [{"type": "message", "role": m["role"], "content": m["content"]} for m in _few_shot()]


def test_responses_custom_tool_call_whole_and_streamed(smollm2_server):
    client = _client(smollm2_server)
    body = {"model": "m", "input": _responses_input(), "tools": [{"type": "custom", **CUSTOM}], "temperature": 0,
            "max_output_tokens": 70}
    r, events = live_servers.concurrently(lambda: client.responses.create(**body),
                                          lambda: list(client.responses.create(**body, stream=True)))
    (call,) = [item for item in r.output if item.type == "custom_tool_call"]
    assert call.name == "apply_patch" and call.input == patch("main.py") and call.id.startswith("ctc")

    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" not in kinds
    (done,) = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    deltas = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    assert done.input == deltas == patch("main.py")
    (item_done,) = [
        e for e in events if e.type == "response.output_item.done" and e.item.type == "custom_tool_call"
    ]
    assert item_done.item.input == patch("main.py") and item_done.item.id == done.item_id
    assert events[-1].response.output[-1].input == patch("main.py")


def test_responses_custom_call_sent_back_reaches_the_template(qwen35_server):
    follow_up = _client(qwen35_server).responses.create(
        model="m",
        input=[
            {"type": "message", "role": "user", "content": "Set a to 2 in main.py"},
            {
                "type": "custom_tool_call",
                "call_id": "call_1",
                "name": "apply_patch",
                "input": patch("main.py"),
            },
            {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done"},
        ],
        tools=[{"type": "custom", **CUSTOM}],
        temperature=0,
        max_output_tokens=2,
    )
    assert follow_up.usage.input_tokens == _prompt_tokens_of_function_form(
        qwen35_server, "Set a to 2 in main.py"
    )


def test_a_custom_tool_with_a_bad_format_is_a_400(smollm2_server):
    client = _client(smollm2_server)
    bad = {
        "type": "custom",
        "name": "apply_patch",
        "format": {"type": "grammar", "grammar": {"syntax": "ebnf"}},
    }
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="m", input="hi", tools=[bad], max_output_tokens=2)
    assert caught.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], tools=[{"type": "custom"}], max_tokens=2
        )


def test_raw_input_survives_the_function_form_round_trip():
    rng = random.Random()
    alphabet = string.printable + "é☕\u2028\"'{}[]\\"
    for _ in range(500):
        raw = "".join(rng.choice(alphabet) for _ in range(rng.randrange(60)))
        assert call_input(function_arguments(raw)) == raw
    # What the model wrote that is not one `input` string is kept whole.
    for other in ('{"path": "a.py"}', "not json {", '{"input": 3}', '{"input": "a", "extra": 1}'):
        assert call_input(other) == other


def _one_input_string(value) -> bool:
    return isinstance(value, dict) and list(value) == ["input"] and isinstance(value["input"], str)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["input", "x"]) | st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)
# Arguments that are not one `input` string, by construction.
OTHER_ARGUMENTS = st.one_of(
    st.text().filter(lambda text: not text.lstrip().startswith("{")),
    st.text().filter(lambda text: '"' not in text).map(lambda text: '{"input": "' + text),  # cut off
    JSON_VALUES.filter(lambda value: not _one_input_string(value)).map(json.dumps),
    st.lists(st.text(), min_size=2, max_size=3).map(
        lambda values: "{" + ", ".join(f'"input": {json.dumps(v)}' for v in values) + "}"  # repeated
    ),
    st.integers(1, 4).map(lambda k: '{"input": ' + "[" * (5000 * k)),  # deeper than the decoder allows
)


@settings(max_examples=200, deadline=None)
@given(st.text(), st.sampled_from([None, 0, 2]), st.booleans())
def test_call_input_returns_the_one_input_string_however_it_is_written(raw, indent, ascii_only):
    assert call_input(json.dumps({"input": raw}, indent=indent, ensure_ascii=ascii_only)) == raw


@settings(max_examples=300, deadline=None)
@given(OTHER_ARGUMENTS)
def test_call_input_never_raises_and_keeps_anything_else_whole(arguments):
    assert call_input(arguments) == arguments


def test_the_template_sees_one_string_parameter_with_the_format():
    function = as_function_tool(CUSTOM, "tools")["function"]
    assert function["name"] == "apply_patch" and function["description"] == "Apply a patch to a file"
    assert function["parameters"]["required"] == ["input"]
    assert GRAMMAR["grammar"]["definition"] in function["parameters"]["properties"]["input"]["description"]
    with pytest.raises(InvalidRequestError):
        as_function_tool({"description": "no name"}, "tools")
