"""What llama-ui relies on, on a live router (the tiny random Qwen3.5 as two models; its noise never ends by itself,
so a generation runs exactly to its token limit or until it is stopped): the recommended sampling defaults and the
default max_tokens in /props and in effect, per-chunk timings, llama.cpp's sampler fields reaching the sampler (or a
400 naming the field), one generation per conversation, and a swap's wait explained in /v1/models and /models/sse."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from live_servers import artifact_for, serve_router, wait_until
from ninfer.frontend.sampling_defaults import QWEN35_THINKING

ALPHA_MAX_TOKENS = 7


@pytest.fixture(scope="module")
def server(pytestconfig, tiny_qwen3_5):
    path = str(artifact_for(pytestconfig, tiny_qwen3_5))
    config = {"max_tokens": 5000,
              "models": {"alpha": {"path": path, "max_context": 512, "max_tokens": ALPHA_MAX_TOKENS,
                                   "sampling": {"temperature": 0.25, "dry_multiplier": 0.5}},
                         "beta": {"path": path, "max_context": 512}}}
    with serve_router(config) as live:
        yield live


def chat(model: str, **fields) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Hello there"}], **fields}


def streamed(client: httpx.Client, body: dict, headers: dict | None = None) -> list[dict]:
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}, headers=headers) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def tokens(client: httpx.Client, body: dict) -> list[str]:
    answer = client.post("/v1/chat/completions", json={**body, "logprobs": True})
    assert answer.status_code == 200, answer.text
    return [t["token"] for t in answer.json()["choices"][0]["logprobs"]["content"]]


def test_props_show_the_defaults_that_requests_get(server) -> None:
    client = httpx.Client(base_url=server.url, timeout=120)
    params = client.get("/props", params={"model": "alpha"}).json()["default_generation_settings"]["params"]
    # the config's sampling over the Qwen3.5 thinking values (the card's, which the tiny checkpoint's
    # generation_config repeats), and the model's max_tokens over the global one
    assert params["temperature"] == 0.25 and params["dry_multiplier"] == 0.5
    assert (params["top_k"], params["top_p"]) == (QWEN35_THINKING["top_k"], QWEN35_THINKING["top_p"])
    assert params["max_tokens"] == params["n_predict"] == ALPHA_MAX_TOKENS
    assert params["samplers"][:2] == ["penalties", "dry"] and params["typ_p"] == 1.0
    beta = client.get("/props", params={"model": "beta"}).json()["default_generation_settings"]["params"]
    assert beta["max_tokens"] == 5000 and beta["temperature"] == QWEN35_THINKING["temperature"]
    # a request that names no max_tokens stops at the model's default; -1 (llama-ui's "no limit") runs on
    usage = client.post("/v1/chat/completions", json=chat("alpha")).json()["usage"]
    assert usage["completion_tokens"] == ALPHA_MAX_TOKENS
    usage = client.post("/v1/chat/completions", json=chat("alpha", max_tokens=-1, temperature=0,
                                                          reasoning_format="none")).json()["usage"]
    assert usage["completion_tokens"] == 512 - usage["prompt_tokens"]


def test_timings_ride_on_every_chunk_when_asked(server) -> None:
    client = httpx.Client(base_url=server.url, timeout=120)
    chunks = streamed(client, chat("alpha", max_tokens=6, temperature=0, timings_per_token=True))
    with_text = [c for c in chunks if c.get("choices") and any(c["choices"][0]["delta"].get(k)
                                                               for k in ("content", "reasoning_content"))]
    # every chunk once two tokens are out (before, there is no decode time to give a rate over)
    timed = [c for c in with_text if "timings" in c]
    assert timed and timed == with_text[len(with_text) - len(timed):]
    counts = [c["timings"]["predicted_n"] for c in timed]
    assert counts == sorted(counts) and counts[-1] <= 6 and counts[0] >= 2
    assert all(c["timings"]["predicted_per_second"] > 0 for c in timed)
    assert timed[-1]["timings"]["predicted_ms"] >= timed[0]["timings"]["predicted_ms"]
    plain = streamed(client, chat("alpha", max_tokens=3, temperature=0))
    assert all("timings" not in c for c in plain[:-1])  # only the final chunk, as before


def test_sampler_fields_reach_the_sampler(server) -> None:
    client = httpx.Client(base_url=server.url, timeout=120)
    greedy = tokens(client, chat("beta", max_tokens=6, temperature=0))
    # top-k 1 alone (no temperature stage) is greedy whatever the temperature
    assert tokens(client, chat("beta", max_tokens=6, temperature=1.5, samplers="top_k", top_k=1)) == greedy
    # XTC at threshold 0 after top-k 2 drops the likeliest of the two: never the greedy token
    second = tokens(client, chat("beta", max_tokens=1, samplers=["top_k", "xtc"], top_k=2, xtc_probability=1.0,
                                 xtc_threshold=0.0))
    assert second[0] != greedy[0]
    unknown = client.post("/v1/chat/completions", json=chat("beta", samplers=["top_k", "mirostat"]))
    assert unknown.status_code == 400 and "'mirostat' is not a sampler" in unknown.json()["error"]["message"]
    bad = client.post("/v1/chat/completions", json=chat("beta", dry_multiplier=1.0, dry_base=0.5))
    assert bad.status_code == 400 and "dry_base" in bad.json()["error"]["message"]


def test_a_second_request_on_a_conversation_cancels_the_first(server) -> None:
    client = httpx.Client(base_url=server.url, timeout=120)
    conv = f"two-tabs-{time.monotonic_ns()}::alpha"
    first: dict = {}
    started = threading.Event()

    def tab_a() -> None:
        with client.stream("POST", "/v1/chat/completions", json={**chat("alpha", max_tokens=400), "stream": True},
                           headers={"X-Conversation-Id": conv}) as r:
            lines = []
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    lines.append(json.loads(line[6:]))
                    if len(lines) == 3:
                        started.set()
        first["finish"] = next(c["choices"][0]["finish_reason"] for c in reversed(lines) if c.get("choices"))
        first["id"] = lines[0]["id"]

    a = threading.Thread(target=tab_a)
    a.start()
    assert started.wait(60)
    second = streamed(client, chat("alpha", max_tokens=3), headers={"X-Conversation-Id": conv})
    a.join(60)
    assert first["finish"] == "cancelled"
    (row,) = client.post("/v1/streams/lookup", json={"conversation_ids": [conv]}).json()
    assert row["is_done"]
    replay = client.get("/v1/stream", params={"conv_id": conv}).text
    assert second[0]["id"] in replay and first["id"] not in replay  # the recording is the second request's
    assert not any(s["is_processing"] for s in client.get("/slots", params={"model": "alpha"}).json())


def test_a_swap_that_waits_says_for_what(server) -> None:
    client = httpx.Client(base_url=server.url, timeout=120)
    client.post("/v1/chat/completions", json=chat("alpha", max_tokens=1))  # alpha resident
    events: list[dict] = []
    subscribed = threading.Event()  # the feed's first frame (its snapshot) arrived: every later change reaches it

    def feed() -> None:
        with httpx.stream("GET", server.url + "/models/sse", timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    subscribed.set()
                    if events[-1]["model"] == "beta" and events[-1]["data"]["status"] == "loaded":
                        return

    reader = threading.Thread(target=feed, daemon=True)
    reader.start()
    assert subscribed.wait(60)
    holding = threading.Event()
    done: dict = {}

    def hold_alpha() -> None:
        with client.stream("POST", "/v1/chat/completions", json={**chat("alpha", max_tokens=400), "stream": True}) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i == 4:
                    holding.set()
                if done:
                    return  # leaving cancels the generation: alpha's in-flight request ends

    def ask_beta() -> None:
        done["beta"] = client.post("/v1/chat/completions", json=chat("beta", max_tokens=1)).status_code

    holder = threading.Thread(target=hold_alpha)
    holder.start()
    assert holding.wait(60)
    asker = threading.Thread(target=ask_beta)
    asker.start()

    def beta_row() -> dict:
        return next(r for r in client.get("/v1/models").json()["data"] if r["id"] == "beta")["status"]

    assert wait_until(lambda: beta_row().get("message") == "waiting for 1 request on alpha", 30)
    assert beta_row()["value"] == "loading"
    done["release"] = True
    asker.join(120)
    holder.join(120)
    assert done["beta"] == 200
    reader.join(60)
    waits = [e["data"] for e in events if e["model"] == "beta" and "waiting" in e["data"].get("message", "")]
    assert waits and waits[0]["status"] == "loading" and waits[0]["progress"]["value"] == 0
    assert beta_row() == {"value": "loaded", "args": []}
