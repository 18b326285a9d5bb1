"""Resumable conversation streams and the control route, on a live server (SmolLM2, CPU engine): replay from
arbitrary byte offsets while the generation runs, a client that leaves does not stop its recorded generation, control
cancels exactly its target (addressed by completion id or by conversation id), a running stream evicted from the
registry ends its readers; and the registry's memory bound."""

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


def _stream_until_done(client: httpx.Client, body: dict, out: dict, key: str, first: threading.Event,
                       headers: dict | None = None) -> None:
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as stream:
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


def test_slots_show_the_prompt_tokens_the_prefix_cache_served(server) -> None:
    client = httpx.Client(base_url=server.url, timeout=120)
    story = "Tell me a long story about a lighthouse keeper and the ships she saw. " * 12
    body = {"model": "smol", **LONG, "max_tokens": 800, "messages": [{"role": "user", "content": story}]}
    client.post("/v1/chat/completions", json={**body, "stream": False, "max_tokens": 1}).raise_for_status()
    out: dict = {}
    started = threading.Event()
    thread = threading.Thread(target=_stream_until_done, args=(client, body, out, "a", started))
    thread.start()
    assert started.wait(60)
    (busy,) = [s for s in client.get("/slots").json() if s["is_processing"]]
    # SmolLM2 is a plain decoder: the prompt's every whole block before its last token came from the first request.
    assert busy["n_prompt_tokens_cache"] == (busy["n_prompt_tokens"] - 1) // 64 * 64 > 0
    assert client.post("/v1/chat/completions/control", json={"id": out["a-id"], "action": "stop"}).json()["cancelled"]
    thread.join(120)
    assert out["a"] == "cancelled"


def test_control_addressed_by_conversation_id_cancels_only_that_generation(server) -> None:
    """llama-ui's stop button addresses a generation by its X-Conversation-Id: exactly that one stops."""
    client = httpx.Client(base_url=server.url, timeout=120)
    body = {"model": "smol", **LONG, "max_tokens": 800}  # far longer than the test holds them (as above)
    convs = {k: f"conv-{k}-{time.monotonic_ns()}::smol" for k in ("a", "b")}
    out: dict = {}
    started = {k: threading.Event() for k in convs}
    threads = {k: threading.Thread(target=_stream_until_done, args=(client, body, out, k, started[k]),
                                   kwargs={"headers": {"X-Conversation-Id": convs[k]}}) for k in convs}
    for t in threads.values():
        t.start()
    assert all(e.wait(60) for e in started.values())

    stopped = client.post("/v1/chat/completions/control", json={"id": convs["a"], "action": "stop"})
    assert stopped.json() == {"success": True, "id": convs["a"], "cancelled": 1}
    threads["a"].join(120)
    assert out["a"] == "cancelled" and lookup(client, convs["a"])["is_done"]
    # "b" still streams, records and holds its lane (a stop that reached it too would have ended it).
    assert threads["b"].is_alive() and "b" not in out and not lookup(client, convs["b"])["is_done"]
    busy = [s for s in client.get("/slots").json() if s["is_processing"]]
    assert [s["conversation_id"] for s in busy] == [convs["b"]]
    stopped = client.post("/v1/chat/completions/control", json={"id": convs["b"], "action": "stop"})
    assert stopped.json()["cancelled"] == 1
    threads["b"].join(120)
    assert out["b"] == "cancelled"


def _read_all(client: httpx.Client, path: str, params: dict, out: list[bytes], first: threading.Event) -> None:
    with client.stream("GET", path, params=params) as stream:
        for chunk in stream.iter_raw():
            out.append(chunk)
            first.set()


def test_evicting_a_running_stream_ends_its_readers_with_what_was_recorded(server, monkeypatch) -> None:
    """When the registry is full, a running stream is evicted once no finished one is left to evict (the module
    doc): a reader attached to it gets the bytes recorded until then and its stream ends (no `[DONE]`); the stream is
    no longer found; the generation itself runs on for the client that made the request."""
    client = httpx.Client(base_url=server.url, timeout=120)
    conv = f"evicted-{time.monotonic_ns()}"
    body = {"model": "smol", **LONG, "max_tokens": 800}
    with client.stream("POST", "/v1/chat/completions", json=body, headers={"X-Conversation-Id": conv}) as original:
        chunks = original.iter_raw()  # (read with next(): leaving a loop over it would close the request)
        received = b""
        while received.count(b"\n\n") < 4:
            received += next(chunks)
        replayed: list[bytes] = []
        attached = threading.Event()
        reader = threading.Thread(target=_read_all, args=(httpx.Client(base_url=server.url, timeout=120),
                                                          "/v1/stream", {"conv_id": conv}, replayed, attached),
                                  daemon=True)
        reader.start()
        assert attached.wait(60)

        monkeypatch.setattr(server.app.state.streams, "max_streams", 1)
        other = client.post("/v1/chat/completions", json={"model": "smol", **LONG, "max_tokens": 2},
                            headers={"X-Conversation-Id": f"{conv}-newer"})
        assert other.status_code == 200
        reader.join(60)
        assert not reader.is_alive(), "the reader of the evicted stream still waits"
        assert lookup(client, conv) is None and client.get("/v1/stream", params={"conv_id": conv}).status_code == 404

        more = len(b"".join(replayed)) + 200  # the request goes on past what was recorded before the eviction
        while len(received) < more:
            received += next(chunks)
        stop = client.post("/v1/chat/completions/control", json={"id": conv, "action": "stop"})
        assert stop.json()["cancelled"] == 1
        for chunk in chunks:
            received += chunk
    replay = b"".join(replayed)
    assert replay and received.startswith(replay) and b"[DONE]" not in replay
    assert frames(received)[-1] == "[DONE]"
    assert json.loads(frames(received)[-2])["choices"][0]["finish_reason"] == "cancelled"


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
