"""OpenAI Responses (`/v1/responses` and friends) through the official `openai` SDK, on live servers with the real
CPU engine (tests/live_servers.py). Greedy decoding throughout, so a streamed and a non-streamed request,
or a server request and a direct engine call, must agree exactly."""

from __future__ import annotations

import json

import httpx2 as httpx
import live_servers
import openai
import pytest
from ninfer.frontend.reasoning import split_reasoning
from ninfer.serve.response_store import ResponseStore, StoredResponse

GREEDY = {"temperature": 0}
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _hermes_call(city: str) -> str:
    call = {"name": "get_weather", "arguments": {"city": city}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def _few_shot_tool_input(city: str) -> list[dict]:
    """SmolLM2 copies a pattern it was shown: three answered questions make it call the tool for the fourth."""
    items: list[dict] = []
    for shown in ("Rome", "Berlin", "Madrid"):
        items += [
            {"role": "user", "content": f"What is the weather in {shown}?"},
            {"role": "assistant", "content": _hermes_call(shown)},
        ]
    return items + [{"role": "user", "content": f"What is the weather in {city}?"}]


# -- generation ------------------------------------------------------------------------------------------------


def test_reasoning_item_matches_a_direct_engine_call(qwen35_server):
    client = _client(qwen35_server)
    response = client.responses.create(model="m", input="Hello there", max_output_tokens=16, **GREEDY)
    prompt, text = live_servers.greedy_answer(qwen35_server, [{"role": "user", "content": "Hello there"}], 16)
    expected = split_reasoning(text, starts_in_reasoning=True)
    assert response.object == "response" and response.model == qwen35_server.model_id
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning"] + (["message"] if expected.content else [])
    assert response.output[0].content[0].text == expected.reasoning
    assert response.output[0].summary == []
    assert response.usage.input_tokens == len(prompt)
    assert response.usage.output_tokens == 16
    assert response.usage.output_tokens_details.reasoning_tokens == 16
    assert response.usage.total_tokens == len(prompt) + 16
    assert len(prompt) < 65 and response.usage.input_tokens_details.cached_tokens == 0  # no whole block to reuse


def test_stream_event_sequence_and_text_agree_with_create(qwen35_server):
    client = _client(qwen35_server)
    created = client.responses.create(model="m", input="Tell me a story", max_output_tokens=12, **GREEDY)
    events = list(
        client.responses.create(
            model="m", input="Tell me a story", max_output_tokens=12, stream=True, **GREEDY
        )
    )
    types = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.reasoning_text.delta"]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.reasoning_text.delta"] * len(deltas),
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    item_id = events[2].item.id
    assert all(e.item_id == item_id for e in events if hasattr(e, "item_id"))
    text = "".join(d.delta for d in deltas)
    assert text == events[-4].text == events[-2].item.content[0].text == created.output[0].content[0].text
    final = events[-1].response
    assert final.id == events[0].response.id and final.status == "incomplete"
    assert final.output[0].id == item_id
    assert final.usage.output_tokens == created.usage.output_tokens == 12


def test_sdk_stream_helper_builds_the_same_response_as_create(smollm2_server):
    client = _client(smollm2_server)
    created = client.responses.create(model="m", input="Say hello.", max_output_tokens=64, **GREEDY)
    assert created.status == "completed", "SmolLM2 answers a greeting well within 64 tokens"
    with client.responses.stream(model="m", input="Say hello.", max_output_tokens=64, **GREEDY) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == created.output_text and final.output_text.strip()
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final.output[0].type == "message" and final.output[0].role == "assistant"
    assert final.usage.output_tokens == created.usage.output_tokens


def test_reasoning_effort_none_turns_thinking_off(qwen35_server):
    client = _client(qwen35_server)
    response = client.responses.create(
        model="m", input="Hi", max_output_tokens=8, reasoning={"effort": "none"}, **GREEDY
    )
    assert [item.type for item in response.output] == ["message"]
    assert response.usage.output_tokens_details.reasoning_tokens == 0
    _, text = live_servers.greedy_answer(qwen35_server, [{"role": "user", "content": "Hi"}], 8, enable_thinking=False)
    assert response.output_text == split_reasoning(text, starts_in_reasoning=False).content


