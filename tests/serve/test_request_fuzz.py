"""Type-confused and structurally odd JSON against every generation route of the live tiny-Qwen3.5 server: whatever
the body, the answer is never a 5xx, an error is a 4xx in the route's own protocol shape, and a streamed answer
ends cleanly (no dropped connection, no server-error frame).

schemathesis (test_schemathesis.py) varies what the OpenAPI document describes, which stops at the top-level fields;
the nesting (messages, content parts, tool calls, tools, input items, response formats) is open JSON there. Here each
route has a template body that uses every nested structure the route reads, and hypothesis edits it in one to three
places at any depth (the rest stays valid, so the odd part is reached): a value becomes another JSON type (null, a
bool, a huge or negative int, a float, a string, an odd array or object), a key or element is dropped, an unknown
one added, an array or object emptied. A body that stays valid generates at
most MAX_FUZZ_TOKENS tokens (its length field is capped after mutation unless it was made the wrong type), so the
run measures request handling, not decoding.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MAX_FUZZ_TOKENS = 3
# CI runs the same 30 bodies per route every time (derandomized); NINFER_FUZZ_EXAMPLES=N runs N fresh random ones
# (a deeper hunt: 400 per route takes ~3 min on two cores).
DEEP_EXAMPLES = os.environ.get("NINFER_FUZZ_EXAMPLES")
EXAMPLES_PER_ROUTE = int(DEEP_EXAMPLES or 30)

# Values of every JSON type, the edges included: what a field of any type may be confused with.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324]),
    st.text(max_size=12),
    st.sampled_from(["", "text", "function", "user", "assistant", "tool", "auto", "required", "json_schema"]),
)
JUNK = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["type", "text", "name", "content", "", "x"]), inner, max_size=3),
    ),
    max_leaves=6,
)

WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}

# route -> (a template body using every nested structure the route reads, its length field, error shape)
OPENAI, ANTHROPIC = "openai", "anthropic"
TEMPLATES: dict[str, tuple[dict[str, Any], str | None, str]] = {
    "/v1/chat/completions": ({
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}, {"type": "text", "text": "Now."}]},
            {"role": "assistant", "content": None, "reasoning_content": "think",
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]},
            {"role": "user", "content": "Thanks", "name": "u"},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
                                                    "parameters": WEATHER_PARAMETERS, "strict": True}},
                  {"type": "custom", "custom": {"name": "patch", "format": {"type": "text"}}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER_SCHEMA}},
        "chat_template_kwargs": {"enable_thinking": False},
        "stop": ["\n\n"], "logprobs": True, "top_logprobs": 2, "seed": 1, "temperature": 0.5, "top_p": 0.9,
        "top_k": 40, "min_p": 0.05, "presence_penalty": 0.1, "frequency_penalty": 0.1, "repetition_penalty": 1.1,
        "stream_options": {"include_usage": True}, "max_tokens": MAX_FUZZ_TOKENS,
    }, "max_tokens", OPENAI),
    "/v1/completions": ({
        "model": "m", "prompt": [[1, 2, 3]], "logprobs": 2, "echo": True,
        "stop": "x", "seed": 3, "top_k": 5, "repeat_penalty": 1.1, "max_tokens": MAX_FUZZ_TOKENS,
    }, "max_tokens", OPENAI),
    "/v1/responses": ({
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}],
             "content": [{"type": "reasoning_text", "text": "t"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"P\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "custom_tool_call", "call_id": "c2", "name": "patch", "input": "x"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "ok"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        ],
        "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMETERS, "strict": True},
                  {"type": "custom", "name": "patch", "format": {"type": "text"}}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "reasoning": {"effort": "low", "summary": "auto"},
        "text": {"format": {"type": "json_schema", "name": "a", "schema": ANSWER_SCHEMA}},
        "metadata": {"k": "v"}, "include": ["reasoning.encrypted_content"], "store": False,
        "max_output_tokens": MAX_FUZZ_TOKENS,
    }, "max_output_tokens", OPENAI),
    "/v1/responses/input_tokens": ({
        "model": "m", "instructions": "i",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                  {"type": "function_call_output", "call_id": "c1", "output": "x"}],
        "tools": [{"type": "function", "name": "f", "parameters": WEATHER_PARAMETERS}],
    }, None, OPENAI),
    "/v1/messages": ({
        "model": "m",
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                                              {"type": "tool_use", "id": "t1", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": [{"type": "text", "text": "sunny"}], "is_error": False}]},
        ],
        "tools": [{"name": "get_weather", "description": "d", "input_schema": WEATHER_PARAMETERS, "strict": True}],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": ANSWER_SCHEMA}},
        "stop_sequences": ["\n\n"], "metadata": {"user_id": "u"}, "top_k": 5,
        "max_tokens": MAX_FUZZ_TOKENS,
    }, "max_tokens", ANTHROPIC),
    "/v1/messages/count_tokens": ({
        "model": "m", "system": "s",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                     {"role": "assistant", "content": "Hello"}],
        "tools": [{"name": "f", "input_schema": WEATHER_PARAMETERS}],
        "thinking": {"type": "disabled"},
    }, None, ANTHROPIC),
    "/tokenize": ({"model": "m", "content": "Hello", "add_special": True, "with_pieces": True}, None, OPENAI),
    "/detokenize": ({"model": "m", "tokens": [1, 2, 3]}, None, OPENAI),
    "/apply-template": ({
        "model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": WEATHER_PARAMETERS}}],
        "chat_template_kwargs": {"enable_thinking": True}, "add_generation_prompt": False,
    }, None, OPENAI),
}
STREAMING_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")


Path = tuple[str | int, ...]


def _paths(value: Any, path: Path = ()) -> list[Path]:
    """Every place inside a template: dict keys and list positions, at any depth."""
    found = [path]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, (*path, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            found += _paths(inner, (*path, i))
    return found


def _edited(body: Any, path: Path, edit: str, junk: Any) -> Any:
    """A copy of `body` with one edit at `path`: `replace` it by junk, `drop` it, `empty` the container it is, or
    `add` an odd key / element into it."""
    if not path:
        if edit == "replace":
            return junk
        if edit == "empty" and isinstance(body, dict | list):
            return type(body)()
        if edit == "add" and isinstance(body, dict):
            return {**body, "x" if "type" in body else "type": junk}
        if edit == "add" and isinstance(body, list):
            return [*body, junk]
        return body
    head, rest = path[0], path[1:]
    if isinstance(body, dict):
        if edit == "drop" and not rest:
            return {k: v for k, v in body.items() if k != head}
        return {**body, head: _edited(body[head], rest, edit, junk)}
    if edit == "drop" and not rest:
        return body[:head] + body[head + 1:]
    return [*body[:head], _edited(body[head], rest, edit, junk), *body[head + 1:]]


EDITS = st.sampled_from(["replace", "replace", "drop", "empty", "add"])


def _bodies(route: str) -> st.SearchStrategy[Any]:
    """The route's template with one to three edits anywhere inside (so the odd part is reached: the rest of the
    body stays valid), or now and then a wholly odd body."""
    template, length_field, _ = TEMPLATES[route]
    paths = _paths(template)

    @st.composite
    def edited(draw: st.DrawFn) -> Any:
        body = template
        for _ in range(draw(st.integers(1, 3))):
            path = draw(st.sampled_from(paths))
            try:
                body = _edited(body, path, draw(EDITS), draw(JUNK))
            except (KeyError, IndexError, TypeError):  # an earlier edit removed or retyped this place
                pass
        return body

    streamed = st.sampled_from([False, True]) if route in STREAMING_ROUTES else st.just(None)
    return st.builds(_capped, st.one_of(edited(), edited(), edited(), edited(), JUNK), st.just(length_field),
                     streamed)


def _capped(body: Any, length_field: str | None, stream: bool | None) -> Any:
    if not isinstance(body, dict):
        return body
    if length_field is not None:
        value = body.get(length_field)
        # A missing or valid length is capped (None and -1 mean "to the end of the context"); a wrong type or an
        # out-of-range value stays, for a 400.
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if value is None or is_int and (value > MAX_FUZZ_TOKENS or value == -1):
            body[length_field] = MAX_FUZZ_TOKENS
    if stream is not None and "stream" not in body:
        body["stream"] = stream
    return body


def _check_error_shape(route: str, reply: httpx.Response) -> None:
    body = reply.json()
    if TEMPLATES[route][2] == ANTHROPIC:
        assert body["type"] == "error" and isinstance(body["error"]["type"], str), body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
    else:
        error = body["error"]
        assert isinstance(error["message"], str) and error["message"], body
        assert isinstance(error["type"], str) and {"param", "code"} <= error.keys(), body


def _post(http: httpx.Client, url: str, route: str, body: Any) -> None:
    content = json.dumps(body, allow_nan=False).encode()
    with http.stream("POST", url + route, content=content, headers={"content-type": "application/json"}) as reply:
        raw = reply.read()  # a stream must end cleanly: a dropped connection raises here
        described = f"{route} {content[:600]!r} -> {reply.status_code}: {raw[:400]!r}"
        assert reply.status_code < 500, described
        if reply.status_code >= 400:
            _check_error_shape(route, reply)
        elif reply.headers["content-type"].startswith("text/event-stream"):
            assert b'"server_error"' not in raw and b'"api_error"' not in raw, described


@pytest.mark.parametrize("route", TEMPLATES)
def test_odd_json_gets_a_client_error_in_the_protocol_shape(qwen35_server, route):
    with httpx.Client(timeout=60) as http:

        @given(body=_bodies(route))
        @settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None, derandomize=DEEP_EXAMPLES is None, database=None,
                  suppress_health_check=list(HealthCheck))
        def never_a_server_error(body: Any) -> None:
            _post(http, qwen35_server.url, route, body)

        never_a_server_error()


@pytest.mark.parametrize("route", TEMPLATES)
def test_the_templates_are_accepted(qwen35_server, route):
    """The fuzz starts from valid bodies: each edit is then the one odd thing the server meets."""
    template, _, _ = TEMPLATES[route]
    reply = httpx.post(qwen35_server.url + route, json=template, timeout=60)
    assert reply.status_code == 200, reply.text


DEEP = 100_000  # levels of nesting: deeper than any decoder's recursion goes
# Bodies that once answered 500 (each found by hand after the fuzzers above): the route, a body, what the 400 says.
ONCE_A_500 = [
    ("/v1/chat/completions", b'{"model":"m","messages":' + b"[" * DEEP + b"]" * DEEP + b"}", "nested too deeply"),
    ("/v1/chat/completions/control", b'{"id":' + b"[" * DEEP + b"]" * DEEP + b"}", "nested too deeply"),
    ("/v1/messages", b'{"model":"m","max_tokens":1,"messages":' + b"{\"a\":" * DEEP + b"1" + b"}" * DEEP + b"}",
     "nested too deeply"),
    # integers the engine's fixed-width request fields cannot hold
    ("/v1/completions", json.dumps({"prompt": [5, 2**40], "max_tokens": 1}).encode(),
     f"token id {2**40} at position 1 is outside the vocabulary"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                                         "top_k": 2**62}).encode(), "top_k"),
]


@pytest.mark.parametrize(("route", "body", "message"), ONCE_A_500, ids=[f"{r}-{m[:12]}" for r, _, m in ONCE_A_500])
def test_bodies_that_once_gave_a_500_get_a_400_that_says_why(qwen35_server, route, body, message):
    reply = httpx.post(qwen35_server.url + route, content=body, headers={"content-type": "application/json"},
                       timeout=60)
    assert reply.status_code == 400, reply.text
    _check_error_shape(route if route in TEMPLATES else "/tokenize", reply)  # an OpenAI-shaped route
    assert message in reply.text


@pytest.mark.parametrize("route", [route for route, (_, length, _) in TEMPLATES.items() if length])
def test_a_number_sent_as_a_string_is_refused_not_coerced(qwen35_server, route):
    """Litestar alone would convert "8" to 8 (lax msgspec); ninfer.serve.strict_body refuses it, naming the field,
    while the same template with the number itself is served (test_the_templates_are_accepted)."""
    template, length_field, _ = TEMPLATES[route]
    body = {**template, length_field: str(template[length_field]), "stream": False}
    reply = httpx.post(qwen35_server.url + route, json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    _check_error_shape(route, reply)
    assert re.search(rf"Expected `int( \| null)?`, got `str` - at `\$\.{length_field}`", reply.text), reply.text


@pytest.mark.parametrize("route", [route for route, (_, length, _) in TEMPLATES.items() if length])
def test_a_whole_float_is_an_integer_and_a_fraction_is_refused(qwen35_server, route):
    """JSON Schema 2020-12 (the OpenAPI document's dialect) counts `3.0` as an integer, so the strict check takes it
    for an integer field; `3.5` is still refused, naming the field."""
    template, length_field, _ = TEMPLATES[route]
    whole = {**template, length_field: float(template[length_field]), "stream": False}
    served = httpx.post(qwen35_server.url + route, json=whole, timeout=60)
    assert served.status_code == 200, served.text
    fraction = {**whole, length_field: template[length_field] + 0.5}
    refused = httpx.post(qwen35_server.url + route, json=fraction, timeout=60)
    assert refused.status_code == 400, refused.text
    _check_error_shape(route, refused)
    assert re.search(rf"Expected `int( \| null)?`, got `float` - at `\$\.{length_field}`", refused.text), refused.text
