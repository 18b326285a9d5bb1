"""A huge request is refused without stalling anyone else (issue 18, item 1).

A 50 MB body (under the 64 MiB body limit) whose one message cannot fit the context is sent to each generation route
while another client polls `/health` and reads a running stream. The huge request must be refused with the context
error of its protocol, quickly, and meanwhile no `/health` answer and no gap between two stream chunks may take more
than STALL_BOUND_S. Before the fix the prompt was rendered and tokenized on the event loop: 89-128 s per request,
`/health` 16-23 s. The memory a refused request took is given back (the process kept ~3.4 GB before the fix).

The same bound holds for ~10 MB bodies of many small JSON values (280,000 short messages, content parts or input
items, a million stop strings or logit_bias entries, a schema of 150,000 properties): their decoding, validation and
translation run in worker threads too. Before that fix they ran on the event loop: `/health` and the stream waited
1.2-6.4 s meanwhile (0.5-0.9 s for the two refused by a limit), after it 0.15-1.8 s (2 cores under a load of 6-8;
what is left is mostly the garbage collections of the body's objects, which hold the GIL in any thread).
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
import uuid
from collections.abc import Callable

import httpx
import pytest
from ninfer.frontend.text import BREAKER_SETS_KEPT
from ninfer.serve.answer import prepare
from ninfer.serve.errors import InvalidRequestError
from ninfer.serve.generation import ChatPrompt, GenerationParams, build_request, prepare_prompt
from ninfer.serve.strict_body import OFF_LOOP_BODY_BYTES
from ninfer.serve.structured import OutputFormat, build_constraint

# What docs/serving.md promises: another client's /health or stream waits at most this long for a refused request
# (measured on the embedded default model, 2 cores: 0.36-0.74 s, the JSON decoding of the 50 MB body).
STALL_BOUND_S = 2.0
HUGE_TEXT = "hello " * 8738133  # the repro: ~50 MB
HEALTH_PAUSE_S = 0.02  # between two /health polls


def _huge_bodies() -> dict[str, bytes]:
    message = [{"role": "user", "content": HUGE_TEXT}]
    bodies = {
        "/v1/chat/completions": {"messages": message, "max_tokens": 4},
        "/v1/completions": {"prompt": HUGE_TEXT, "max_tokens": 4},
        "/v1/responses": {"input": HUGE_TEXT, "max_output_tokens": 4},
        "/v1/messages": {"messages": message, "max_tokens": 4},
        "/v1/messages/count_tokens": {"messages": message},
    }
    return {path: json.dumps(body).encode() for path, body in bodies.items()}


class _Watch:
    """Polls /health and reads one long stream in background threads, recording the longest wait of each."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.health_worst = 0.0
        self.stream_worst = 0.0
        self.stream_chunks = 0
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._health), threading.Thread(target=self._stream)]

    def _health(self) -> None:
        # The wait is counted from the previous answer (less the pause), not from this request's start: the server
        # runs in this process, and a stall of the whole process (a C call holding the GIL) that begins during the
        # pause would hold this thread before it could note a start.
        with httpx.Client(timeout=60) as client:
            answered = time.perf_counter()
            while not self.stop.is_set():
                status = client.get(f"{self.url}/health").status_code
                now = time.perf_counter()
                self.health_worst = max(self.health_worst, now - answered - HEALTH_PAUSE_S)
                answered = now
                if status != 200:
                    self.errors.append(f"/health answered {status}")
                time.sleep(HEALTH_PAUSE_S)

    def _stream(self) -> None:
        body = {"messages": [{"role": "user", "content": "count"}], "max_tokens": 1000, "stream": True,
                "temperature": 1.0, "seed": 1}
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():  # a new stream when one ends, so one runs throughout
                with client.stream("POST", f"{self.url}/v1/chat/completions", json=body) as response:
                    last = time.perf_counter()
                    for _ in response.iter_lines():
                        now = time.perf_counter()
                        self.stream_worst = max(self.stream_worst, now - last)
                        self.stream_chunks += 1
                        last = now
                        if self.stop.is_set():
                            break

    def __enter__(self) -> _Watch:
        for thread in self.threads:
            thread.start()
        time.sleep(0.5)  # the stream is running
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


