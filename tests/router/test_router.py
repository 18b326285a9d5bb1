"""Router lifecycle against real CPU engines (SmolLM2 under two names): lazy load, swap frees the previous engine,
TTL unload (the ticker stepped on the router's clock, and live), in-flight pinning, concurrent requests for two
models, load failure, SSE event order, config errors; and the one-model case as `ninfer-serve MODEL` runs it."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from live_servers import SETTLE_S, serve_cli, serve_router, two_models, wait_until
from ninfer.engine import EngineOptions
from ninfer.serve.router import LOADED, TICK_S, UNLOADED, ModelRouter
from ninfer.serve.router_config import RouterConfigError, parse_config


def chat(client: httpx.Client, model: str, max_tokens: int = 4, **extra) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"model": model, "max_tokens": max_tokens, "temperature": 0,
                                                     "messages": [{"role": "user", "content": "Say hello."}],
                                                     **extra})


def statuses(client: httpx.Client) -> dict[str, str]:
    return {row["id"]: row["status"]["value"] for row in client.get("/v1/models").json()["data"]}


def engine_of(server, name: str):
    return next(e.served for e in server.router.entries if e.name == name).engine


def test_lazy_load_then_swap_frees_the_previous_engine(smollm2: Path) -> None:
    with serve_router(two_models(smollm2)) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        assert statuses(client) == {"alpha": "unloaded", "beta": "unloaded"}
        assert server.router.models == []  # nothing loaded, no warm-up

        first = chat(client, "a")  # an alias
        assert first.status_code == 200, first.text
        assert first.json()["model"] == "alpha"
        assert statuses(client) == {"alpha": "loaded", "beta": "unloaded"}
        alpha = weakref.ref(engine_of(server, "alpha"))

        second = chat(client, "beta")
        assert second.status_code == 200, second.text
        assert second.json()["model"] == "beta"
        assert statuses(client) == {"alpha": "unloaded", "beta": "loaded"}
        # The request that used alpha may still be unwinding in its server task for a moment.
        assert wait_until(lambda: gc.collect() is not None and alpha() is None), \
            f"the swapped-out engine is still referenced by {[type(r) for r in gc.get_referrers(alpha())]}"
        assert [m.model_id for m in server.router.models] == ["beta"]
        assert engine_of(server, "beta").info.max_context == 512  # the per-model preset


def test_a_swapped_out_model_comes_back_warm_from_its_host_tier(smollm2: Path) -> None:
    """alpha keeps a host tier: swapped out for beta and loaded again, its conversation's next turn reuses the prefix
    its first engine computed (cached_tokens > 0 on the first request after the reload); beta has none and keeps
    nothing. The router holds one tier per model with one, across swaps."""
    config = two_models(smollm2)
    config["models"]["alpha"] |= {"host_kv_mib": 64}
    system = "You are a careful assistant. " * 40  # a few hundred tokens: several 64-token blocks
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Name a colour."}]

    def ask(client: httpx.Client, model: str, msgs: list) -> dict:
        r = client.post("/v1/chat/completions", json={"model": model, "max_tokens": 4, "temperature": 0,
                                                      "messages": msgs})
        assert r.status_code == 200, r.text
        return r.json()

    with serve_router(config) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        first = ask(client, "alpha", messages)
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        (tier,) = server.router.host_tiers.values()
        ask(client, "beta", [{"role": "user", "content": "Hi."}])  # alpha is closed: its cache goes to the tier
        assert statuses(client) == {"alpha": "unloaded", "beta": "loaded"}
        held = tier.stats()
        assert held["parked"] and held["used_pages"] >= first["usage"]["prompt_tokens"] // 64
        follow_up = [*messages, first["choices"][0]["message"], {"role": "user", "content": "And another?"}]
        again = ask(client, "alpha", follow_up)
        assert statuses(client) == {"alpha": "loaded", "beta": "unloaded"}
        cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0 and cached % 64 == 0 and cached >= first["usage"]["prompt_tokens"] // 64 * 64 - 64
        assert engine_of(server, "alpha").stats().prefix.host_restored_blocks == cached // 64
        assert list(server.router.host_tiers.values()) == [tier]  # the same tier, not a new one
        assert engine_of(server, "alpha").host_tier is tier


def test_health_answers_before_any_model_loads_and_its_summary_says_so(smollm2: Path) -> None:
    with serve_router(two_models(smollm2)) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        assert client.get("/health").json() == {"status": "ok"}
        assert statuses(client) == {"alpha": "unloaded", "beta": "unloaded"}
        summary = client.get("/docs/openapi.json").json()["paths"]["/health"]["get"]["summary"]
        assert "before any model loads" in summary, summary


TTL_SLACK_S = 1.5


def test_ttl_unloads_an_idle_model(smollm2: Path) -> None:
    config = two_models(smollm2)
    config["models"]["beta"]["ttl"] = 1
    with serve_router(config) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        answer = chat(client, "beta")
        answered = time.monotonic()  # beta's last use ended before this (its pin is released as the answer is sent)
        # beta answered, so it was loaded; whether it still is a moment later depends on how long this thread took to
        # ask (one second is its whole TTL), so the test does not look.
        assert answer.status_code == 200 and answer.json()["model"] == "beta"
        # The 1-second ticker unloads it at most TTL + 1 s after its last use; the rest is room for closing it and
        # for this poll. The end-to-end check, in real time: the ticker's period and decision are checked exactly,
        # on a stepped clock, by test_the_ticker_checks_every_second_and_unloads_a_model_idle_for_its_ttl.
        assert wait_until(lambda: statuses(client)["beta"] == "unloaded", answered + 1 + TTL_SLACK_S - time.monotonic())
        assert server.router.models == []


class SteppedTicker:
    """The router's clock and sleep, stepped by the test: the ticker's sleep(s) returns when the test calls step(),
    which first moves the clock on by s, the period the ticker asked for. So the ticker's checks happen at exact
    times, however slow the machine, and a ticker that slept longer than a second would find more time passed."""

    def __init__(self) -> None:
        self.time = 1000.0
        self.periods: list[float] = []  # what each of the ticker's sleeps asked for
        self._wake: asyncio.Future[None] | None = None

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        self.periods.append(seconds)
        self._wake = asyncio.get_running_loop().create_future()
        await self._wake

    async def _asleep(self) -> None:
        deadline = time.monotonic() + SETTLE_S
        while self._wake is None or self._wake.done():
            assert time.monotonic() < deadline, "the ticker does not sleep"
            await asyncio.sleep(0.01)

    async def step(self) -> None:
        """One tick: the clock moves on by the period slept, the ticker checks; returns once it sleeps again (any
        unload it decided on has started by then: its first step runs before this poll's timer)."""
        await self._asleep()
        assert self._wake is not None
        self.time += self.periods[-1]
        self._wake.set_result(None)
        await self._asleep()


def test_the_ticker_checks_every_second_and_unloads_a_model_idle_for_its_ttl(smollm2: Path) -> None:
    """The ticker's period and its decision, on the router's own clock (the live test below checks the same
    end to end in real time, with slack): a model in flight is never unloaded, however long past its TTL; once
    idle, it is unloaded at the first check at least TTL after its last use, which a 1 s ticker makes exactly TTL
    (a 2 s ticker: TTL + 1; one that counts from the load: at once)."""
    ttl = 3
    config = parse_config({"models": {"m": {"path": str(smollm2), "ttl": ttl}}},
                          defaults=EngineOptions(max_context=256, max_concurrency=1))
    ticks = SteppedTicker()

    async def scenario() -> None:
        router = ModelRouter(config, clock=ticks.now, sleep=ticks.sleep)
        await router.start()
        try:
            lease = await router.acquire("m")  # a real load; the ticker sleeps meanwhile
            (entry,) = router.entries
            for _ in range(ttl + 2):
                await ticks.step()
                assert router.idle_past_ttl() is None and router.resident is entry  # in flight
            await lease.release()
            released = ticks.now()
            while router.resident is entry:
                assert ticks.now() - released < ttl + 2, "not unloaded"
                assert entry.status == LOADED
                await ticks.step()
            assert ticks.now() - released == ttl
            deadline = time.monotonic() + SETTLE_S
            while entry.status != UNLOADED:  # the engine closes in a worker thread
                assert time.monotonic() < deadline, entry.status
                await asyncio.sleep(0.05)
            assert router.models == []
        finally:
            router.close()

    asyncio.run(scenario())
    assert ticks.periods and set(ticks.periods) == {TICK_S} and TICK_S == 1.0


def test_global_ttl_does_not_unload_a_model_in_flight(smollm2: Path) -> None:
    outlast_s = 2.5  # the 1 s TTL plus its 1 s ticker, with room: a router that unloads idle-by-clock models has by now
    with serve_router(two_models(smollm2, ttl=1)) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        with client.stream("POST", "/v1/chat/completions", json={
                "model": "alpha", "max_tokens": 160, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}]}) as stream:
            started = time.monotonic()
            frames: list[str] = []
            for line in stream.iter_lines():
                frames += [line] if line.startswith("data: ") else []
                if line == "data: [DONE]" or time.monotonic() - started > outlast_s:
                    break
            # An answer that ended already was either cut short by unloading alpha (finish_reason says so) or, on a
            # machine fast enough to write it all within the TTL, too short for this test to mean anything.
            assert frames and frames[-1] != "data: [DONE]", (
                f"the answer ended after {time.monotonic() - started:.1f} s: {frames[-2:]}")
            assert statuses(client)["alpha"] == "loaded"  # 2.5 s in, still streaming: still loaded
        # Leaving the stream disconnects: the request ends, unpins alpha, and the TTL applies again.
        assert wait_until(lambda: statuses(client)["alpha"] == "unloaded")


