"""OpenAI Chat Completions and Completions through the official `openai` SDK, on the live servers of
tests/live_servers.py (real app, real CPU engine). The tiny Qwen3.5 model writes noise, which is enough
to check shapes, consistency between streamed and whole answers, stops, logprobs and seeds; SmolLM2 copies a
few-shot tool-call pattern, which gives real tool-call round trips for each written form."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import live_servers
import openai
import pytest
from ninfer.artifact.reader import read_artifact

HELLO = [{"role": "user", "content": "Hello, who are you?"}]


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _stream_text(stream) -> tuple[str, str, str | None, object]:
    content, reasoning, finish, usage = [], [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            reasoning.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
            finish = choice.finish_reason or finish
    return "".join(content), "".join(reasoning), finish, usage


def test_chat_matches_the_engine_and_splits_reasoning(qwen35_server):
    client = _client(qwen35_server)
    r = client.chat.completions.create(model="any", messages=HELLO, temperature=0, max_tokens=12)
    message = r.choices[0].message
    frontend = qwen35_server.engine.frontend
    rendered = frontend.render(HELLO)
    assert rendered.starts_in_reasoning  # Qwen3.5 thinks by default
    direct = frontend.decode(live_servers.greedy_tokens(qwen35_server.engine, frontend.encode(rendered.text), 12))
    # Cut off inside the think block: all of it is reasoning (whitespace around it is layout).
    assert message.model_extra["reasoning_content"] == direct.strip()
    assert message.content == ""
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12 and r.usage.completion_tokens_details.reasoning_tokens == 12
    assert r.usage.prompt_tokens == len(frontend.encode(rendered.text))
    # Fewer than 65 prompt tokens: no whole block before the last token, nothing to reuse.
    assert r.usage.prompt_tokens < 65 and r.usage.prompt_tokens_details.cached_tokens == 0
    assert r.model == qwen35_server.model_id and r.object == "chat.completion"


def test_thinking_off_gives_content_only(qwen35_server):
    client = _client(qwen35_server)
    r = client.chat.completions.create(
        model="m",
        messages=HELLO,
        temperature=0,
        max_tokens=8,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert r.choices[0].message.content
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})
    assert r.usage.completion_tokens_details.reasoning_tokens == 0
    same = client.chat.completions.create(
        model="m", messages=HELLO, temperature=0, max_tokens=8, reasoning_effort="none"
    )
    assert same.choices[0].message.content == r.choices[0].message.content


def test_streamed_chat_equals_the_whole_answer(qwen35_server):
    client = _client(qwen35_server)
    whole = client.chat.completions.create(model="m", messages=HELLO, temperature=0, max_tokens=16)
    stream = client.chat.completions.create(
        model="m",
        messages=HELLO,
        temperature=0,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    content, reasoning, finish, usage = _stream_text(stream)
    assert reasoning == whole.choices[0].message.model_extra["reasoning_content"]
    assert content == whole.choices[0].message.content
    assert finish == "length"
    assert usage.completion_tokens == 16 and usage.prompt_tokens == whole.usage.prompt_tokens
    # The same prompt a second time: still nothing read from the prefix cache (fewer than 65 prompt tokens: no whole
    # block before the last token).
    assert usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens_details.cached_tokens == 0


def test_stop_string_across_token_boundaries(qwen35_server):
    """A stop made of the end of one token and the start of the next ends the text right before it."""
    client = _client(qwen35_server)
    first = client.completions.create(
        model="m", prompt="The quick brown fox", temperature=0, max_tokens=12, logprobs=0
    )
    tokens = first.choices[0].logprobs.tokens
    text = first.choices[0].text
    i = next(i for i in range(2, len(tokens) - 1) if len(tokens[i]) >= 2 and len(tokens[i + 1]) >= 2)
    boundary = sum(len(t) for t in tokens[: i + 1])
    stop = text[boundary - 2 : boundary + 2]
    expected = text[: text.find(stop)]
    for stream in (False, True):
        r = client.completions.create(
            model="m", prompt="The quick brown fox", temperature=0, max_tokens=12, stop=[stop], stream=stream
        )
        if stream:
            chunks = list(r)
            got = "".join(c.choices[0].text for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            got, finish = r.choices[0].text, r.choices[0].finish_reason
        assert got == expected and finish == "stop"


def test_logprobs_are_the_greedy_choices(qwen35_server):
    client = _client(qwen35_server)
    r = client.chat.completions.create(
        model="m", messages=HELLO, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3
    )
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens == 6
    for entry in entries:
        assert len(entry.top_logprobs) == 3
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert entry.top_logprobs[0].token == entry.token  # greedy takes the most likely token
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-5)
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
    streamed = client.chat.completions.create(
        model="m", messages=HELLO, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3, stream=True
    )
    tokens = [e.token for c in streamed for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
    assert tokens == [e.token for e in entries]


def test_streamed_completion_logprobs_equal_the_whole_answer_s(qwen35_server):
    """Streamed, each chunk carries the legacy logprobs object of the tokens it releases (`text_offset` counting
    from the start of the whole text, echo included); together they are the whole answer's."""
    client = _client(qwen35_server)
    body = {"model": "m", "prompt": "The quick brown fox", "temperature": 0, "max_tokens": 10, "logprobs": 3,
            "echo": True}
    whole, chunks = live_servers.concurrently(lambda: client.completions.create(**body),
                                              lambda: list(client.completions.create(**body, stream=True)))
    fields = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    streamed: dict[str, list] = {name: [] for name in fields}
    for choice in (c.choices[0] for c in chunks if c.choices and c.choices[0].logprobs):
        lengths = {len(getattr(choice.logprobs, name)) for name in fields}
        assert len(lengths) == 1 and lengths != {0}, choice.logprobs
        for name in fields:
            streamed[name] += getattr(choice.logprobs, name)
    expected = whole.choices[0].logprobs
    assert len(expected.tokens) == whole.usage.completion_tokens == 10
    assert all(len(top) == 3 for top in expected.top_logprobs)
    assert streamed["tokens"] == expected.tokens and streamed["text_offset"] == expected.text_offset
    # The values come from two lanes of a batch: equal, up to how a batch's make-up may round them.
    assert streamed["token_logprobs"] == pytest.approx(expected.token_logprobs, abs=1e-4)
    for got, want in zip(streamed["top_logprobs"], expected.top_logprobs, strict=True):
        assert got == pytest.approx(want, abs=1e-4)