def _post_watched(url: str, path: str, body: bytes) -> tuple[httpx.Response, float, _Watch, int]:
    """`body` posted to `path` while _Watch runs: the answer, the seconds it took, the watch, and the stream's chunk
    count when it was sent."""
    with _Watch(url) as watch:
        chunks_before = watch.stream_chunks
        started = time.perf_counter()
        response = httpx.post(f"{url}{path}", content=body, headers={"content-type": "application/json"},
                              timeout=120)
        answered_in = time.perf_counter() - started
        time.sleep(0.3)
    return response, answered_in, watch, chunks_before


@pytest.mark.parametrize("path", list(_huge_bodies()))
def test_a_50_mb_body_is_refused_while_health_and_streams_go_on(qwen35_server, path):
    response, refused_in, watch, chunks_before = _post_watched(qwen35_server.url, path, _huge_bodies()[path])
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert "cannot fit the context of 1024 tokens" in error["message"]
    assert error["n_ctx"] == 1024 and error["n_prompt_tokens"] >= 1024
    assert refused_in < 10, refused_in  # sending and parsing 50 MB on a loaded 2-core machine, not tokenizing it
    assert not watch.errors, watch.errors
    assert watch.stream_chunks > chunks_before, "the stream made no progress meanwhile"
    assert watch.health_worst < STALL_BOUND_S, f"/health took {watch.health_worst:.2f} s"
    assert watch.stream_worst < STALL_BOUND_S, f"a stream chunk waited {watch.stream_worst:.2f} s"


def test_a_decision_over_its_budget_is_refused_before_it_is_tokenized_whole(qwen35_server):
    """A 9.4 MiB `state` (~1.6 million words) against the 64,000-token decision budget is refused (413) after a few
    pieces of it are counted (ninfer.decisions.prompt.more_tokens_than). Before, the context was tokenized whole,
    once more inside every question's prompt, each encode holding the GIL: `/health` waited 10 s, a stream 20 s,
    and the 413 came after ~24 s."""
    body = json.dumps({"state": "hello " * 1_650_000, "questions": {"a": {"type": "noul"}}}).encode()
    response, refused_in, watch, _ = _post_watched(qwen35_server.url, "/v1/decisions", body)
    assert response.status_code == 413, response.text[:300]
    assert "decision budget" in response.json()["error"]["message"]
    assert refused_in < 10, refused_in
    assert not watch.errors, watch.errors
    assert watch.health_worst < STALL_BOUND_S, f"/health took {watch.health_worst:.2f} s"
    assert watch.stream_worst < STALL_BOUND_S, f"a stream chunk waited {watch.stream_worst:.2f} s"


def test_a_long_prompt_that_fits_is_still_tokenized_and_counted(qwen35_server):
    # Below the length bound the text is tokenized (off the event loop): the count is the tokenizer's own.
    text = "hello " * 500
    frontend = qwen35_server.engine.frontend
    expected = len(frontend.encode(frontend.render([{"role": "user", "content": text}]).text))
    response = httpx.post(f"{qwen35_server.url}/v1/messages/count_tokens",
                          json={"messages": [{"role": "user", "content": text}]}, timeout=60)
    assert response.status_code == 200 and response.json() == {"input_tokens": expected}


# What a refused 50 MB request may leave behind in the server's memory (the body, the decoded JSON and the text
# are freed with the request; before the fix the process grew by ~6 GB and kept ~3.4 GB).
RETAINED_BOUND_BYTES = 150 * 2**20