def test_in_flight_request_pins_its_model(smollm2: Path) -> None:
    with serve_router(two_models(smollm2)) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        assert chat(client, "alpha").status_code == 200
        events: list[tuple[str, float]] = []
        streaming = threading.Event()

        def long_alpha() -> str:
            with client.stream("POST", "/v1/chat/completions", json={
                    "model": "alpha", "max_tokens": 120, "temperature": 0, "stream": True,
                    "messages": [{"role": "user", "content": "Count from one to one hundred."}]}) as stream:
                frames = []
                for line in stream.iter_lines():
                    if line.startswith("data: "):
                        frames.append(line)
                        streaming.set()
                    if line == "data: [DONE]":  # noted before the server can unpin alpha, however slow this thread
                        events.append(("alpha-done", time.monotonic()))
            return json.loads(frames[-2][6:])["choices"][0]["finish_reason"]

        with ThreadPoolExecutor(2) as pool:
            alpha = pool.submit(long_alpha)
            assert streaming.wait(60)
            beta = pool.submit(lambda: (chat(client, "beta"), events.append(("beta-done", time.monotonic())))[0])
            assert alpha.result() in ("length", "stop")  # never "cancelled": the swap waited for it
            assert beta.result().status_code == 200
        assert [name for name, _ in events] == ["alpha-done", "beta-done"]
        assert statuses(client) == {"alpha": "unloaded", "beta": "loaded"}


