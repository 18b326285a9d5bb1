"""Two tool-call edge cases through the live routes (the parsers' own tests are tests/test_frontend_tool_calls.py and
tests/test_frontend_reasoning.py), on SmolLM2, which copies a few-shot call under greedy decoding:

- a tool name of the longest allowed size, 256 bytes (VS Code Copilot's `activate_fallback_mcp_<server>_<tool>`
  names run that long), comes back whole as a structured call, streamed and not, on Chat Completions and Anthropic
  Messages. A tool one byte longer is refused with a 400 naming it: no call to it could come back as a call.
- a call written inside the reasoning block (`<think> ... <tool_call>...</tool_call> ... </think>`) is not lost: the
  call opener ends the reasoning (ninfer.frontend.reasoning), so the call comes back as a tool call, the reasoning
  before it as reasoning, and the text after it (the rest of the block, `</think>` included) as content.
"""

from __future__ import annotations

import json

import anthropic
import live_servers
import openai
import pytest
from ninfer.frontend.reasoning import split_reasoning
from ninfer.frontend.tool_calls import parse_tool_calls

QWEN_CALL = "<tool_call>\n<function={name}>\n<parameter=query>\n{query}\n</parameter>\n</function>\n</tool_call>"
SHOWN_QUERIES = ("memory leak", "crash on start")  # two examples: with one, SmolLM2 does not copy the long name
ASKED_QUERY = "slow tests"
LONGEST_NAME_BYTES = 256  # the bound (written here, not read from the parser, so that lowering it fails)
NAMED_MAX_TOKENS = 120  # the call is about 80 tokens, 49 of them the name


def _openai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _long_name(size: int) -> str:
    """A Copilot-style MCP tool name of `size` bytes, of distinct long words: few tokens to generate (49 for 256
    bytes), and no repeats (a repeated word, SmolLM2 loses count of)."""
    words = ("activate_fallback_mcp_enterprise_documentation_management_infrastructure_server_international_"
             "configuration_administration_environmental_communication_understanding_representation_responsibility_"
             "organization_independent_development_performance_information_technology_professional_experience")
    name = words[:size]
    assert len(name.encode()) == size
    return name


SEARCH_PARAMETERS = {"type": "object", "properties": {"query": {"type": "string"}}}


def _search_tool(name: str) -> dict:
    return {"type": "function",
            "function": {"name": name, "description": "Search the issue tracker", "parameters": SEARCH_PARAMETERS}}


def _search_few_shot(name: str) -> list[dict]:
    messages: list[dict] = []
    for query in SHOWN_QUERIES:
        messages += [{"role": "user", "content": f"Search for {query}."},
                     {"role": "assistant", "content": QWEN_CALL.format(name=name, query=query)}]
    return [*messages, {"role": "user", "content": f"Search for {ASKED_QUERY}."}]


def _streamed_chat(chunks) -> tuple[list[str], dict[int, str], str, str, str | None]:
    """What a client builds from chat chunks: the names as their deltas carried them, arguments per call, content,
    reasoning and the finish reason."""
    names, arguments, content, reasoning, finish = [], {}, "", "", None
    for chunk in chunks:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            content += choice.delta.content or ""
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            for delta in choice.delta.tool_calls or ():
                if delta.function.name is not None:
                    names.append(delta.function.name)
                arguments[delta.index] = arguments.get(delta.index, "") + (delta.function.arguments or "")
    return names, arguments, content, reasoning, finish