def test_seed_makes_sampling_reproducible(qwen35_server):
    client = _client(qwen35_server)

    def sample(seed: int) -> str:
        r = client.completions.create(
            model="m", prompt="Once upon a time", temperature=1.0, max_tokens=10, seed=seed
        )
        return r.choices[0].text

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)  # the random model's distribution is nearly flat: collisions are negligible


def test_completions_prompt_forms_and_echo(qwen35_server):
    client = _client(qwen35_server)
    frontend = qwen35_server.engine.frontend
    ids = frontend.encode("Hello there")
    by_text = client.completions.create(model="m", prompt="Hello there", temperature=0, max_tokens=5)
    by_ids = client.completions.create(model="m", prompt=ids, temperature=0, max_tokens=5)
    assert by_text.choices[0].text == by_ids.choices[0].text
    assert by_text.choices[0].text == frontend.decode(live_servers.greedy_tokens(qwen35_server.engine, ids, 5))
    echoed = client.completions.create(
        model="m", prompt="Hello there", temperature=0, max_tokens=5, echo=True
    )
    assert echoed.choices[0].text == "Hello there" + by_text.choices[0].text
    default = client.completions.create(model="m", prompt="Hello there", temperature=0)
    assert default.usage.completion_tokens == 16  # OpenAI's default max_tokens


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_logit_bias_is_refused_on_both_routes(qwen35_server, route):
    """The sampler has no per-token bias: both routes refuse a non-empty logit_bias, naming it, rather than one of
    them ignoring it; an empty one asks for nothing and is served."""
    client = _client(qwen35_server)

    def create(bias: dict):
        if route == "chat":
            return client.chat.completions.create(model="m", messages=HELLO, max_tokens=1, logit_bias=bias)
        return client.completions.create(model="m", prompt="x", max_tokens=1, logit_bias=bias)

    with pytest.raises(openai.BadRequestError) as info:
        create({"11": -100})
    assert info.value.body["param"] == "logit_bias" and "logit_bias is not supported" in info.value.body["message"]
    assert create({}).usage.completion_tokens == 1


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_context_overflow_is_a_400_with_the_numbers(qwen35_server, route):
    client = _client(qwen35_server)
    n_ctx = qwen35_server.engine.info.max_context
    frontend = qwen35_server.engine.frontend
    with pytest.raises(openai.BadRequestError) as info:
        if route == "completions":
            n_prompt = n_ctx + 5
            client.completions.create(model="m", prompt=[11] * n_prompt, max_tokens=4)
        else:
            messages = [{"role": "user", "content": "word " * n_ctx}]
            n_prompt = len(frontend.encode(frontend.render(messages).text))  # the rendered prompt's tokens
            assert n_prompt > n_ctx
            client.chat.completions.create(model="m", messages=messages, max_tokens=4)
    body = info.value.body
    assert body["type"] == "exceed_context_size_error" and body["code"] == "context_length_exceeded"
    assert body["n_prompt_tokens"] == n_prompt and body["n_ctx"] == n_ctx


