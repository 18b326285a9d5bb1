"""Resumable conversation streams and the control route, on a live server (SmolLM2, CPU engine): replay from
arbitrary byte offsets while the generation runs, a client that leaves does not stop its recorded generation, control
cancels exactly its target; and the registry's memory bound."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from pathlib import Path

import httpx
import pytest
from live_servers import serve_router
from ninfer.serve.streams import StreamRegistry

LONG = {"max_tokens": 80, "temperature": 0, "stream": True,
        "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]}


@pytest.fixture(scope="module")
def server(smollm2: Path):
    with serve_router({"models": {"smol": {"path": str(smollm2), "max_context": 1024}}}) as live:
        yield live


def lookup(client: httpx.Client, conv: str) -> dict | None:
    rows = client.post("/v1/streams/lookup", json={"conversation_ids": [conv]}).json()
    return rows[0] if rows else None


def frames(raw: bytes) -> list[str]:
    return [f[6:] for f in raw.decode().split("\n\n") if f.startswith("data: ")]


def test_replay_from_any_offset_during_a_live_generation(server) -> None:
    conv = f"conv-{time.monotonic_ns()}::smol"
    client = httpx.Client(base_url=server.url, timeout=120)
    prefix = b""
    with client.stream("POST", "/v1/chat/completions", json={"model": "smol", **LONG},
                       headers={"X-Conversation-Id": conv}) as stream:
        for chunk in stream.iter_raw():
            prefix += chunk
            if prefix.count(b"\n\n") >= 4:
                break  # the "reload": the client leaves mid-generation
    row = lookup(client, conv)
    assert row is not None and not row["is_done"], "the generation must still be running for this test to mean it"

    rng = random.Random(7)
    replays: list[tuple[int, bytes]] = []
    while True:  # several readers join at random offsets of what is recorded so far, while it grows
        recorded = lookup(client, conv)
        offset = rng.randrange(0, recorded["total_bytes"] + 1)
        with client.stream("GET", "/v1/stream", params={"conv_id": conv, "from": offset}) as replay:
            first = next(replay.iter_raw(), b"")  # empty when it joined at the very end of a finished stream
        replays.append((offset, first))
        if len(replays) >= 4 or recorded["is_done"]:
            break
    resumed = client.get("/v1/stream", params={"conv_id": conv, "from": len(prefix)}).content  # tails to the end
    full = client.get("/v1/stream", params={"conv_id": conv}).content
    assert client.get(f"/v1/stream/{conv}", params={"from": 3}).content == full[3:]  # the path form

    assert prefix + resumed == full, "a reader that reconnects at its offset loses or duplicates bytes"
    for offset, first in replays:
        assert full[offset:offset + len(first)] == first
    assert sum(1 for _, first in replays if first) >= 2
    events = frames(full)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"  # not cancelled by the leaving client
    assert lookup(client, conv)["is_done"]
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]
                   if json.loads(e).get("choices"))
    assert len(text) > 100


def test_reading_past_the_recording_and_unknown_streams_are_refused(server) -> None:
    client = httpx.Client(base_url=server.url, timeout=60)
    conv = f"short-{time.monotonic_ns()}"
    response = client.post("/v1/chat/completions", json={"model": "smol", **LONG, "max_tokens": 3},
                           headers={"X-Conversation-Id": conv})
    assert response.status_code == 200
    size = lookup(client, conv)["total_bytes"]
    assert size == len(response.content)
    past = client.get("/v1/stream", params={"conv_id": conv, "from": size + 1})
    assert past.status_code == 400 and "past the" in past.json()["error"]["message"]
    assert client.get("/v1/stream", params={"conv_id": "nope"}).status_code == 404
    assert client.delete("/v1/stream", params={"conv_id": conv}).json()["success"] is True
    assert lookup(client, conv) is None
    assert client.get(f"/v1/stream/{conv}").status_code == 404  # the path form: gone too
    by_path = f"{conv}-path"  # and forgotten through the path form
    assert client.post("/v1/chat/completions", json={"model": "smol", **LONG, "max_tokens": 3},
                       headers={"X-Conversation-Id": by_path}).status_code == 200
    assert lookup(client, by_path) is not None
    assert client.delete(f"/v1/stream/{by_path}").json()["success"] is True
    assert lookup(client, by_path) is None


def _stream_until_done(client: httpx.Client, body: dict, out: dict, key: str, first: threading.Event) -> None:
    with client.stream("POST", "/v1/chat/completions", json=body) as stream:
        events = []
        for line in stream.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 3:
                    out[key + "-id"] = json.loads(events[0])["id"]
                    first.set()
    out[key] = json.loads(events[-2])["choices"][0]["finish_reason"]


def test_control_cancels_only_its_target(server) -> None:
    client = httpx.Client(base_url=server.url, timeout=120)
    # Both far longer than the test takes to stop them, however fast the machine: both are still running when the
    # slots are read and when "a" is stopped; "b" then shows that it outlived the stop.
    body = {"model": "smol", **LONG, "max_tokens": 800}
    out: dict = {}
    started = {k: threading.Event() for k in ("a", "b")}
    threads = {k: threading.Thread(target=_stream_until_done, args=(client, body, out, k, started[k]))
               for k in ("a", "b")}
    for t in threads.values():
        t.start()
    assert all(e.wait(60) for e in started.values())
    busy = [s for s in client.get("/slots").json() if s["is_processing"]]
    assert len(busy) == 2 and all(s["n_decoded"] > 0 for s in busy)

    unarmed = client.post("/v1/chat/completions/control", json={"id": out["a-id"], "action": "reasoning_end"})
    assert unarmed.status_code == 409 and "reasoning_control" in unarmed.json()["error"]["message"]
    unknown = client.post("/v1/chat/completions/control", json={"id": out["a-id"], "action": "pause"})
    assert unknown.status_code == 400 and "pause" in unknown.json()["error"]["message"]
    stopped = client.post("/v1/chat/completions/control", json={"id": out["a-id"], "action": "stop"})
    assert stopped.json() == {"success": True, "id": out["a-id"], "cancelled": 1}
    threads["a"].join(120)
    assert out["a"] == "cancelled"
    # "a" has ended; "b" still streams and still holds its lane (a stop that reached it too would have ended it).
    assert threads["b"].is_alive() and "b" not in out
    busy = [s for s in client.get("/slots").json() if s["is_processing"]]
    assert len(busy) == 1
    assert client.post("/v1/chat/completions/control", json={"id": out["b-id"], "action": "stop"}).json()["cancelled"] == 1
    threads["b"].join(120)
    assert out["b"] == "cancelled"
    gone = client.post("/v1/chat/completions/control", json={"id": out["a-id"], "action": "stop"})
    assert gone.status_code == 404


def test_registry_memory_is_bounded_and_evicts_finished_streams_first() -> None:
    async def scenario() -> None:
        registry = StreamRegistry(max_streams=3, max_total_bytes=100, max_stream_bytes=60)
        done = registry.open("old", "m", None)
        registry.append(done, b"x" * 30)
        done.finish()
        live = registry.open("live", "m", None)
        registry.append(live, b"y" * 40)
        newer = registry.open("newer", "m", None)
        registry.append(newer, b"z" * 40)  # 110 bytes: the finished "old" goes first
        assert registry.find("old") is None and registry.find("live") is live
        assert registry.total_bytes == 80
        registry.append(newer, b"z" * 30)  # past the per-stream bound: recording stops, nothing is kept
        assert newer.truncated and registry.total_bytes == 80
        for i in range(3):
            registry.open(f"extra{i}", "m", None)
        assert len(registry) == 3 and registry.find("live") is None  # the oldest running one, once none finished

    asyncio.run(scenario())
