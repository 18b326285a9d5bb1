"""What the router does while a model loads, against real CPU engines (SmolLM2 under two names): load progress on
/models/sse, its keepalives, POST /models/load returning at once, requests waiting with a bound, the health-check
timeout, and /models/unload cancelling a load.

A load is held at its start by `HeldLoads` (the real Engine.open, run once the test opens a gate), so that "while it
loads" lasts exactly as long as each test needs, however fast or slow the machine."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from live_servers import SETTLE_S, serve_router, two_models, wait_until
from ninfer.engine import Engine, EngineOptions
from ninfer.serve.router_config import DEFAULT_SSE_PING_S, parse_config

LOAD_S = 120.0  # bound on a real load of SmolLM2 on a loaded 2-core machine


class HeldLoads:
    """Engine.open that waits for `gate` before it starts: the load is real, it starts when the test says. Keeps
    every engine it opened, so a test can see what became of it."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.waiting = threading.Event()  # a load is held at the gate
        self.engines: list[Engine] = []
        self.calls = 0  # loads started

    async def __call__(self, path: Path, options: EngineOptions, progress: Callable[[float], None],
                       host_tier: Any) -> Engine:
        self.calls += 1
        self.waiting.set()
        await asyncio.to_thread(self.gate.wait, LOAD_S)  # bounded: a failing test must not hang the server thread
        engine = await Engine.open(path, options, progress, host_tier)
        self.engines.append(engine)
        return engine


def statuses(client: httpx.Client) -> dict[str, dict]:
    return {row["id"]: row["status"] for row in client.get("/v1/models").json()["data"]}


def chat(client: httpx.Client, model: str) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"model": model, "max_tokens": 2, "temperature": 0,
                                                     "messages": [{"role": "user", "content": "Hi."}]})


