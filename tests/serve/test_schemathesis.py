"""schemathesis against the live server's own OpenAPI document: whatever it generates, no route answers 5xx.

Generation lengths are capped at a few tokens before each call (the fuzzing is about request shapes, and an
unbounded `max_tokens` would only make the run slow); every other field is as schemathesis drew it.
"""

from __future__ import annotations

import protocol_servers
import schemathesis
from hypothesis import HealthCheck, given, settings

qwen35_server = protocol_servers.qwen35_server  # fixture

LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
MAX_FUZZ_TOKENS = 3
# Every operation is fuzzed; 3 generated bodies each keep the whole run near a minute on two cores (6 took twice that),
# and derandomize=True makes them the same every run.
EXAMPLES_PER_OPERATION = 3
# The router's management surface needs the multi-model router, which this one-model protocol server does not run
# (its lifecycle and routes are tested against the real router in tests/router). Fuzzing them under the real router
# is still to do: its /models/sse stream never ends, so it needs a streaming-aware harness. Every other route is fuzzed.
ROUTER_ONLY_PATHS = {"/models/load", "/models/unload", "/models/sse", "/props", "/slots", "/running", "/unload",
                     "/v1/chat/completions/control", "/dashboard/state"}


def _cap_lengths(body: object) -> None:
    if not isinstance(body, dict):
        return
    for name in LENGTH_FIELDS:
        value = body.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value > MAX_FUZZ_TOKENS:
            body[name] = MAX_FUZZ_TOKENS


def test_no_request_gets_a_server_error(qwen35_server):
    # schemathesis' pytest plugin does not run under pytest 9 yet, so each operation's strategy is driven by
    # hypothesis here directly.
    schema = schemathesis.openapi.from_url(f"{qwen35_server.url}/docs/openapi.json")
    operations = [op for op in (result.ok() for result in schema.get_all_operations())
                  if op.path not in ROUTER_ONLY_PATHS]
    assert len(operations) >= 10
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
            response = case.call(timeout=30)
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:500]}"
            )

        try:
            no_server_error()
        except AssertionError as exc:  # go on: one report naming every operation that failed
            failures.append(str(exc).splitlines()[0])
    assert not failures, "\n".join(failures)