def test_output_text_logprobs_are_chat_s_logprobs(qwen35_server):
    """`include: ["message.output_text.logprobs"]` with `top_logprobs`: the output_text carries, per answer token, what
    chat's `logprobs.content` gives for the same greedy request; streamed, the text deltas carry them in order and
    `output_text.done` all of them. Without asking, `logprobs` stays empty."""
    client = _client(qwen35_server)
    thinking_off = {"chat_template_kwargs": {"enable_thinking": False}}  # every token is answer text
    ask = {"model": "m", "max_output_tokens": 6, "top_logprobs": 3, "extra_body": thinking_off, **GREEDY,
           "include": ["message.output_text.logprobs"]}
    chat, whole, events, plain = live_servers.concurrently(
        lambda: client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hello"}],
                                               max_tokens=6, logprobs=True, top_logprobs=3,
                                               extra_body=thinking_off, **GREEDY),
        lambda: client.responses.create(input="Hello", **ask),
        lambda: list(client.responses.create(input="Hello", stream=True, **ask)),
        lambda: client.responses.create(model="m", input="Hello", max_output_tokens=6, extra_body=thinking_off,
                                        **GREEDY),
    )
    expected = [entry.model_dump() for entry in chat.choices[0].logprobs.content]
    assert len(expected) == 6 and all(len(entry["top_logprobs"]) == 3 for entry in expected)
    (part,) = whole.output[0].content
    assert part.text == chat.choices[0].message.content
    assert [entry.model_dump() for entry in part.logprobs] == expected
    streamed = [e.model_dump() for d in events if d.type == "response.output_text.delta" for e in d.logprobs]
    assert streamed == expected
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert [entry.model_dump() for entry in done.logprobs] == expected
    final = events[-1].response
    assert [entry.model_dump() for entry in final.output[0].content[0].logprobs] == expected
    assert final.top_logprobs == 3
    assert plain.output[0].content[0].logprobs == [] and plain.output_text == part.text


def test_include_alone_gives_logprobs_without_alternatives(qwen35_server):
    response = _client(qwen35_server).responses.create(
        model="m", input="Hello", max_output_tokens=5, include=["message.output_text.logprobs"],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **GREEDY,
    )
    (part,) = response.output[0].content
    assert len(part.logprobs) == response.usage.output_tokens == 5
    assert all(entry.top_logprobs == [] and entry.logprob <= 0 for entry in part.logprobs)
    assert "".join(entry.token for entry in part.logprobs).strip() == part.text.strip()


# -- conversation state ----------------------------------------------------------------------------------------


