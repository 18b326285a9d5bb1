"""One validation per field, the same on every route (issue 18, item 5): what chat refuses, the other routes that
carry the same field refuse too, each in its protocol's error shape with a message naming the field."""

from __future__ import annotations

import httpx
import pytest

USER = [{"role": "user", "content": "hi"}]
BAD_SCHEMAS = [5, [1, 2], {"type": "nonsense"}, 0]  # 0: Messages replaced a falsy input_schema


def _chat_tool(schema):
    return [{"type": "function", "function": {"name": "f", "parameters": schema}}]


CASES = {
    "chat role": ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    "tool message without id": ("/v1/chat/completions",
                                {"messages": [*USER, {"role": "tool", "content": "42"}]}, "tool_call_id"),
    "tool message answering nothing": ("/v1/chat/completions",
                                       {"messages": [*USER, {"role": "tool", "content": "42", "tool_call_id": "c1"}]},
                                       "answers no tool call"),
    "json_schema without schema": ("/v1/chat/completions",
                                   {"messages": USER, "response_format": {"type": "json_schema",
                                                                          "json_schema": {"name": "x"}}}, "schema"),
    "top_logprobs without logprobs": ("/v1/chat/completions", {"messages": USER, "top_logprobs": 3}, "logprobs"),
    "completions logprobs 6": ("/v1/completions", {"prompt": "hi", "logprobs": 6}, "logprobs"),
    # /apply-template renders what chat would: the same messages are refused
    "apply-template tool message answering nothing": (
        "/apply-template", {"messages": [*USER, {"role": "tool", "content": "42", "tool_call_id": "c1"}]},
        "answers no tool call"),
    "messages empty content": ("/v1/messages", {"messages": [{"role": "user", "content": []}]}, "content"),
    "count_tokens output_format": ("/v1/messages/count_tokens",
                                   {"messages": USER, "output_format": {"type": "yaml"}}, "output_format.type"),
    # llama.cpp's sampler fields in the engine's ranges (a float32 0 or an int32 overflow was the engine's 400)
    "chat xtc_threshold": ("/v1/chat/completions", {"messages": USER, "xtc_threshold": 2}, "xtc_threshold"),
    "chat repeat_last_n": ("/v1/chat/completions", {"messages": USER, "repeat_last_n": 2**31}, "repeat_last_n"),
    "chat repetition_penalty": ("/v1/chat/completions", {"messages": USER, "repetition_penalty": 1e-300},
                                "repetition_penalty"),
}
# The sampling fields each route carries are typed once (ninfer.serve.fields): the same bounds everywhere.
for path, base in (("/v1/chat/completions", {"messages": USER}), ("/v1/responses", {"input": "hi"}),
                   ("/v1/messages", {"messages": USER})):
    for name, value in (("temperature", 2.5), ("temperature", -0.1), ("top_p", 1.5), ("top_p", 0.0), ("top_k", -1)):
        CASES[f"{path} {name}={value}"] = (path, {**base, name: value}, name)
for path, base in (("/v1/chat/completions", {"messages": USER, "logprobs": True}), ("/v1/responses", {"input": "hi"})):
    CASES[f"{path} top_logprobs=21"] = (path, {**base, "top_logprobs": 21}, "top_logprobs")
# Stop strings: chat's `stop` and Messages' `stop_sequences` share one bound (Responses defines no stop field).
TOO_MANY_STOPS = [f"stop{i}" for i in range(1000)]
CASES["chat 1000 stop strings"] = ("/v1/chat/completions", {"messages": USER, "stop": TOO_MANY_STOPS}, "stop")
CASES["messages 1000 stop_sequences"] = ("/v1/messages", {"messages": USER, "stop_sequences": TOO_MANY_STOPS},
                                         "stop_sequences")
# llama.cpp's `samplers` (chat and completions): at most 64 entries, as a list or as ';'-separated names; at most
# 64 `dry_sequence_breakers`.
for path, base in (("/v1/chat/completions", {"messages": USER}), ("/v1/completions", {"prompt": "hi"})):
    CASES[f"{path} 65 samplers"] = (path, {**base, "samplers": ["top_k"] * 65}, "samplers")
    CASES[f"{path} 65 ';' samplers"] = (path, {**base, "samplers": ";".join(["top_k"] * 65)}, "samplers")
    CASES[f"{path} 65 dry_sequence_breakers"] = (path, {**base, "dry_sequence_breakers": ["x"] * 65},
                                                 "dry_sequence_breakers")