def _resident_bytes() -> int:
    """This process's resident set (the live server runs in it, in a thread)."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_memory_returns_after_a_refused_50_mb_request(qwen35_server, path):
    body = _huge_bodies()[path]
    gc.collect()
    before = _resident_bytes()
    for _ in range(3):  # retained memory would add up
        response = httpx.post(f"{qwen35_server.url}{path}", content=body,
                              headers={"content-type": "application/json"}, timeout=120)
        assert response.status_code == 400, response.text[:300]
    gc.collect()
    retained = _resident_bytes() - before
    assert retained < RETAINED_BOUND_BYTES, f"{retained / 2**20:.0f} MiB retained after 3 refused requests"



# A JSON Schema so large that checking it (compiling it with llguidance, which then refuses it as too large) takes
# seconds: 150,000 properties, 2.9 s on 2 loaded cores. (A body carrying it, ~10 MB of small objects, is decoded
# and validated off the loop as well: test_a_10_mb_body_of_small_values_... below.)
def _huge_schema() -> dict[str, object]:
    # Built for each use, not kept: the live server runs in this process, and a million objects held by the test
    # would lengthen every garbage collection the server makes (its pauses are what the tests bound).
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "enum": [f"v{j}" for j in range(5)]}
                                             for i in range(150_000)}}


LOOP_GAP_BOUND_S = 1.5  # on the event loop: 2-4 s; in a worker thread: under the bound on the loaded machine


async def _worst_loop_gap(work) -> float:
    """Runs `work` (a coroutine) while a ticker measures how long the event loop goes without running it."""
    worst, done = 0.0, asyncio.Event()

    async def tick() -> None:
        nonlocal worst
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            worst, last = max(worst, now - last), now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)  # the ticker is running before the work starts
    await work
    done.set()
    await ticker
    return worst


@pytest.mark.parametrize("where", ["tool parameters", "response_format"])
def test_a_huge_schema_is_compiled_off_the_event_loop(qwen35_server, where):
    served = qwen35_server.router.entries[0].served
    messages = [{"role": "user", "content": "hi"}]
    if where == "tool parameters":
        tools = [{"type": "function", "function": {"name": "f", "parameters": _huge_schema()}}]
        work = prepare_prompt(served, ChatPrompt(messages, tools=tools, hide_tools=True))  # checked though hidden
    else:
        work = build_constraint(served.engine, OutputFormat("json_schema", _huge_schema()), "response_format",
                                starts_in_reasoning=False)

    async def refused() -> None:
        with pytest.raises(InvalidRequestError, match="schema too large"):
            await work

    worst = asyncio.run(_worst_loop_gap(refused()))
    assert worst < LOOP_GAP_BOUND_S, f"the event loop waited {worst:.2f} s"


def test_the_dry_breaker_sets_a_frontend_keeps_are_bounded(qwen35_server):
    """Every request may bring a new set of breakers, and one set's ids can be most of the vocabulary: the frontend
    keeps the last BREAKER_SETS_KEPT sets (it kept every set before), and finds a dropped one again the same."""
    frontend = qwen35_server.engine.frontend
    first = frontend.tokens_containing(("ing",))
    for i in range(BREAKER_SETS_KEPT + 8):
        frontend.tokens_containing((f"q{i + 1}", "zz"))
    assert len(frontend._containing) == BREAKER_SETS_KEPT
    assert ("ing",) not in frontend._containing
    assert frontend.tokens_containing(("ing",)) == first and len(first) > 0


def test_dry_breakers_are_looked_up_off_the_event_loop(qwen35_server):
    # A new set of DRY breakers is looked for in every vocabulary entry: 640 of them (ten times the HTTP bound, so
    # that the scan takes seconds) would hold the loop ~6 s where build_request, which runs on it, made the scan.
    served = qwen35_server.router.entries[0].served
    breakers = [f"{uuid.uuid4()}" for _ in range(640)]  # fresh: no earlier request scanned for them
    params = GenerationParams(max_tokens=1, sampling={"dry_multiplier": 0.5}, dry_sequence_breakers=breakers)

    async def work() -> None:
        prepared = await prepare(served, ChatPrompt([{"role": "user", "content": "hi"}]), params)
        request = build_request(served, prepared.prompt, prepared.params)  # on the loop, as start_generations
        assert request.sampling.dry_breakers == ()  # no token holds a uuid

    worst = asyncio.run(_worst_loop_gap(work()))
    assert worst < LOOP_GAP_BOUND_S, f"the event loop waited {worst:.2f} s"


# ~10 MB bodies of many small JSON values: cheap to send, costly to decode, validate and translate (each value is a
# Python object), which must not run on the event loop. Each is refused: its rendered prompt cannot fit the context,
# or a field over its limit. (Built as bytes for each test, as _huge_schema is.)
SMALL_VALUES = 280_000
_CONTEXT_ERROR = "cannot fit the context of 1024 tokens"
_HI = [{"role": "user", "content": "hi"}]


def _turns() -> list[dict[str, str]]:
    return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}] * (SMALL_VALUES // 2)


MANY_SMALL_VALUES: dict[str, tuple[str, Callable[[], dict[str, object]], str]] = {
    "chat messages": ("/v1/chat/completions", lambda: {"messages": _turns(), "max_tokens": 4}, _CONTEXT_ERROR),
    "chat content parts": ("/v1/chat/completions", lambda: {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}] * SMALL_VALUES}], "max_tokens": 4,
    }, _CONTEXT_ERROR),
    "chat tool schema": ("/v1/chat/completions", lambda: {
        "messages": _HI, "max_tokens": 4,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": _huge_schema()}}],
    }, "schema too large"),
    "chat stop strings": ("/v1/chat/completions", lambda: {
        "messages": _HI, "stop": ["stop"] * 1_200_000, "max_tokens": 4}, "at most 16 stop strings"),
    "chat logit_bias": ("/v1/chat/completions", lambda: {
        "messages": _HI, "logit_bias": {str(i): 1.0 for i in range(750_000)}, "max_tokens": 4,
    }, "logit_bias is not supported"),
    "messages": ("/v1/messages", lambda: {"messages": _turns(), "max_tokens": 4}, _CONTEXT_ERROR),
    "responses input items": ("/v1/responses", lambda: {
        "input": _HI * SMALL_VALUES, "max_output_tokens": 4}, _CONTEXT_ERROR),
}


@pytest.mark.parametrize("case", list(MANY_SMALL_VALUES))
def test_a_10_mb_body_of_small_values_is_refused_while_health_and_streams_go_on(qwen35_server, case):
    path, body, refusal = MANY_SMALL_VALUES[case]
    raw = json.dumps(body()).encode()
    gc.collect()  # the body's objects are gone before the server reads it
    assert 8 * 2**20 < len(raw) < 12 * 2**20, len(raw)
    with _Watch(qwen35_server.url) as watch:
        chunks_before = watch.stream_chunks
        response = httpx.post(f"{qwen35_server.url}{path}", content=raw,
                              headers={"content-type": "application/json"}, timeout=120)
        time.sleep(0.3)
    assert response.status_code == 400, response.text[:300]
    assert refusal in response.json()["error"]["message"], response.text[:300]
    assert not watch.errors, watch.errors
    assert watch.stream_chunks > chunks_before, "the stream made no progress meanwhile"
    assert watch.health_worst < STALL_BOUND_S, f"/health waited {watch.health_worst:.2f} s"
    assert watch.stream_worst < STALL_BOUND_S, f"a stream chunk waited {watch.stream_worst:.2f} s"


# Bodies over OFF_LOOP_BODY_BYTES are validated in a worker thread, smaller ones inline: the same answers either way.
# Each refused body is sent as it is and padded past the threshold with a field no route reads (ignored, as every
# unknown field is), placed after the fault so that a malformed body's message names the same byte.
REFUSED_BODIES = [
    ("/v1/chat/completions", '{"messages": [{"role": "wizard", "content": "x"}]%s}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "max_tokens": "8"%s}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "temperature": 3%s}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "max_tokens": 8.5%s}'),
    ("/v1/chat/completions", '{"messages": [}%s}'),
    ("/v1/chat/completions", '[1%s]'),
    ("/v1/messages", '{"messages": [{"role": "system", "content": "x"}], "max_tokens": 4%s}'),
    ("/v1/responses", '{"input": 5%s}'),
    ("/v1/completions", '{"prompt": "", "max_tokens": 4%s}'),
]


@pytest.mark.parametrize(("path", "template"), REFUSED_BODIES)
def test_a_large_body_is_refused_as_the_same_small_one_is(qwen35_server, path, template):
    pad = ', "padding": "%s"' % ("x" * (OFF_LOOP_BODY_BYTES + 1))
    if template.startswith("["):
        pad = ', "%s"' % ("x" * (OFF_LOOP_BODY_BYTES + 1))
    answers = []
    for body in (template % "", template % pad):
        response = httpx.post(f"{qwen35_server.url}{path}", content=body.encode(),
                              headers={"content-type": "application/json"}, timeout=60)
        answers.append((response.status_code, response.json()))
    assert len(template % pad) > OFF_LOOP_BODY_BYTES > len(template % "")
    assert answers[0][0] == 400, answers[0]
    assert answers[1] == answers[0]