def test_previous_response_id_continues_the_stored_conversation(smollm2_server):
    client = _client(smollm2_server)
    first = client.responses.create(
        model="m", instructions="Be brief.", input="My name is Zorblax.", max_output_tokens=24, **GREEDY
    )
    follow = client.responses.create(
        model="m", previous_response_id=first.id, input="What is my name?", max_output_tokens=24, **GREEDY
    )
    # Instructions are not carried over; the earlier turn and its answer are.
    explicit = [
        {"role": "user", "content": "My name is Zorblax."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ]
    assert (
        follow.usage.input_tokens
        == client.responses.input_tokens.count(model="m", input=explicit).input_tokens
    )
    assert follow.previous_response_id == first.id
    again = client.responses.create(model="m", input=explicit, max_output_tokens=24, **GREEDY)
    assert again.output_text == follow.output_text


def test_retrieve_list_input_items_and_delete(smollm2_server):
    client = _client(smollm2_server)
    items = [{"role": "user", "content": f"Count: {n}"} for n in range(5)]
    response = client.responses.create(model="m", input=items, max_output_tokens=4, **GREEDY)
    assert client.responses.retrieve(response.id).to_dict() == response.to_dict()

    listed = list(client.responses.input_items.list(response.id, limit=2))  # the SDK follows `after` pages
    assert [i.content[0].text for i in listed] == [f"Count: {n}" for n in reversed(range(5))]
    ascending = client.responses.input_items.list(response.id, order="asc", limit=3)
    assert [i.content[0].text for i in ascending.data] == ["Count: 0", "Count: 1", "Count: 2"]
    assert ascending.has_more and len({i.id for i in listed}) == 5

    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError, match=response.id):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError, match="previous response"):
        client.responses.create(model="m", previous_response_id=response.id, input="hi", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(response.id)


def test_store_false_keeps_nothing(qwen35_server):
    client = _client(qwen35_server)
    response = client.responses.create(model="m", input="x", store=False, max_output_tokens=2)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_response_store_keeps_the_most_recently_used():
    store = ResponseStore(capacity=3)
    for n in range(3):
        store.put(StoredResponse({"id": f"r{n}"}, [], []))
    assert store.get("r0") is not None  # r0 used: r1 is now the oldest
    store.put(StoredResponse({"id": "r3"}, [], []))
    assert store.get("r1") is None and len(store) == 3
    assert all(store.get(i) is not None for i in ("r0", "r2", "r3"))
    assert store.delete("r0") and not store.delete("r0")
    with pytest.raises(ValueError):
        ResponseStore(capacity=0)


# -- tools -----------------------------------------------------------------------------------------------------


def test_function_call_round_trip(smollm2_server):
    client = _client(smollm2_server)
    request = {
        "model": "m",
        "input": _few_shot_tool_input("Paris"),
        "tools": [WEATHER_TOOL],
        "max_output_tokens": 48,
        **GREEDY,
    }
    response, events = live_servers.concurrently(lambda: client.responses.create(**request),
                                                 lambda: list(client.responses.create(**request, stream=True)))
    assert response.status == "completed"
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call") and call.status == "completed"

    added = [
        e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"
    ]
    assert len(added) == 1 and added[0].name == "get_weather" and added[0].arguments == ""
    streamed = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert streamed == done.arguments == call.arguments
    assert events[-1].type == "response.completed"

    # The tool's answer goes back as a function_call_output item continuing the stored response.
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "22 degrees and sunny"}
    answered = client.responses.create(
        model="m",
        previous_response_id=response.id,
        input=[output],
        tools=[WEATHER_TOOL],
        max_output_tokens=32,
        **GREEDY,
    )
    assert answered.status in ("completed", "incomplete")
    explicit = [
        *_few_shot_tool_input("Paris"),
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        output,
    ]
    count = client.responses.input_tokens.count(model="m", input=explicit, tools=[WEATHER_TOOL]).input_tokens
    assert answered.usage.input_tokens == count
    # The same conversation in chat form renders to the same prompt.
    chat = [
        *_few_shot_tool_input("Paris"),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "22 degrees and sunny"},
    ]
    chat_tools = [{"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}]
    rendered = smollm2_server.engine.frontend.render(chat, tools=chat_tools)
    assert count == len(smollm2_server.engine.frontend.encode(rendered.text))
    assert "22 degrees and sunny" in rendered.text


def test_truncated_tool_call_still_yields_a_call(smollm2_server):
    client = _client(smollm2_server)
    full = client.responses.create(
        model="m", input=_few_shot_tool_input("Paris"), tools=[WEATHER_TOOL], max_output_tokens=48, **GREEDY
    )
    cut = full.usage.output_tokens - 3  # inside the closing `</tool_call>`
    response = client.responses.create(
        model="m", input=_few_shot_tool_input("Paris"), tools=[WEATHER_TOOL], max_output_tokens=cut, **GREEDY
    )
    assert response.status == "incomplete"
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    issues = response.model_extra["ninfer"]["tool_parse_issues"]
    assert any(issue["kind"] == "truncated" for issue in issues)


ADVISORY = "tool_choice and strict are advisory: the model was asked, not forced"


@pytest.mark.parametrize(("tool_choice", "strict", "advised"), [
    ("required", False, True),
    ({"type": "function", "name": "get_weather"}, False, True),
    ("auto", True, True),
    ("auto", False, False),
])
def test_forced_tool_choice_and_strict_are_reported_as_advisory(qwen35_server, tool_choice, strict, advised):
    """`ninfer.tool_choice` on the response (and on the streamed final response) says that a demanded call or a
    strict tool was asked for, not forced; plain `auto` has nothing to report."""
    client = _client(qwen35_server)
    body = {"model": "m", "input": "hi", "tools": [WEATHER_TOOL | ({"strict": True} if strict else {})],
            "tool_choice": tool_choice, "max_output_tokens": 2, **GREEDY}
    whole, events = live_servers.concurrently(lambda: client.responses.create(**body),
                                              lambda: list(client.responses.create(**body, stream=True)))
    expected = {"requested": tool_choice, "strict": strict, "enforced": False, "note": ADVISORY} if advised else None
    assert (whole.model_extra.get("ninfer") or {}).get("tool_choice") == expected
    final = events[-1].response
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert (final.model_extra.get("ninfer") or {}).get("tool_choice") == expected


def test_context_overflow_is_a_400_with_the_numbers(qwen35_server):
    client = _client(qwen35_server)
    n_ctx = qwen35_server.engine.info.max_context
    text = "word " * n_ctx
    n_prompt = client.responses.input_tokens.count(model="m", input=text).input_tokens
    assert n_prompt > n_ctx
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", input=text, max_output_tokens=4)
    body = info.value.body
    assert body["type"] == "exceed_context_size_error" and body["code"] == "context_length_exceeded"
    assert body["n_prompt_tokens"] == n_prompt and body["n_ctx"] == n_ctx


# -- refusals --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "message", "param"),
    [
        ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "item_reference", "input"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "only function and custom tools", "tools"),
        ({"input": "hi", "background": True}, 400, "background", "background"),
        ({"input": "hi", "reasoning": {"effort": "extreme"}}, 400, "reasoning.effort", "reasoning.effort"),
        ({"input": [{"role": "tool", "content": "x"}]}, 400, "role", "input"),
        ({"input": [{"type": ["x"]}]}, 400, "type must be a string", "input"),
        ({"input": "hi", "max_output_tokens": 0}, 400, ">= 1", None),
        ({"input": "hi", "previous_response_id": "resp-nope"}, 404, "resp-nope", None),
        (
            {
                "input": "hi",
                "text": {
                    "format": {"type": "json_schema", "name": "x", "schema": {"not": {"type": "string"}}}
                },
            },
            400,
            '"not"',
            "text.format.schema",
        ),
        ({"input": "hi", "text": {"format": {"type": "yaml"}}}, 400, "text.format.type", "text.format.type"),
    ],
)
def test_refusals_use_the_openai_error_shape(qwen35_server, body, status, message, param):
    reply = httpx.post(qwen35_server.url + "/v1/responses", json={"model": "m", **body}, timeout=60)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert message in error["message"]
    assert set(error) >= {"message", "type", "param", "code"}
    if param is not None:
        assert error["param"] == param


def test_malformed_json_is_a_400(qwen35_server):
    reply = httpx.post(
        qwen35_server.url + "/v1/responses",
        content=b'{"input": ',
        timeout=60,
        headers={"content-type": "application/json"},
    )
    assert reply.status_code == 400 and "error" in reply.json()


def test_a_disconnected_stream_frees_its_lane(qwen35_server):
    tokens_before = live_servers.idle_tokens_generated(qwen35_server)
    before = live_servers.disconnect_releases(qwen35_server)
    body = {"model": "m", "input": "Write a long essay.", "max_output_tokens": 900, "stream": True}
    with httpx.stream("POST", qwen35_server.url + "/v1/responses", json=body, timeout=60) as reply:
        lines = reply.iter_lines()
        while "response.reasoning_text.delta" not in next(lines):
            pass
        assert qwen35_server.engine.stats().busy_lanes == 1
    # cancelled, not run to its end: fewer than its 900 tokens were generated
    assert live_servers.cut_short(qwen35_server, tokens_before, 900)
    assert live_servers.released_within_bound(qwen35_server, before)  # within 1 s by the server's clock
