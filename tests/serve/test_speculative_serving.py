"""Speculative decoding through the server (a router config with `"spec": "mtp"`): the answer is the plain greedy
one, a stop string that ends inside an accepted run of drafts cuts it exactly there, the response's llama.cpp
`timings` carry draft_n / draft_n_accepted, and /metrics counts the drafts."""

from __future__ import annotations

from pathlib import Path

import agreeing_mtp
import httpx
import live_servers
import pytest
from ninfer.engine import Engine, EngineOptions

MESSAGES = [{"role": "user", "content": "Count with me."}]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def agreeing_artifact(pytestconfig, tiny_qwen3_5) -> Path:
    return agreeing_mtp.agreeing_artifact(Path(pytestconfig.cache.mkdir("runtime-artifacts")), tiny_qwen3_5)


def _plain_answer(artifact: Path) -> str:
    with Engine.open_sync(artifact, EngineOptions(backend="cpu", max_context=1024)) as engine:
        frontend = engine.frontend
        prompt = frontend.encode(frontend.render(MESSAGES, enable_thinking=False).text)
        return frontend.decode(live_servers.greedy_tokens(engine, prompt, MAX_TOKENS))


def _chat(url: str, **body) -> dict:
    response = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": "m", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False}, **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_served_speculative_answers_are_the_plain_ones(agreeing_artifact):
    plain = _plain_answer(agreeing_artifact)
    config = {"models": {"m": {"path": str(agreeing_artifact), "spec": "mtp", "draft_tokens": 4,
                               "max_context": 1024}}}
    with live_servers.serve_router(config) as server:
        whole = _chat(server.url)
        assert whole["choices"][0]["message"]["content"] == plain
        timings = whole["timings"]
        assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]
        # a stop string ending in the middle of the answer (inside a run of accepted drafts, as nearly all are)
        start = len(plain) // 3
        stop = plain[start:start + 3]
        cut = _chat(server.url, stop=[stop])
        assert cut["choices"][0]["message"]["content"] == plain[:plain.index(stop)]
        assert cut["choices"][0]["finish_reason"] == "stop"
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
        drafted = next(float(line.split()[1]) for line in metrics.splitlines()
                       if line.startswith("ninfer_draft_tokens_total "))
        assert drafted >= timings["draft_n"]


TOOLS = [{"type": "function", "function": {"name": "get_time", "description": "The time in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "n": {"type": "integer"}},
          "required": ["city", "n"], "additionalProperties": False}


def test_structured_output_and_tool_requests_answer_as_without_speculation(agreeing_artifact):
    """Grammar-constrained answers (response_format json_object and json_schema: a mask at every token, the draft
    rows' masks too) and a request with tools are the same from a speculative model entry as from a plain one of
    the same artifact; the constrained ones draft (their drafts are verified under the grammar)."""
    entry = {"path": str(agreeing_artifact), "max_context": 1024}
    config = {"models": {"m": {**entry, "spec": "mtp", "draft_tokens": 3}, "p": entry}}
    schema_format = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}}
    with live_servers.serve_router(config) as server:
        for body in ({"response_format": {"type": "json_object"}, "max_tokens": 24},
                     {"response_format": schema_format, "max_tokens": 40},
                     {"tools": TOOLS, "tool_choice": "auto"}):
            spec, plain = (_chat(server.url, **body, model=name) for name in ("m", "p"))
            assert spec["choices"][0]["message"] == plain["choices"][0]["message"]
            assert spec["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
            if "response_format" in body:
                assert spec["timings"]["draft_n"] > 0
