"""`GET /dashboard/state` on a live router (the tiny random Qwen3.5, CPU engine, one lane and one
queue place): the queue, lane and KV
figures follow a running generation and return to idle after it; a request refused because the engine is full (429)
and a generation ended by an engine error are listed under recent errors, with their model and a one-line message."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator, Sequence

import httpx
import numpy as np
import pytest
from live_servers import SETTLE_S, artifact_for, serve_router, wait_until
from ninfer.engine import Request, SamplingParams
from ninfer.errors import EngineBusyError, EngineError, OutOfMemoryError
from ninfer.serve.calls import failure_summary

LONG = 600  # tokens: far longer than the test holds the generation (it is cancelled when its stream closes)


def state(client: httpx.Client) -> dict:
    return client.get("/dashboard/state").json()


def kv_in_use(engine: dict) -> int:
    return engine["kv_capacity_tokens"] - engine["kv_free_tokens"]


def chat_body(text: str, max_tokens: int, stream: bool) -> dict:
    return {"model": "tiny", "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": text}]}


@contextlib.contextmanager
def open_stream(client: httpx.Client, text: str) -> Iterator[httpx.Response]:
    with client.stream("POST", "/v1/chat/completions", json=chat_body(text, LONG, True)) as response:
        assert response.status_code == 200, response.read()
        yield response


@pytest.fixture(scope="module")
def server(pytestconfig, tiny_qwen3_5):
    """The tiny random Qwen3.5 model: its noise never ends by itself, so a generation runs for as long as the test
    holds it (a real model could finish its answer, and free its lane, before the test has looked)."""
    path = artifact_for(pytestconfig, tiny_qwen3_5)
    config = {"models": {"tiny": {"path": str(path), "max_context": 1024, "max_concurrency": 1, "max_queue": 1}}}
    with serve_router(config) as live:
        yield live


def test_queue_lanes_and_kv_follow_a_generation_and_a_full_engine_is_a_recent_error(server) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        assert client.post("/v1/chat/completions", json=chat_body("Hi", 2, False)).status_code == 200  # loads it
        idle = state(client)
        assert idle["resident"] == "tiny" and idle["errors"] == []
        assert (idle["engine"]["lanes"], idle["engine"]["busy_lanes"], idle["engine"]["queued"]) == (1, 0, 0)
        assert idle["engine"]["kv_capacity_tokens"] > 0 and kv_in_use(idle["engine"]) == 0
        with open_stream(client, "Tell me a long story about a lighthouse keeper.") as running:
            lines, text = running.iter_lines(), ""  # (read with next(): leaving a loop over it would close it)
            while not text:  # until text comes: the request holds the lane, its prompt and tokens in the KV
                line = next(lines)
                if line.startswith("data: {"):
                    text += "".join(c["delta"].get("reasoning_content") or c["delta"].get("content") or ""
                                    for c in json.loads(line[6:])["choices"])
            with open_stream(client, "And another one."):
                assert wait_until(lambda: state(client)["engine"]["queued"] == 1)
                busy = state(client)
                assert (busy["engine"]["busy_lanes"], busy["engine"]["queued"]) == (1, 1)
                assert kv_in_use(busy["engine"]) > 0
                assert [s["is_processing"] for s in busy["slots"]] == [True]
                refused = client.post("/v1/chat/completions", json=chat_body("One more.", 4, False))
                assert refused.status_code == 429, refused.text
        # Closing the streams cancelled both: lane, queue place and KV are free again.
        assert wait_until(lambda: (e := state(client)["engine"])["busy_lanes"] == 0 and e["queued"] == 0
                          and kv_in_use(e) == 0, SETTLE_S), state(client)["engine"]
        errors = state(client)["errors"]
    assert [e["model"] for e in errors] == ["tiny"]
    assert errors[0]["message"].startswith("429 engine full: ") and "\n" not in errors[0]["message"]
    assert refused.json()["error"]["message"] in errors[0]["message"]


class FailsAfter:
    """A token constraint that raises at its `calls`-th step: the engine ends the request with an EngineError
    (ninfer.engine.TokenConstraint's contract), after the first tokens have streamed."""

    def __init__(self, calls: int) -> None:
        self.calls = calls

    def fill_next_mask(self, new_token_ids: Sequence[int], mask: np.ndarray) -> bool:
        self.calls -= 1
        if self.calls == 0:
            raise RuntimeError("the constraint gave up")
        return False


def test_a_generation_ended_by_an_engine_error_is_a_recent_error(server) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        assert client.post("/v1/chat/completions", json=chat_body("Hi", 2, False)).status_code == 200  # loads it
        before = len(state(client)["errors"])
        served = server.router.resident.served  # the engine as the server's handlers use it
        prompt = served.engine.frontend.encode("Once upon a time")

        async def generate() -> int:
            tokens = 0
            with pytest.raises(EngineError) as failed:
                async for event in served.engine.generate(Request(prompt, SamplingParams(temperature=0.0),
                                                                  max_new_tokens=50, constraint=FailsAfter(4))):
                    tokens += len(event.token_ids)
            assert "the constraint gave up" in str(failed.value)
            return tokens

        assert asyncio.run(generate()) > 0  # it ended mid-generation, not at submission
        errors = state(client)["errors"][before:]
    assert [e["model"] for e in errors] == ["tiny"]
    message = errors[0]["message"]
    assert message.startswith("generation ended by an engine error: ") and "the constraint gave up" in message
    assert "\n" not in message, json.dumps(message)


@pytest.mark.parametrize(("error", "started", "expected"), [
    (EngineBusyError("the queue is full\n(16 waiting)"), False, "429 engine full: the queue is full (16 waiting)"),
    (EngineError("lane state lost"), True, "generation ended by an engine error: lane state lost"),
    (OutOfMemoryError("KV needs 2 GiB"), False, "request refused, out of memory: KV needs 2 GiB"),
    (EngineError("token id 99999 is outside the vocabulary"), False, None),  # the client's 400: not listed
])
def test_which_engine_errors_are_recent_errors(error: EngineError, started: bool, expected: str | None) -> None:
    assert failure_summary(error, started=started) == expected
