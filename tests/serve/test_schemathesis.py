"""schemathesis against the live servers' own OpenAPI document: whatever it generates, no route answers 5xx.

Two servers, both the real router (tests/live_servers.py):
- the one-model tiny Qwen3.5 server, for every route but the two that unload the model (it is shared with the other
  serve tests, which call its engine directly) and `/models/sse`;
- a fresh two-model router (nothing resident at first) for the router's management surface, unloading included.

`GET /models/sse` is the one operation schemathesis does not call: it takes no input for schemathesis to vary, and
it is an endless event stream, which schemathesis' `case.call` would read to the end. It is checked on its own
below: a 200 `text/event-stream` whose first events are a `model_status` per configured model, read with a byte cap
and a timeout.

Generation lengths are capped at a few tokens before each call (the fuzzing is about request shapes, and an
unbounded `max_tokens` would only make the run slow); every other field is as schemathesis drew it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import live_servers
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
MAX_FUZZ_TOKENS = 3
# 3 generated bodies per operation keep the whole run near a minute on two cores (6 took twice that), and
# derandomize=True makes them the same every run.
EXAMPLES_PER_OPERATION = 3
STREAMING = {("GET", "/models/sse")}
UNLOADING = {("POST", "/models/unload"), ("GET", "/unload")}
# The router's management surface (llama.cpp router mode, llama-swap, control, dashboard).
MANAGEMENT_PATHS = {"/models/load", "/models/unload", "/props", "/slots", "/running", "/unload",
                    "/v1/chat/completions/control", "/dashboard/state"}
SSE_BYTE_CAP = 64 * 1024


def _cap_lengths(body: object) -> None:
    if not isinstance(body, dict):
        return
    for name in LENGTH_FIELDS:
        value = body.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value > MAX_FUZZ_TOKENS:
            body[name] = MAX_FUZZ_TOKENS


def _operations(url: str) -> list:
    schema = schemathesis.openapi.from_url(f"{url}/docs/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def _key(operation) -> tuple[str, str]:
    return operation.method.upper(), operation.path


def _server_errors(operations: list) -> list[str]:
    """Fuzzes each operation; returns one line per operation that answered a 5xx."""
    # schemathesis' pytest plugin does not run under pytest 9 yet, so each operation's strategy is driven by
    # hypothesis here directly.
    failures: list[str] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def no_server_error(case) -> None:
            _cap_lengths(case.body)
            response = case.call(timeout=60)
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:500]}"
            )

        try:
            no_server_error()
        except AssertionError as exc:  # go on: one report naming every operation that failed
            failures.append(str(exc).splitlines()[0])
    return failures


def test_no_request_gets_a_server_error(qwen35_server):
    operations = [op for op in _operations(qwen35_server.url) if _key(op) not in STREAMING | UNLOADING]
    assert len(operations) >= 20
    # The one-model case of the router serves the management surface too, and it is fuzzed here as well.
    assert {op.path for op in operations} >= MANAGEMENT_PATHS - {path for _, path in UNLOADING}
    failures = _server_errors(operations)
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def router_server(pytestconfig, smollm2_gguf) -> Iterator[live_servers.LiveServer]:
    smollm2 = live_servers.artifact_for(pytestconfig, smollm2_gguf)
    with live_servers.serve_router(live_servers.two_models(smollm2)) as live:
        yield live


def test_management_routes_get_no_server_error(router_server):
    operations = [op for op in _operations(router_server.url)
                  if op.path in MANAGEMENT_PATHS and _key(op) not in STREAMING]
    assert {op.path for op in operations} == MANAGEMENT_PATHS
    failures = _server_errors(operations)
    assert not failures, "\n".join(failures)


def test_models_sse_is_an_event_stream_of_every_model(router_server):
    events: list[dict] = []
    buffer = b""
    with httpx.stream("GET", f"{router_server.url}/models/sse", timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for chunk in response.iter_raw():
            buffer += chunk
            assert len(buffer) <= SSE_BYTE_CAP, "the first status events never completed"
            *frames, rest = buffer.split(b"\n\n")
            for frame in frames:
                data = [line[6:] for line in frame.decode().splitlines() if line.startswith("data: ")]
                events.extend(json.loads(d) for d in data)
            buffer = rest
            if len(events) >= len(router_server.router.entries):
                break
    assert [e["model"] for e in events] == ["alpha", "beta"]
    assert all(e["event"] == "model_status" and e["data"]["status"] in ("unloaded", "loading", "loaded", "failed")
               for e in events)