@pytest.mark.parametrize(
    "payload",
    [
        b'{"messages": [',
        b"not json",
        b'{"messages": "hi"}',
        b'{"messages": []}',
        b'{"messages": [{"role": "user", "content": 5}]}',
        b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
        b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -7}',
        b'{"messages": [{"role": "user", "content": "x"}], "seed": 18446744073709551616}',
        b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": 5}]}',
    ],
)
def test_malformed_requests_get_openai_400s(qwen35_server, payload):
    r = httpx.post(
        f"{qwen35_server.url}/v1/chat/completions",
        content=payload,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["message"]


def test_tokenize_detokenize_and_template_routes(qwen35_server):
    url, frontend = qwen35_server.url, qwen35_server.engine.frontend
    ids = httpx.post(f"{url}/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert ids == frontend.encode("Hello world")
    pieces = httpx.post(f"{url}/tokenize", json={"content": "Hello world", "with_pieces": True}).json()[
        "tokens"
    ]
    assert "".join(p["piece"] for p in pieces) == "Hello world"
    assert httpx.post(f"{url}/detokenize", json={"tokens": ids}).json()["content"] == "Hello world"
    assert httpx.post(f"{url}/detokenize", json={"tokens": [10**9]}).status_code == 400
    prompt = httpx.post(f"{url}/apply-template", json={"messages": HELLO}).json()["prompt"]
    assert prompt == frontend.render(HELLO).text


def test_a_developer_message_is_the_system_prompt_in_chat_and_apply_template(qwen35_server):
    """OpenAI's `developer` role, which the Qwen3.5 template does not know, is rendered as `system` (as on
    /v1/responses); a developer message later in the conversation too."""
    url = qwen35_server.url
    as_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                 {"role": "assistant", "content": "Hello."}, {"role": "system", "content": "Now be formal."},
                 {"role": "user", "content": "Bye"}]
    as_developer = [{**m, "role": "developer"} if m["role"] == "system" else m for m in as_system]
    expected = qwen35_server.engine.frontend.render(as_system).text
    reply = httpx.post(f"{url}/apply-template", json={"messages": as_developer})
    assert reply.status_code == 200, reply.text
    assert reply.json()["prompt"] == expected
    chat = httpx.post(f"{url}/v1/chat/completions", json={"messages": as_developer, "max_tokens": 1}, timeout=60)
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["prompt_tokens"] == len(qwen35_server.engine.frontend.encode(expected))


def test_model_listings(qwen35_server):
    client = _client(qwen35_server)
    (model,) = client.models.list().data
    assert model.id == qwen35_server.model_id
    llama = httpx.get(f"{qwen35_server.url}/models").json()
    (row,) = llama["models"]
    info = qwen35_server.engine.info
    assert row["context"] == info.max_context and row["modalities"] == {"text": True}
    assert row["memory"]["artifact_bytes"] == info.artifact_bytes
    # the artifact's recipe and its tensors per encoding, as the manifest lists them
    manifest = read_artifact(info.path)
    assert (
        row["encoding"]
        == info.encoding
        == {
            "recipe": "bf16",
            "tensors": dict(Counter(t["encoding"] for t in manifest.tensors)),
        }
    )
    assert set(row["encoding"]["tensors"]) == {"bf16", "f32"}
    assert httpx.get(f"{qwen35_server.url}/health").json() == {"status": "ok"}


def test_metrics_count_requests_and_tokens(qwen35_server):
    client = _client(qwen35_server)
    client.completions.create(model="m", prompt="count me", temperature=0, max_tokens=3)
    text = httpx.get(f"{qwen35_server.url}/metrics").text
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert samples['ninfer_requests_total{route="/v1/completions",status="200"}'] >= 1
    assert samples["ninfer_generated_tokens_total"] >= 3
    assert samples["ninfer_lanes"] == qwen35_server.engine.info.max_concurrency
    assert samples["ninfer_time_to_first_token_seconds_count"] >= 1
    assert "ninfer_time_per_output_token_seconds_bucket" in text and "ninfer_queue_requests" in text


# ---------------------------------------------------------------------------------------------------------------
# Tool calls: SmolLM2 copies the call form its history shows; each parser reads its own form.

CALLS = {
    "qwen_xml": "<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n<parameter=days>\n"
    "{days}\n</parameter>\n</function>\n</tool_call>",
    "hermes_json": '<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}", "days": {days}}}}}\n'
    "</tool_call>",
    "claude_xml": '<function_calls>\n<invoke name="get_weather">\n<parameter name="city">{city}</parameter>\n'
    '<parameter name="days">{days}</parameter>\n</invoke>\n</function_calls>',
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]


def _few_shot(form: str) -> list[dict]:
    messages: list[dict] = []
    for city, days in (("Rome", 2), ("Oslo", 5)):
        messages += [
            {"role": "user", "content": f"Weather in {city} for {days} days?"},
            {"role": "assistant", "content": CALLS[form].format(city=city, days=days)},
        ]
    return messages + [{"role": "user", "content": "Weather in Paris for 3 days?"}]


@pytest.mark.parametrize("form", sorted(CALLS))
def test_tool_call_round_trip(smollm2_server, form):
    client = _client(smollm2_server)
    body = {"model": "m", "messages": _few_shot(form), "tools": TOOLS, "temperature": 0, "max_tokens": 60}
    r, stream = live_servers.concurrently(lambda: client.chat.completions.create(**body),
                                          lambda: list(client.chat.completions.create(**body, stream=True)))
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}  # typed by the schema
    assert r.choices[0].finish_reason == "tool_calls"
    names, arguments, ids, finish = {}, {}, {}, None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or ():
                if delta.function.name is not None:
                    names[delta.index], ids[delta.index] = delta.function.name, delta.id
                arguments[delta.index] = arguments.get(delta.index, "") + (delta.function.arguments or "")
    assert names == {0: "get_weather"} and ids[0].startswith("call")
    assert arguments[0] == call.function.arguments and finish == "tool_calls"