def test_a_256_byte_tool_name_comes_back_whole_and_a_longer_one_is_refused(smollm2_server):
    name, too_long = _long_name(LONGEST_NAME_BYTES), _long_name(LONGEST_NAME_BYTES + 1)
    client = _openai(smollm2_server)
    messages_client = anthropic.Anthropic(base_url=smollm2_server.url, api_key="unused", max_retries=0)
    body = {"model": "m", "messages": _search_few_shot(name), "tools": [_search_tool(name)], "temperature": 0,
            "max_tokens": NAMED_MAX_TOKENS}
    anthropic_body = {"model": "m", "messages": _search_few_shot(name), "max_tokens": NAMED_MAX_TOKENS,
                      "tools": [{"name": name, "description": "Search the issue tracker",
                                 "input_schema": SEARCH_PARAMETERS}],
                      "extra_body": {"temperature": 0}}
    # Three generations of the same length on two lanes.
    whole, chunks, events = live_servers.concurrently(
        lambda: client.chat.completions.create(**body),
        lambda: list(client.chat.completions.create(**body, stream=True)),
        lambda: list(messages_client.messages.create(**anthropic_body, stream=True)),
    )
    expected_arguments = {"query": ASKED_QUERY}

    (call,) = whole.choices[0].message.tool_calls
    assert call.function.name == name and json.loads(call.function.arguments) == expected_arguments
    assert whole.choices[0].finish_reason == "tool_calls" and not whole.choices[0].message.content

    names, arguments, content, _, finish = _streamed_chat(chunks)
    assert names == [name] and arguments == {0: call.function.arguments}  # the name whole, in its first delta
    assert finish == "tool_calls" and not content

    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert [(block.type, block.name) for block in starts] == [("tool_use", name)]
    partial = "".join(e.delta.partial_json for e in events
                      if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
    assert json.loads(partial) == expected_arguments
    assert [e.delta.stop_reason for e in events if e.type == "message_delta"] == ["tool_use"]

    # 257 bytes, or a name with a space: refused on every route, naming the tool and why.
    longer_tools = [_search_tool("search"), _search_tool(too_long)]
    with pytest.raises(openai.BadRequestError, match="tool 1's name .* is 257 bytes long; tool names may be up to 256"):
        client.chat.completions.create(**{**body, "tools": longer_tools})
    with pytest.raises(openai.BadRequestError, match="tool 0's name 'search issues' contains whitespace"):
        client.responses.create(model="m", input="hi", tools=[{"type": "function", "name": "search issues",
                                                               "parameters": SEARCH_PARAMETERS}])
    with pytest.raises(anthropic.BadRequestError, match="is 257 bytes long"):
        messages_client.messages.create(**{**anthropic_body, "tools": [{"name": too_long,
                                                                         "input_schema": SEARCH_PARAMETERS}]})


WEATHER_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n<parameter=days>\n"
                "{days}\n</parameter>\n</function>\n</tool_call>")
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}


def _thinking_few_shot() -> list[dict]:
    """Answers that think, call the tool inside the thinking, and think on: SmolLM2 writes the same for Paris."""
    messages: list[dict] = []
    for city, days in (("Rome", 2), ("Oslo", 5)):
        answer = f"<think>I need the forecast for {city}.\n{WEATHER_CALL.format(city=city, days=days)}\nThe tool " \
                 "will tell me.</think>"
        messages += [{"role": "user", "content": f"Weather in {city} for {days} days?"},
                     {"role": "assistant", "content": answer}]
    return [*messages, {"role": "user", "content": "Weather in Paris for 3 days?"}]


def test_a_call_inside_the_reasoning_is_not_lost(smollm2_server):
    client = _openai(smollm2_server)
    body = {"model": "m", "messages": _thinking_few_shot(), "tools": [WEATHER_TOOL], "temperature": 0,
            "max_tokens": 100}
    whole, chunks = live_servers.concurrently(lambda: client.chat.completions.create(**body, logprobs=True),
                                              lambda: list(client.chat.completions.create(**body, stream=True)))
    choice = whole.choices[0]
    raw = "".join(entry.token for entry in choice.logprobs.content)  # what the model wrote, tags and all
    think, call, end = raw.find("<think>"), raw.find("<tool_call>"), raw.find("</think>")
    assert 0 <= think < call < raw.find("</tool_call>") < end, f"SmolLM2 no longer writes the call inside: {raw!r}"

    (tool_call,) = choice.message.tool_calls
    assert tool_call.function.name == "get_weather"
    assert json.loads(tool_call.function.arguments) == {"city": "Paris", "days": 3}
    assert choice.finish_reason == "tool_calls"
    reasoning = choice.message.model_extra["reasoning_content"]
    assert reasoning == raw[think + len("<think>"):call].strip()  # up to the call
    # After the call: the rest of the block, as text (the frontend's split and parse of the same text agree).
    after = parse_tool_calls(split_reasoning(raw, starts_in_reasoning=False).content, [WEATHER_TOOL])
    assert choice.message.content == after.content and after.content.endswith("</think>")

    names, arguments, content, streamed_reasoning, finish = _streamed_chat(chunks)
    assert names == ["get_weather"] and arguments == {0: tool_call.function.arguments}
    assert (streamed_reasoning, content, finish) == (reasoning, choice.message.content, "tool_calls")