class SseReader:
    """Reads /models/sse in a thread: every data frame (parsed) and the arrival time of every keepalive."""

    def __init__(self, url: str) -> None:
        self.events: list[dict] = []
        self.pings: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(url,), daemon=True)
        self._thread.start()

    def _read(self, url: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as client, client.stream("GET", "/models/sse") as stream:
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    self.events.append(json.loads(line[6:]))
                elif line.startswith(":"):
                    self.pings.append(time.monotonic())
                if self._stop.is_set():
                    return

    def of(self, model: str) -> list[dict]:
        return [e["data"] for e in self.events if e["model"] == model]

    def stop(self) -> None:
        self._stop.set()


def test_a_load_reports_increasing_progress_before_loaded(smollm2: Path) -> None:
    with serve_router(two_models(smollm2)) as server:
        feed = SseReader(server.url)
        assert wait_until(lambda: len(feed.events) >= 2)  # the snapshot of both models
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert client.post("/models/load", json={"model": "alpha"}).json() == {"success": True}
            assert wait_until(lambda: any(d["status"] == "loaded" for d in feed.of("alpha")), LOAD_S)
        feed.stop()
        alpha = feed.of("alpha")[1:]  # after the snapshot
        loading = [d["progress"]["value"] for d in alpha if d["status"] == "loading"]
        assert [d["status"] for d in alpha] == ["loading"] * len(loading) + ["loaded"]
        assert loading[0] == 0.0
        assert all(a < b for a, b in itertools.pairwise(loading)), loading  # increasing
        assert len(loading) >= 3 and all(0.0 < v < 1.0 for v in loading[1:]), loading  # real steps in between
        assert alpha[-1]["progress"]["value"] == 1.0
        # a plain model loads one stage: llama-ui would otherwise keep room on its bar for a draft and a projector
        assert {json.dumps(d["progress"]) for d in alpha} == {
            json.dumps({"stages": ["text_model"], "current": "text_model", "value": v}) for v in [*loading, 1.0]}


def test_models_sse_keepalives_come_at_the_configured_interval(smollm2: Path) -> None:
    interval = 0.25
    with serve_router(two_models(smollm2, sse_ping_interval=interval)) as server:
        feed = SseReader(server.url)
        assert wait_until(lambda: len(feed.pings) >= 6, SETTLE_S)
        feed.stop()
    gaps = [b - a for a, b in zip(feed.pings, feed.pings[1:])]
    # Each keepalive comes after `interval` of silence. The reader stamps them as its thread reads them, so on a
    # loaded machine one can arrive late and the next seem early: the median gap is the interval's.
    median = sorted(gaps)[len(gaps) // 2]
    assert interval * 0.8 <= median < interval * 2, gaps
    assert parse_config(two_models(Path("x")), defaults=EngineOptions()).sse_ping_interval_s == DEFAULT_SSE_PING_S == 5


def test_load_returns_at_once_and_requests_for_a_loading_model_wait_with_a_bound(smollm2: Path) -> None:
    held = HeldLoads()
    wait_s = 1.0
    with serve_router(two_models(smollm2, load_wait_timeout=wait_s), open_engine=held) as server, \
            httpx.Client(base_url=server.url, timeout=LOAD_S) as client:
        try:
            assert client.post("/models/load", json={"model": "alpha"}).json() == {"success": True}
            assert statuses(client)["alpha"]["value"] == "loading"  # right after: the load has not ended
            started = time.monotonic()
            waited = chat(client, "alpha")
            elapsed = time.monotonic() - started
            assert waited.status_code == 503, waited.text
            assert waited.headers["retry-after"].isdigit()
            assert "not ready within 1 s (loading)" in waited.json()["error"]["message"]
            assert wait_s <= elapsed < wait_s + SETTLE_S
        finally:
            held.gate.set()
        assert wait_until(lambda: statuses(client)["alpha"]["value"] == "loaded", LOAD_S)
        assert chat(client, "alpha").status_code == 200


def test_the_health_check_timeout_fails_the_load_and_its_late_engine_is_closed(smollm2: Path) -> None:
    held = HeldLoads()
    with serve_router(two_models(smollm2, health_check_timeout=0.5), open_engine=held) as server, \
            httpx.Client(base_url=server.url, timeout=LOAD_S) as client:
        try:
            failed = chat(client, "alpha")
            assert failed.status_code == 503 and failed.headers["retry-after"].isdigit()
            assert "not ready within the health-check timeout of 0.5 s" in failed.json()["error"]["message"]
            status = statuses(client)["alpha"]
            assert status["value"] == "failed" and "health-check timeout" in status["message"]
        finally:
            held.gate.set()  # the abandoned load goes on in its thread, and opens its engine
        assert wait_until(lambda: len(held.engines) == 1, LOAD_S)
        late = held.engines[0]
        assert wait_until(lambda: late._closed)  # closed as soon as it was open
        assert statuses(client)["alpha"]["value"] == "failed" and server.router.models == []  # never resident
        assert client.get("/health").status_code == 200  # the server goes on


def test_a_load_waits_for_an_abandoned_load_to_end_first(smollm2: Path) -> None:
    """One engine in memory at a time: while a load abandoned at its health-check timeout still runs, the next load
    waits for it (bounded by the same timeout) rather than opening a second engine beside it."""
    held = HeldLoads()
    with serve_router(two_models(smollm2, health_check_timeout=0.5), open_engine=held) as server, \
            httpx.Client(base_url=server.url, timeout=LOAD_S) as client:
        try:
            assert chat(client, "alpha").status_code == 503  # abandoned at the gate
            blocked = chat(client, "beta")
            assert blocked.status_code == 503
            assert "an earlier load that outlived its health-check timeout is still running" in \
                blocked.json()["error"]["message"]
            assert held.calls == 1  # beta's load never started
        finally:
            held.gate.set()
        assert wait_until(lambda: len(held.engines) == 1 and held.engines[0]._closed, LOAD_S)
        assert wait_until(lambda: not server.router._abandoned_loads)  # the next load no longer waits


def test_unload_during_a_load_cancels_it(smollm2: Path) -> None:
    held = HeldLoads()
    with serve_router(two_models(smollm2), open_engine=held) as server, \
            httpx.Client(base_url=server.url, timeout=LOAD_S) as client, ThreadPoolExecutor(1) as pool:
        feed = SseReader(server.url)
        try:
            assert client.post("/models/load", json={"model": "alpha"}).json() == {"success": True}
            assert held.waiting.wait(SETTLE_S)
            waiting = pool.submit(chat, client, "alpha")  # a request waiting for the load
            assert wait_until(lambda: len(server.router._tickets) >= 2)  # both wait: /models/load's and the chat's
            assert client.post("/models/unload", json={"model": "alpha"}).json() == {"success": True}
            cancelled = waiting.result(SETTLE_S)
            assert cancelled.status_code == 503 and "cancelled" in cancelled.json()["error"]["message"]
        finally:
            held.gate.set()  # the load in progress runs to its end, and its engine is closed at once
        assert wait_until(lambda: statuses(client)["alpha"]["value"] == "unloaded", LOAD_S)
        assert len(held.engines) == 1 and held.engines[0]._closed and server.router.models == []
        # llama-ui settles its "cancel load" on `unloaded` with exit code 0 (not a failure); the feed is read in its
        # own thread, so it may reach the reader after /v1/models already says so
        assert wait_until(lambda: feed.of("alpha")[-1]["status"] == "unloaded"), feed.of("alpha")[-1]
        feed.stop()
        assert feed.of("alpha")[-1]["exit_code"] == 0
        assert chat(client, "alpha").status_code == 200  # a later request loads it again


def test_a_failed_load_is_a_failed_frame_with_a_nonzero_exit_code_and_the_reason(smollm2: Path,
                                                                                  tmp_path: Path) -> None:
    """What llama-ui reads of a load that fails: a `model_status` frame with status `failed` (or `unloaded` with a
    non-zero exit_code) rejects its pending load; the reason is the frame's `message`. A reader that joins later gets
    the same in its snapshot, and the reason is also on the dashboard's recent errors."""
    broken = tmp_path / "broken.ninfer"
    broken.write_bytes(b"NINFER" + bytes(range(256)) * 64)  # not an artifact
    config = two_models(smollm2, sse_ping_interval=0.2)  # (the readers notice stop() at their next line)
    config["models"]["broken"] = {"path": str(broken)}
    with serve_router(config) as server, httpx.Client(base_url=server.url, timeout=LOAD_S) as client:
        feed = SseReader(server.url)
        assert wait_until(lambda: len(feed.events) >= 3)  # the snapshot of the three models
        assert client.post("/models/load", json={"model": "broken"}).json() == {"success": True}
        assert wait_until(lambda: feed.of("broken")[-1]["status"] == "failed", LOAD_S), feed.of("broken")
        reason = statuses(client)["broken"]["message"]
        late = SseReader(server.url)
        assert wait_until(lambda: len(late.events) >= 3)
        errors = client.get("/dashboard/state").json()["errors"]
        feed.stop()
        late.stop()
    assert "broken.ninfer" in reason or "artifact" in reason.lower(), reason
    frames = feed.of("broken")
    assert [d["status"] for d in frames] == ["unloaded"] + ["loading"] * (len(frames) - 2) + ["failed"]
    assert all(d["exit_code"] == 0 and "message" not in d for d in frames[:-1])
    assert frames[-1]["exit_code"] == 1 and frames[-1]["message"] == reason
    snapshot = late.of("broken")[0]
    assert (snapshot["status"], snapshot["exit_code"], snapshot["message"]) == ("failed", 1, reason)
    assert [(e["model"], e["message"]) for e in errors] == [("broken", f"failed to load: {reason}")]