def test_truncated_tool_call_is_recovered_and_reported(smollm2_server):
    client = _client(smollm2_server)
    r = client.chat.completions.create(
        model="m", messages=_few_shot("claude_xml"), tools=TOOLS, temperature=0, max_tokens=22
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and r.choices[0].finish_reason == "length"
    # Whatever arrived of the cut-off value is kept: a prefix of the city the model was copying.
    assert "Paris".startswith(json.loads(call.function.arguments).get("city", ""))
    (issue,) = [i for i in r.model_extra["ninfer"]["tool_parse_issues"] if i["kind"] == "truncated"]
    assert len(issue["snippet"]) <= 100


def test_truncated_qwen_xml_call_is_recovered_whole_and_streamed(smollm2_server):
    """A Qwen3.5 XML call cut off by max_tokens (the cut placed from the full run's own tokens): inside the next
    `<parameter=` tag, the complete parameters are kept and the partial tag is the reported snippet; inside a value,
    what arrived is kept, typed by the schema. Streamed deltas build the same call."""
    client = _client(smollm2_server)
    body = {"model": "m", "messages": _few_shot("qwen_xml"), "tools": TOOLS, "temperature": 0}
    full = client.chat.completions.create(**body, max_tokens=60, logprobs=True)
    assert json.loads(full.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris", "days": 3}
    tokens = [entry.token for entry in full.choices[0].logprobs.content]

    def cut_after(marker: str) -> int:
        return next(k for k in range(len(tokens)) if "".join(tokens[:k]).endswith(marker))

    in_tag, in_value = cut_after("\n<parameter=days"), cut_after("<parameter=days>\n3")
    tag, value, streamed = live_servers.concurrently(
        lambda: client.chat.completions.create(**body, max_tokens=in_tag),
        lambda: client.chat.completions.create(**body, max_tokens=in_value),
        lambda: list(client.chat.completions.create(**body, max_tokens=in_tag, stream=True)),
    )
    for r, arguments in ((tag, {"city": "Paris"}), (value, {"city": "Paris", "days": 3})):
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == arguments
        assert r.choices[0].finish_reason == "length" and not r.choices[0].message.content
    (issue,) = tag.model_extra["ninfer"]["tool_parse_issues"]
    assert issue["kind"] == "truncated" and issue["snippet"] == "<parameter=days"
    assert issue["discarded_chars"] == len("<parameter=days")
    deltas = [d for chunk in streamed for choice in chunk.choices for d in choice.delta.tool_calls or ()]
    assert [d.function.name for d in deltas if d.function.name] == ["get_weather"]
    assert "".join(d.function.arguments or "" for d in deltas) == tag.choices[0].message.tool_calls[0].function.arguments


def test_tool_choice_none_and_advisory_required(smollm2_server):
    client = _client(smollm2_server)
    none = client.chat.completions.create(
        model="m",
        messages=_few_shot("hermes_json"),
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=30,
    )
    assert none.choices[0].message.tool_calls is None and "<tool_call>" in none.choices[0].message.content
    required = client.chat.completions.create(
        model="m", messages=HELLO, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=4
    )
    assert required.model_extra["ninfer"]["tool_choice"]["enforced"] is False


ADVISORY = "tool_choice and strict are advisory: the model was asked, not forced"


@pytest.mark.parametrize(("tool_choice", "strict", "advised"), [
    ("required", False, True),
    ({"type": "function", "function": {"name": "get_weather"}}, False, True),
    ("auto", True, True),
    ("auto", False, False),
])
def test_named_tool_choice_and_strict_are_reported_as_advisory(qwen35_server, tool_choice, strict, advised):
    """`ninfer.tool_choice` says that a demanded call (required, a named function) or a strict tool was asked for,
    not forced; whole and streamed (on the last chunk) alike. Plain `auto` has nothing to report."""
    client = _client(qwen35_server)
    function = TOOLS[0]["function"] | ({"strict": True} if strict else {})
    body = {"model": "m", "messages": HELLO, "tools": [{"type": "function", "function": function}],
            "tool_choice": tool_choice, "temperature": 0, "max_tokens": 2}
    whole, chunks = live_servers.concurrently(lambda: client.chat.completions.create(**body),
                                              lambda: list(client.chat.completions.create(**body, stream=True)))
    expected = {"requested": tool_choice, "strict": strict, "enforced": False, "note": ADVISORY} if advised else None
    assert (whole.model_extra.get("ninfer") or {}).get("tool_choice") == expected
    (last,) = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert (last.model_extra.get("ninfer") or {}).get("tool_choice") == expected


def test_sse_ping_interval_sets_the_stream_keepalives(smollm2_server):
    # llama-ui sends sse_ping_interval (seconds) with every stream: keepalive comments while the stream is silent.
    # A 5 ms interval makes them certain during the prefill of a long prompt; -1 asks for none. The data frames are
    # the same either way.
    client = httpx.Client(base_url=smollm2_server.url, timeout=300)
    body = {"model": "m", "temperature": 0, "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "Repeat after me: " + "the lighthouse keeper " * 40}]}

    def lines(interval: float) -> list[str]:
        with client.stream("POST", "/v1/chat/completions", json={**body, "sse_ping_interval": interval}) as response:
            assert response.status_code == 200
            return [line for line in response.iter_lines() if line]

    def data(frames: list[str]) -> list[str]:
        return [json.dumps({k: v for k, v in json.loads(f[6:]).items() if k not in ("created", "id", "timings")})
                for f in frames if f.startswith("data: ") and f != "data: [DONE]"]

    pinged, disabled = live_servers.concurrently(lambda: lines(0.005), lambda: lines(-1))
    assert sum(line.startswith(":") for line in pinged) >= 1, pinged
    assert not any(line.startswith(":") for line in disabled), disabled
    assert data(pinged) == data(disabled)
