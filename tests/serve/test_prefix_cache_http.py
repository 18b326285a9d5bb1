"""Prefix reuse through the HTTP server (tiny Qwen3.5, its real chat template): a multi-turn chat, a branch at an
edited middle message, and the reuse each protocol reports (OpenAI chat / completions / Responses `cached_tokens`,
Anthropic `cache_read_input_tokens`, llama.cpp `timings.cache_n`) and /metrics counts. The expected reuse of each
request follows from the documented rules and the token ids of every earlier prompt: the deepest state snapshot
(every 128 tokens here, and each prompt's last block boundary) on a prefix the request shares, before its last
token."""

from __future__ import annotations

import httpx
import live_servers
import pytest
from prometheus_client.parser import text_string_to_metric_families

INTERVAL = 128
SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: answer in plain words about topic {i}." for i in range(40))


@pytest.fixture(scope="module")
def server(pytestconfig, tiny_qwen3_5):
    path = live_servers.artifact_for(pytestconfig, tiny_qwen3_5)
    config = {"models": {"tiny": {"path": str(path), "max_context": 2048, "max_concurrency": 1,
                                  "snapshot_interval": INTERVAL, "device_state_slots": 32}}}
    with live_servers.serve_router(config) as live:
        yield live


class Expected:
    """The snapshots every earlier prompt left (positions on its own token chain) and what a new prompt reuses."""

    def __init__(self) -> None:
        self.chains: list[tuple[list[int], set[int]]] = []

    def ran(self, tokens: list[int]) -> None:
        # (A frontier snapshot inside the answer is never shared here: the template drops the tiny model's answer,
        # all reasoning, from the next turn's prompt.)
        last = len(tokens) // 64 * 64
        self.chains.append((tokens, set(range(INTERVAL, last + 1, INTERVAL)) | ({last} if last else set())))

    def reuse(self, tokens: list[int]) -> int:
        best = 0
        for chain, points in self.chains:
            common = next((i for i, (a, b) in enumerate(zip(chain, tokens)) if a != b), min(len(chain), len(tokens)))
            best = max([best, *(p for p in points if p <= min(common, len(tokens) - 1))])
        return best


def prompt_tokens(server, messages) -> list[int]:
    text = httpx.post(f"{server.url}/apply-template", timeout=120, json={"model": "tiny", "messages": messages}).json()["prompt"]
    return httpx.post(f"{server.url}/tokenize", timeout=120, json={"model": "tiny", "content": text}).json()["tokens"]


def chat(server, messages) -> dict:
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=120,
                   json={"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def metric(server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_a_multi_turn_chat_and_a_branch_reuse_what_earlier_turns_computed(server):
    expected = Expected()
    seen = []
    messages = [{"role": "system", "content": SYSTEM}]
    turns = ["What is rule 3 about?", "And rule 17? " * 5, "Summarise rules 1 to 9, one line each, please."]
    for text in turns:
        messages = [*messages, {"role": "user", "content": text}]
        tokens = prompt_tokens(server, messages)
        r = chat(server, messages)
        usage = r["usage"]
        assert usage["prompt_tokens"] == len(tokens)
        assert usage["prompt_tokens_details"]["cached_tokens"] == expected.reuse(tokens)
        assert r["timings"]["cache_n"] == usage["prompt_tokens_details"]["cached_tokens"]
        assert r["timings"]["prompt_n"] == len(tokens) - r["timings"]["cache_n"]
        seen.append(usage["prompt_tokens_details"]["cached_tokens"])
        expected.ran(tokens)
        answer = r["choices"][0]["message"]
        messages = [*messages, {"role": "assistant", "content": answer.get("content") or ""}]
    assert seen[0] == 0 and seen[1] >= INTERVAL and seen[2] > seen[1]  # each turn reuses the one before
    # A branch: the first user message edited; the system prompt before it is still reused.
    branch = [messages[0], {"role": "user", "content": "What is rule 30 about?"}, *messages[2:]]
    tokens = prompt_tokens(server, branch)
    r = chat(server, branch)
    assert 0 < r["usage"]["prompt_tokens_details"]["cached_tokens"] == expected.reuse(tokens) < seen[2]
    seen.append(r["usage"]["prompt_tokens_details"]["cached_tokens"])
    expected.ran(tokens)
    # What /metrics counts: the server's cached prompt tokens and the engine's own prefix-cache counters.
    assert metric(server, "ninfer_cached_prompt_tokens_total") == sum(seen)
    assert metric(server, "ninfer_prefix_cache_cached_tokens_total") == sum(seen)
    assert metric(server, "ninfer_prefix_cache_hits_total") == sum(c > 0 for c in seen)
    assert metric(server, "ninfer_prefix_cache_snapshots") > 0


def test_every_protocol_reports_the_reuse(server):
    expected_prompt = [{"role": "user", "content": "Count the rules: " + SYSTEM}]
    tokens = prompt_tokens(server, expected_prompt)
    first = chat(server, expected_prompt)["usage"]["prompt_tokens_details"]["cached_tokens"]
    reuse = len(tokens) // 64 * 64 if len(tokens) % 64 else (len(tokens) - 1) // INTERVAL * INTERVAL
    anthropic = httpx.post(f"{server.url}/v1/messages", timeout=120, json={
        "model": "tiny", "max_tokens": 8, "temperature": 0, "messages": expected_prompt}).json()
    assert first == 0  # no earlier prompt starts like this one
    assert anthropic["usage"]["cache_read_input_tokens"] == reuse
    assert anthropic["usage"]["input_tokens"] + reuse == len(tokens)
    responses = httpx.post(f"{server.url}/v1/responses", timeout=120, json={
        "model": "tiny", "max_output_tokens": 8, "temperature": 0, "input": expected_prompt}).json()
    assert responses["usage"]["input_tokens_details"]["cached_tokens"] == reuse
    text = httpx.post(f"{server.url}/apply-template", timeout=120, json={"model": "tiny", "messages": expected_prompt}).json()
    completion = httpx.post(f"{server.url}/v1/completions", timeout=120, json={
        "model": "tiny", "max_tokens": 8, "temperature": 0, "prompt": text["prompt"]}).json()
    assert completion["usage"]["prompt_tokens_details"]["cached_tokens"] == reuse