def test_concurrent_requests_for_two_models_all_succeed(smollm2: Path) -> None:
    with serve_router(two_models(smollm2)) as server, httpx.Client(base_url=server.url, timeout=180) as client:
        names = ["alpha", "beta", "alpha", "beta", "alpha", "beta"]
        with ThreadPoolExecutor(len(names)) as pool:
            responses = list(pool.map(lambda n: chat(client, n), names))
        assert [r.status_code for r in responses] == [200] * len(names), [r.text for r in responses]
        assert [r.json()["model"] for r in responses] == names
        assert sum(1 for s in statuses(client).values() if s == "loaded") == 1


def test_load_failure_is_reported_and_the_server_keeps_serving(smollm2: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.ninfer"
    broken.write_bytes(b"NINFER" + bytes(range(256)) * 64)  # not an artifact
    config = two_models(smollm2)
    config["models"]["broken"] = {"path": str(broken)}
    with serve_router(config) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        failed = chat(client, "broken")
        assert failed.status_code == 503
        message = failed.json()["error"]["message"]
        assert "broken" in message and "failed to load" in message
        row = next(r for r in client.get("/v1/models").json()["data"] if r["id"] == "broken")
        assert row["status"]["value"] == "failed" and row["status"]["message"]
        assert chat(client, "alpha").status_code == 200  # still serving
        assert client.get("/health").status_code == 200
        errors = client.get("/dashboard/state").json()["errors"]
        assert errors and errors[-1]["model"] == "broken"


def test_a_request_without_a_valid_key_loads_no_model(smollm2: Path) -> None:
    """With API keys, the model gate asks the key guard first: a request without a valid key, for a model or not,
    gets its 401 and loads nothing (no outsider can swap the resident model or read the model names); so does a
    body over the size limit (413). With the key, the same request loads and answers."""
    key = {"Authorization": "Bearer k1"}
    with serve_router(two_models(smollm2), api_keys=frozenset({"k1"})) as server, \
            httpx.Client(base_url=server.url, timeout=120) as client:
        body = {"model": "beta", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer nope"}, {"x-api-key": "nope"}):
            for route, payload in (("/v1/chat/completions", body), ("/v1/chat/completions", {**body, "model": "x"}),
                                   ("/tokenize", {"model": "beta", "content": "Hi"})):
                reply = client.post(route, json=payload, headers=headers)
                assert reply.status_code == 401, (route, headers, reply.text)
                assert "beta" not in reply.text and "alpha" not in reply.text
        oversized = client.post("/v1/chat/completions", headers=key,
                                content=b'{"model": "beta", "pad": "' + b"x" * (64 * 2**20) + b'"}')
        assert oversized.status_code == 413, oversized.text[:200]
        assert statuses(client.__class__(base_url=server.url, headers=key)) == {"alpha": "unloaded", "beta": "unloaded"}
        assert server.router.models == []
        assert client.post("/v1/chat/completions", json=body, headers=key).status_code == 200


def test_unknown_model_is_a_404_naming_the_known_ones(smollm2: Path) -> None:
    with serve_router(two_models(smollm2)) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        response = chat(client, "gamma")
        assert response.status_code == 404
        assert "gamma" in response.json()["error"]["message"] and "alpha, beta" in response.json()["error"]["message"]


def _sse_events(client: httpx.Client, out: list[dict], ready: threading.Event, stop: threading.Event,
                models: int = 2) -> None:
    """Collects /models/sse's events into `out`; `ready` once the snapshot of the `models` served has arrived."""
    with client.stream("GET", "/models/sse") as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
                if len(out) >= models:
                    ready.set()
            if stop.is_set():
                return


def changes(events: list[dict]) -> list[tuple[str, str]]:
    """The (model, status) sequence of /models/sse events, repeats (progress of the same status) merged."""
    seen: list[tuple[str, str]] = []
    for event in events:
        change = (event["model"], event["data"]["status"])
        if not seen or seen[-1] != change:
            seen.append(change)
    return seen


def test_sse_reports_load_swap_and_unload_in_order(smollm2: Path) -> None:
    with serve_router(two_models(smollm2)) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        events: list[dict] = []
        ready, stop = threading.Event(), threading.Event()
        reader = threading.Thread(target=_sse_events, args=(httpx.Client(base_url=server.url, timeout=60),
                                                            events, ready, stop), daemon=True)
        reader.start()
        assert ready.wait(SETTLE_S)  # the snapshot of both models
        assert client.post("/models/load", json={"model": "alpha"}).json() == {"success": True}  # returns at once
        assert wait_until(lambda: statuses(client)["alpha"] == "loaded", 120)
        assert chat(client, "beta").status_code == 200
        assert client.post("/models/unload", json={"model": "beta"}).json() == {"success": True}
        assert wait_until(lambda: statuses(client)["beta"] == "unloaded")
        assert wait_until(lambda: ("beta", "unloaded") in changes(events)[2:])
        stop.set()
        assert all(e["event"] == "model_status" for e in events)
        # Each load reports its progress as more `loading` events (test_router_loading.py checks their values).
        assert changes(events) == [("alpha", "unloaded"), ("beta", "unloaded"),
                                   ("alpha", "loading"), ("alpha", "loaded"), ("alpha", "unloaded"),
                                   ("beta", "loading"), ("beta", "loaded"), ("beta", "unloaded")]
        loading = events[2]["data"]["progress"]
        assert loading == {"stages": ["text_model"], "current": "text_model", "value": 0.0}


def test_management_routes_shapes(smollm2: Path) -> None:
    with serve_router(two_models(smollm2)) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        props = client.get("/props").json()
        assert props["role"] == "router"
        page = client.get("/dashboard/")  # the page ships inside the package (tests/packaging/test_package_data.py)
        assert page.status_code == 200 and "dashboard.js" in page.text
        assert client.get("/running").json() == {"running": []}
        answer = chat(client, "alpha")
        assert answer.status_code == 200
        # The dashboard's prefix cache figures are the server's counters: the prompt tokens of the generation so far,
        # those read from the cache (the models run with the prefix cache on); a cached token the engine reports counts.
        cache = client.get("/dashboard/state").json()["prefix_cache"]
        usage = answer.json()["usage"]
        assert cache == {"reuse": True, "prompt_tokens": usage["prompt_tokens"],
                         "cached_prompt_tokens": usage["prompt_tokens_details"]["cached_tokens"]}
        server.router.metrics.cached_tokens.inc(7)  # as ServedModel.record_generation would add usage.cached_tokens
        assert client.get("/dashboard/state").json()["prefix_cache"]["cached_prompt_tokens"] == (
            cache["cached_prompt_tokens"] + 7)
        model_props = client.get("/props", params={"model": "alpha"}).json()
        assert model_props["role"] == "model" and model_props["default_generation_settings"]["n_ctx"] == 1024
        assert model_props["total_slots"] == 2
        # the loaded model's own template (llama-ui looks into it, e.g. for thinking support)
        alpha = engine_of(server, "alpha")
        template = model_props["chat_template"]
        assert template == alpha.frontend.chat_template.source and "{%" in template
        slots = client.get("/slots", params={"model": "alpha"}).json()
        assert [s["id"] for s in slots] == [0, 1] and not any(s["is_processing"] for s in slots)
        running = client.get("/running").json()["running"]
        assert [(r["model"], r["state"]) for r in running] == [("alpha", "ready")]
        assert client.get("/unload").text == "OK"
        assert wait_until(lambda: statuses(client)["alpha"] == "unloaded")
        assert client.get("/tools").json() == []
        refused = client.post("/tools", json={"tool": "read_file", "params": {}})
        # llama.cpp's tool-error shape, which llama-ui reads (it probes the file tools on every page load)
        assert refused.status_code == 200 and "no server tool named 'read_file'" in refused.json()["error"]
        # llama.cpp answers 400 here; a model known but not loaded is a conflict with its state, not a bad body
        # (docs/router.md), in the shape of the other management errors
        not_loaded = client.post("/models/unload", json={"model": "beta"})
        assert not_loaded.status_code == 409, not_loaded.text
        error = not_loaded.json()["error"]
        assert error["type"] == "invalid_request_error" and "neither loaded nor loading" in error["message"]
        unknown = client.post("/models/unload", json={"model": "gamma"})
        assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error", unknown.text


def test_one_model_is_the_same_router_loaded_lazily(smollm2: Path) -> None:
    """`ninfer-serve MODEL` (the app its CLI code builds): a router with that one model, unloaded until
    its first request (docs/serving.md: nothing is loaded at start), which llama-ui sees in its one-model mode
    (/props role `model`, not `router`); unloading it works as for any routed model, and the next request loads it
    again; /models/sse reports each change."""
    name = smollm2.name.removesuffix(".ninfer")  # no --alias: the file name
    with serve_cli([str(smollm2), "--max-context", "512", "--max-concurrency", "1"]) as server, \
            httpx.Client(base_url=server.url, timeout=120) as client:
        assert isinstance(server.router, ModelRouter) and [e.name for e in server.router.entries] == [name]
        rows = client.get("/v1/models").json()["data"]
        assert [(r["id"], r["status"]["value"]) for r in rows] == [(name, "unloaded")]
        assert server.router.models == [] and client.get("/running").json() == {"running": []}
        props = client.get("/props", params={"autoload": "false"}).json()
        assert props["role"] == "model" and props["model_alias"] == name and props["total_slots"] == 1
        assert props["default_generation_settings"]["n_ctx"] == 512
        assert statuses(client) == {name: "unloaded"}  # autoload=false: looking did not load it

        events: list[dict] = []
        ready, stop = threading.Event(), threading.Event()
        reader = threading.Thread(target=_sse_events, args=(httpx.Client(base_url=server.url, timeout=60),
                                                            events, ready, stop, 1), daemon=True)
        reader.start()
        assert ready.wait(SETTLE_S)  # the snapshot of the one model
        first = chat(client, "any-name")  # with one model, every name is that model
        assert first.status_code == 200 and first.json()["model"] == name, first.text
        assert statuses(client) == {name: "loaded"}
        running = client.get("/running").json()["running"]
        assert [(r["model"], r["state"], r["ttl"]) for r in running] == [(name, "ready", 0)]  # never idle-unloaded

        assert client.post("/models/unload", json={"model": name}).json() == {"success": True}
        assert wait_until(lambda: statuses(client) == {name: "unloaded"})
        assert server.router.models == [] and client.get("/running").json() == {"running": []}
        again = chat(client, name)  # loads it again, lazily
        assert again.status_code == 200 and again.json()["model"] == name, again.text
        assert statuses(client) == {name: "loaded"}
        assert client.get("/props").json()["chat_template"]  # the loaded model's own template

        expected = [(name, "unloaded"), (name, "loading"), (name, "loaded"), (name, "unloaded"), (name, "loading"),
                    (name, "loaded")]
        assert wait_until(lambda: changes(events) == expected), changes(events)
        stop.set()


@pytest.mark.parametrize(("config", "message"), [
    ({}, "'models' must be a non-empty object"),
    ({"models": {"m": {}}}, "models.m.path must be the path"),
    ({"models": {"m": {"path": "x", "colour": 1}}}, "unknown key(s) colour"),
    ({"models": {"m": {"path": "x", "max_concurrency": 9}}}, "max_concurrency must be in 1..8"),
    ({"models": {"m": {"path": "x", "ttl": "soon"}}}, "models.m.ttl must be a number"),
    ({"models": {"m": {"path": "x", "spec": "eagle"}}}, 'models.m.spec must be one of "none", "mtp"'),
    ({"models": {"m": {"path": "x", "spec": "mtp", "draft_tokens": 6}}}, "models.m.draft_tokens must be in 1..5"),
    ({"models": {"m": {"path": "x", "lm_head_draft": 4096}}}, "lm-head shortlist is not implemented yet"),
    ({"models": {"m": {"path": "x", "aliases": ["n"]}, "n": {"path": "y"}}}, "'n' of model 'n' is already used"),
    ({"models": {"m": {"path": "x"}}, "globalTTL": 5}, "unknown top-level key(s) globalTTL"),
    ({"models": {"m": {"path": "x", "prefill_chunk": 100}}}, "prefill_chunk must be a positive multiple of 64"),
    ({"models": {"m": {"path": "x", "host_kv_mib": 64, "prefix_cache": False}}},
     "models.m.host_kv_mib / host_state_slots keep prefix-cache contents: they need prefix_cache true"),
    ({"models": {"m": {"path": "x", "host_state_slots": -1}}}, "models.m.host_state_slots must be an integer >= 0"),
])
def test_config_errors_name_the_key(config: dict, message: str) -> None:
    with pytest.raises(RouterConfigError) as info:
        parse_config(config, defaults=EngineOptions(), source="cfg.json")
    assert message in str(info.value)
    assert str(info.value).startswith("cfg.json")


@pytest.mark.parametrize(("key", "value", "allowed"), [
    ("kv_dtype", "q3", 'one of "bf16", "fp8", "int8", "nvfp4", "k8v4", "f32"'),
    ("backend", "tpu", 'one of "auto", "cpu", "cuda"'),
    ("cuda_gemm", "fast", 'one of "auto", "twin", "streamed"'),
    ("cuda_graphs", 1, "true or false"),
    ("device_sampling", "no", "true or false"),
    ("kv_capacity", "most", 'a number of tokens (an integer >= 1), "auto" or null'),
    ("kv_capacity", 0, 'a number of tokens (an integer >= 1), "auto" or null'),
    ("max_queue", True, "an integer >= 0"),
    ("threads", 1.5, "an integer >= 0"),
])
def test_engine_keys_are_checked_at_startup(key: str, value, allowed: str) -> None:
    # One line naming the file, the model, the key, the value and what is allowed: before any model is loaded.
    with pytest.raises(RouterConfigError) as info:
        parse_config({"models": {"qwen": {"path": "x", key: value}}}, defaults=EngineOptions(), source="cfg.json")
    assert str(info.value) == f"cfg.json: models.qwen.{key} must be {allowed}, got {json.dumps(value)}"


def test_every_engine_key_accepts_its_documented_values() -> None:
    entry = {"path": "x", "backend": "cpu", "kv_dtype": "int8", "cuda_gemm": "twin", "cuda_graphs": False,
             "device_sampling": False, "cuda_op_times": True, "kv_capacity": "auto", "max_context": 512,
             "max_concurrency": 2, "max_queue": 0, "prefill_chunk": 128, "threads": 1, "host_kv_mib": 512,
             "host_state_slots": 4}
    (model,) = parse_config({"models": {"m": entry}}, defaults=EngineOptions()).models
    assert {key: getattr(model.options, key) for key in entry if key != "path"} == {
        key: value for key, value in entry.items() if key != "path"}


def test_config_accepts_the_nix_module_shape(tmp_path: Path) -> None:
    # nix/module.nix writes {"models": {name: {"path": ..., <engine keys>}}, <settings>}
    config = parse_config({"models": {"qwen27b": {"path": "/m/27b.ninfer", "max_context": 65536, "kv_dtype": "fp8"},
                                      "qwen9b": {"path": "rel/9b.ninfer"}}, "ttl": 900},
                          defaults=EngineOptions(max_concurrency=4), base=tmp_path)
    big, small = config.models
    assert (big.options.max_context, big.options.kv_dtype, big.options.max_concurrency) == (65536, "fp8", 4)
    assert small.path == tmp_path / "rel/9b.ninfer" and config.ttl_s == 900


@pytest.mark.parametrize(("content", "message"), [
    ('{"models": {"m": {"path": "m.ninfer"}}, "ttl": -1}',
     "{file}: ttl must be >= 0 (0: never unload), got -1 (-1 means the global ttl, and only in a model entry)"),
    ('{"models": {"m": {"path": "m.ninfer", "ttl": -2}}}', "{file}: models.m.ttl must be >= 0, got -2"),
    ('models:\n  m: {path: m.ninfer}\n', "{file} is not JSON: Expecting value: line 1 column 1 (char 0)"),
    (None, "cannot read the router config {file}: No such file or directory"),
    ("<a folder>", "cannot read the router config {file}: Is a directory"),
])
def test_config_file_errors_are_one_line_from_the_cli(tmp_path: Path, capsys, content: str | None,
                                                      message: str) -> None:
    """`ninfer-serve --config FILE` reads the file itself: what is wrong with it is one line on stderr (exit 2)."""
    from ninfer.cli.serve import main

    config = tmp_path / "models.json"
    if content == "<a folder>":
        config.mkdir()
    elif content is not None:
        config.write_text(content)
    assert main(["--config", str(config)]) == 2
    assert capsys.readouterr().err == f"ninfer-serve: error: {message.format(file=config)}\n"


def test_a_models_ttl_of_minus_one_is_the_global_ttl() -> None:
    config = parse_config({"models": {"m": {"path": "x", "ttl": -1}, "n": {"path": "y", "ttl": 0}}, "ttl": 30},
                          defaults=EngineOptions())
    router = ModelRouter(config)
    assert [router.effective_ttl(e) for e in router.entries] == [30.0, 0.0]
