"""`n` > 1 on OpenAI Chat Completions and Completions through the official `openai` SDK (tests/live_servers.py's
tiny Qwen3.5 server, 2 lanes): choice i is the request with n = 1 and seed + i, whole and streamed; usage counts the
prompt once; the prompt is prefilled once (the engine's own count); a client that leaves mid-stream leaves no lane,
page or state slot held; n above the lanes, or above 8, is refused with a 400 naming `n`."""

from __future__ import annotations

import json
from collections import defaultdict

import jsonschema
import live_servers
import numpy as np
import openai
import pytest

# A few candidates per draw: choice i and the lone request with seed + i compute the prompt's last token in
# different batches (logits equal within the backend's batching bound, not bit for bit: tests/runtime/
# test_engine_choices.py), so a draw over the whole near-uniform vocabulary could land on a boundary that moved.
SAMPLED = {"temperature": 0.8, "extra_body": {"top_k": 8}}


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _messages() -> list[dict]:
    words = " ".join(np.random.default_rng().choice(["alpha", "beta", "gamma", "delta", "kappa"], size=8))
    return [{"role": "user", "content": f"Say something about {words}."}]


def _chat_text(message_or_delta) -> str:
    return ((message_or_delta.model_extra or {}).get("reasoning_content") or "") + (message_or_delta.content or "")


def test_chat_choices_are_the_requests_alone_with_their_seeds(qwen35_server):
    client, engine = _client(qwen35_server), qwen35_server.engine
    messages, seed = _messages(), int(np.random.default_rng().integers(0, 2**31))
    assert live_servers.lanes_free_within(qwen35_server)
    before = engine.stats().tokens_prefilled
    r = client.chat.completions.create(model="m", messages=messages, n=2, seed=seed, max_tokens=6, **SAMPLED)
    computed = engine.stats().tokens_prefilled - before
    assert [c.index for c in r.choices] == [0, 1]
    alone = [client.chat.completions.create(model="m", messages=messages, seed=seed + i, max_tokens=6, **SAMPLED)
             for i in range(2)]
    assert [_chat_text(c.message) for c in r.choices] == [_chat_text(a.choices[0].message) for a in alone]
    assert [c.finish_reason for c in r.choices] == [a.choices[0].finish_reason for a in alone]
    assert r.usage.prompt_tokens == alone[0].usage.prompt_tokens
    assert r.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # One prefill: the prompt but its last token once, then per choice its last token and the decodes of all but
    # its last sampled token (a stop token is sampled but not emitted: one more sampled than completion_tokens).
    sampled = [a.usage.completion_tokens + (a.choices[0].finish_reason == "stop") for a in alone]
    cached = r.usage.prompt_tokens_details.cached_tokens
    assert computed == (r.usage.prompt_tokens - 1 - cached) + sum(sampled)


def test_chat_choices_stream_as_they_are_whole(qwen35_server):
    client = _client(qwen35_server)
    messages, seed = _messages(), int(np.random.default_rng().integers(0, 2**31))
    whole = client.chat.completions.create(model="m", messages=messages, n=2, seed=seed, max_tokens=6, **SAMPLED)
    texts, finishes, usage = defaultdict(str), {}, None
    stream = client.chat.completions.create(model="m", messages=messages, n=2, seed=seed, max_tokens=6, stream=True,
                                            stream_options={"include_usage": True}, **SAMPLED)
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] += _chat_text(choice.delta)
            if choice.finish_reason is not None:
                assert choice.index not in finishes  # one final chunk per choice
                finishes[choice.index] = choice.finish_reason
    assert [texts[i] for i in range(2)] == [_chat_text(c.message) for c in whole.choices]
    assert [finishes[i] for i in range(2)] == [c.finish_reason for c in whole.choices]
    assert (usage.prompt_tokens, usage.completion_tokens) == (whole.usage.prompt_tokens, whole.usage.completion_tokens)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_choices_are_the_requests_alone(qwen35_server, stream):
    client = _client(qwen35_server)
    prompt, seed = _messages()[0]["content"], int(np.random.default_rng().integers(0, 2**31))
    alone = [client.completions.create(model="m", prompt=prompt, seed=seed + i, max_tokens=6, echo=True, **SAMPLED)
             for i in range(2)]
    if stream:
        texts = defaultdict(str)
        for chunk in client.completions.create(model="m", prompt=prompt, n=2, seed=seed, max_tokens=6, echo=True,
                                               stream=True, **SAMPLED):
            for choice in chunk.choices:
                texts[choice.index] += choice.text
        got = [texts[i] for i in range(2)]
    else:
        r = client.completions.create(model="m", prompt=prompt, n=2, seed=seed, max_tokens=6, echo=True, **SAMPLED)
        assert [c.index for c in r.choices] == [0, 1]
        assert r.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
        assert r.usage.prompt_tokens == alone[0].usage.prompt_tokens
        got = [c.text for c in r.choices]
    assert got == [a.choices[0].text for a in alone]
    assert all(text.startswith(prompt) for text in got)