for i, schema in enumerate(BAD_SCHEMAS):
    CASES[f"chat tool schema {i}"] = ("/v1/chat/completions", {"messages": USER, "tools": _chat_tool(schema)},
                                      "tools[0].parameters")
    CASES[f"responses tool schema {i}"] = (
        "/v1/responses", {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": schema}]},
        "tools[0].parameters")
    CASES[f"messages tool schema {i}"] = (
        "/v1/messages", {"messages": USER, "max_tokens": 1, "tools": [{"name": "f", "input_schema": schema}]},
        "tools[0].parameters")
    CASES[f"count_tokens tool schema {i}"] = (
        "/v1/messages/count_tokens", {"messages": USER, "tools": [{"name": "f", "input_schema": schema}]},
        "tools[0].parameters")
# Tools are checked whether or not `tool_choice` hides them from the template.
CASES["chat hidden tool"] = ("/v1/chat/completions",
                             {"messages": USER, "tools": _chat_tool(5), "tool_choice": "none"}, "tools[0].parameters")
CASES["responses hidden tool"] = (
    "/v1/responses", {"input": "hi", "tool_choice": "none",
                      "tools": [{"type": "function", "name": "f", "parameters": 5}]}, "tools[0].parameters")
CASES["messages hidden tool"] = ("/v1/messages", {"messages": USER, "tool_choice": {"type": "none"},
                                                  "tools": [{"name": "f", "input_schema": 5}]}, "tools[0].parameters")


@pytest.mark.parametrize("case", list(CASES))
def test_each_route_refuses_the_field(qwen35_server, case):
    path, body, named = CASES[case]
    body = {"max_tokens": 1, **body} if path != "/v1/responses" and "count_tokens" not in path else body
    response = httpx.post(f"{qwen35_server.url}{path}", json=body, timeout=60)
    assert response.status_code == 400, response.text[:300]
    payload = response.json()
    error = payload["error"]
    if path.startswith("/v1/messages"):
        assert payload["type"] == "error" and error["type"] == "invalid_request_error"
    else:
        assert error["type"] == "invalid_request_error"
    assert named in error["message"] or named == error.get("param"), error


# `n` and `seed` are chat fields that neither Responses nor Messages defines. Chat does not refuse a field it does not
# define (SDKs send newer fields than a server knows), so those routes ignore these as chat ignores an unknown one.
UNDEFINED_FIELDS = {"n": 100, "seed": 1.5, "no_such_field": True}
IGNORING_ROUTES = {"/v1/chat/completions": {"messages": USER, "max_tokens": 1, "no_such_field": True},
                   "/v1/responses": {"input": "hi", "max_output_tokens": 1, **UNDEFINED_FIELDS},
                   "/v1/messages": {"messages": USER, "max_tokens": 1, **UNDEFINED_FIELDS}}


@pytest.mark.parametrize("path", list(IGNORING_ROUTES))
def test_a_field_the_protocol_does_not_define_is_ignored_as_chat_ignores_it(qwen35_server, path):
    response = httpx.post(f"{qwen35_server.url}{path}", json=IGNORING_ROUTES[path], timeout=60)
    assert response.status_code == 200, response.text[:300]


@pytest.mark.parametrize(("path", "base"), [("/v1/chat/completions", {"messages": USER, "max_tokens": 1}),
                                            ("/v1/completions", {"prompt": "hi", "max_tokens": 1})])
@pytest.mark.parametrize("value", [1.5, -1])
def test_chat_refuses_a_seed_that_is_not_a_count(qwen35_server, path, base, value):
    """The counterpart of the test above: where the protocol defines `seed`, it is validated."""
    response = httpx.post(f"{qwen35_server.url}{path}", json={**base, "seed": value}, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "seed", response.text[:300]


def test_a_valid_tool_schema_and_answered_call_pass(qwen35_server):
    messages = [*USER, {"role": "assistant", "content": None,
                        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "content": "42", "tool_call_id": "c1"}]
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    response = httpx.post(f"{qwen35_server.url}/v1/chat/completions", timeout=60,
                          json={"messages": messages, "tools": _chat_tool(schema), "max_tokens": 1})
    assert response.status_code == 200, response.text[:300]


@pytest.mark.parametrize("query", ["from=-1", "from=abc"])
@pytest.mark.parametrize("route", ["/v1/stream?conv_id=nothing&", "/v1/stream/nothing?"])
def test_a_refused_query_parameter_is_named_as_the_client_spells_it(qwen35_server, route, query):
    response = httpx.get(f"{qwen35_server.url}{route}{query}", timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "from", response.text


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/tokenize"])
def test_a_body_labelled_as_not_json_is_refused_unread(qwen35_server, path, content_type):
    """`Content-Type` is respected: a JSON body sent as text/plain (or a form) is a 415 in the route's error shape,
    not parsed as JSON; the same bytes labelled application/json (or unlabelled) are served."""
    body = (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "input": "hi", '
            b'"max_output_tokens": 1, "content": "hi"}')
    refused = httpx.post(f"{qwen35_server.url}{path}", content=body, headers={"content-type": content_type},
                         timeout=60)
    assert refused.status_code == 415, refused.text[:300]
    error = refused.json()["error"]
    assert content_type in error["message"] and "application/json" in error["message"], error
    for label in ({"content-type": "application/json; charset=utf-8"}, {}):
        served = httpx.post(f"{qwen35_server.url}{path}", content=body, headers=label, timeout=60)
        assert served.status_code == 200, (label, served.text[:300])