def test_a_client_leaving_mid_stream_frees_every_choice(qwen35_server):
    client, engine = _client(qwen35_server), qwen35_server.engine
    tokens_before = live_servers.idle_tokens_generated(qwen35_server)
    stream = client.chat.completions.create(model="m", messages=_messages(), n=2, max_tokens=400, stream=True)
    seen = set()
    for chunk in stream:
        seen |= {c.index for c in chunk.choices if _chat_text(c.delta)}
        if seen == {0, 1}:
            break
    stream.close()
    assert live_servers.cut_short(qwen35_server, tokens_before, 2 * 400)
    s = engine.stats()
    assert (s.busy_lanes, s.kv_free_tokens, s.free_state_slots) == (0, s.kv_capacity_tokens,
                                                                    s.prefix.total_state_slots)


@pytest.mark.parametrize(("route", "n", "message"), [
    ("chat", 3, "n = 3: this model runs 2 generations at once (max_concurrency)"),
    ("completions", 3, "n = 3: this model runs 2 generations at once (max_concurrency)"),
    ("chat", 9, "n = 9: at most 8 choices per request"),
    ("completions", 9, "n = 9: at most 8 choices per request"),
])
def test_n_above_the_lanes_is_refused(qwen35_server, route, n, message):
    client = _client(qwen35_server)
    with pytest.raises(openai.BadRequestError) as info:
        if route == "chat":
            client.chat.completions.create(model="m", messages=_messages(), n=n)
        else:
            client.completions.create(model="m", prompt="x", n=n)
    assert info.value.body["param"] == "n" and message in info.value.body["message"]
    assert live_servers.lanes_free_within(qwen35_server)


def test_every_choice_keeps_its_own_constraint(qwen35_server):
    """Structured output with n = 2: each choice has its own grammar state, so both are whole valid values (one
    constraint shared by two streams would see both streams' tokens and reject or garble one), and they are drawn
    apart (seeds seed and seed + 1). The tiny random model's distribution under the schema can be peaked enough that
    two draws give the same value (a fresh-clone run met {'city': '', 'rank': 7} twice), so the choices must
    differ in at least one of three requests with fresh seeds, while every value of every request is checked."""
    schema = {"type": "object", "additionalProperties": False, "required": ["city", "rank"],
              "properties": {"city": {"type": "string", "maxLength": 10},
                             "rank": {"type": "integer", "minimum": 0, "maximum": 99}}}
    rng = np.random.default_rng()
    pairs = []
    for _ in range(3):
        r = _client(qwen35_server).chat.completions.create(
            model="m", messages=_messages(), n=2, temperature=1.0, seed=int(rng.integers(0, 2**31)),
            max_tokens=200, response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        values = [json.loads(c.message.content) for c in r.choices]
        for value, choice in zip(values, r.choices, strict=True):
            assert choice.finish_reason == "stop"
            jsonschema.validate(value, schema)
        pairs.append(values)
    assert any(values[0] != values[1] for values in pairs), pairs
