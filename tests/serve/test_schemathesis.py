"""schemathesis against the live servers' own OpenAPI document: whatever it generates, no route answers 5xx, and
every answer is one the document describes (its status code, its content type, its body's schema, each event of a
stream), every body the document forbids is refused (negative data rejection: every documented constraint is
enforced) and every body it allows is accepted (positive data acceptance: every enforced constraint is documented),
as far as schemathesis can draw them. The refusals of allowed bodies that no schema can state (the addressed
model's vocabulary, a relation between messages, ...) are exempt one by one, each with its reason
(ACCEPTANCE_EXEMPT_BY).

Two servers, both the real router (tests/live_servers.py):
- the one-model tiny Qwen3.5 server, for every route but the two that unload the model (it is shared with the other
  serve tests, which call its engine directly) and `/models/sse`;
- a fresh two-model router (nothing resident at first) for the router's management surface, unloading included.

`GET /models/sse` is the one operation schemathesis does not call: it takes no input for schemathesis to vary, and
it is an endless event stream, which schemathesis' `case.call` would read to the end. It is checked on its own
below: a 200 `text/event-stream` whose first events are a `model_status` per configured model, read with a byte cap
and a timeout.

Each operation gets positive cases (bodies the document allows: every top-level field of the request models, with its
type and bounds) and negative ones (bodies it forbids: wrong types, out-of-range values, missing required fields),
so both the handlers and the validation in front of them are fuzzed. The generation and token routes (the ones that
parse messages, prompts and tools) get many more cases than the rest. Generation lengths that the document allows
are capped at a few tokens before each call (the fuzzing is about request shapes, and an unbounded `max_tokens`
would only make the run slow); a length of the wrong type or out of range stays, for the server to refuse; every
other field is as schemathesis drew it. test_request_fuzz.py goes inside the nested JSON (messages, content parts,
tools) that the document leaves open.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import httpx
import live_servers
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
MAX_FUZZ_TOKENS = 3
# Cases per operation, positive and negative ones (see the module doc); derandomize=True makes them the same every
# run. NINFER_FUZZ_EXAMPLES=N gives the generation routes N fresh random cases each instead (a deeper hunt).
DEEP_EXAMPLES = os.environ.get("NINFER_FUZZ_EXAMPLES")
EXAMPLES_PER_OPERATION = 50
EXAMPLES_PER_GENERATION_OPERATION = int(DEEP_EXAMPLES or 50)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection, positive_data_acceptance]
# positive_data_acceptance: a body the document allows is not refused with a 4xx other than 401, 403, 404, 409 and
# 429 (schemathesis' defaults: missing credentials, a thing that does not exist, a state conflict, a full server).
# The refusals below are of bodies valid by the document, for a reason it cannot express; each is exempt for exactly
# its operations, status and error message (any other refusal there still fails), and each says why.
CHAT = ("/v1/chat/completions", "/chat/completions")
COMPLETIONS = ("/v1/completions", "/completions")
PROMPTS = (*CHAT, "/apply-template", "/v1/responses", "/v1/responses/input_tokens", "/v1/messages",
           "/v1/messages/count_tokens")
TOOLS = (*CHAT, "/apply-template", "/v1/responses", "/v1/responses/input_tokens", "/v1/messages",
         "/v1/messages/count_tokens")
SCHEMAS = (*CHAT, "/v1/responses", "/v1/messages")  # response_format, text.format, output_config.format
ACCEPTANCE_EXEMPT_BY: list[tuple[tuple[str, ...], int, str, str]] = [
    # (paths, status, a fragment of the error message, why the document cannot say it)
    (("/detokenize", *COMPLETIONS), 400, "is outside the vocabulary",
     "token ids are bounded by the addressed model's vocabulary; one document describes every model of the router"),
    ((*CHAT, *COMPLETIONS), 400, "(max_concurrency)",
     "n is bounded by the addressed model's max_concurrency (the document states the global bound, 8)"),
    *[(PROMPTS, 400, fragment, ("images and video need a model with the vision tower (a property of the addressed "
                                "model), as a base64 data URL that decodes within the media limits (docs/vision.md)"))
      for fragment in ("without the vision tower", "data URL", "send base64 data")],
    (PROMPTS, 400, "Tool call arguments must be a mapping",
     "an earlier tool call's arguments are the JSON text of an object: a string whose content no schema types"),
    ((*CHAT, "/apply-template"), 400, "answers no tool call of an earlier assistant message",
     "a tool message answers a call of an earlier message: a relation between array items, which JSON Schema lacks"),
    (("/v1/responses", "/v1/responses/input_tokens"), 400, "input is empty",
     "input, instructions or a previous response must give the model something: a constraint across fields"),
    (TOOLS, 400, "'s name ", "a tool's name must be one the call parsers can return (its bytes, no quotes or spaces)"),
    ((*TOOLS, *SCHEMAS), 400, "JSON Schema",
     ("a schema (tool parameters, structured output) is checked by compiling it with llguidance, whose subset of "
      "JSON Schema no schema describes")),
    (("/v1/decisions", "/v1/systemone"), 422, "",
     "the decision contract (docs/decisions.md) is checked by its own validator; the document gives an object only"),
    (("/v1/score", "/v1/rerank"), 400, "",
     ("score and rerank read their JSON object by hand (one of text / prompt / messages; query and documents); "
      "the document gives an object only")),
]
ACCEPTANCE_EXEMPT: dict[tuple[str, str, int], list[str]] = {}
for _paths, _status, _fragment, _why in ACCEPTANCE_EXEMPT_BY:
    for _path in _paths:
        ACCEPTANCE_EXEMPT.setdefault(("POST", _path, _status), []).append(_fragment)
# The routes that parse prompts, messages and tools (their aliases, /chat/completions and /completions, are the same
# handlers and get the few cases of the rest).
GENERATION_PATHS = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/responses/input_tokens",
                    "/v1/messages", "/v1/messages/count_tokens", "/tokenize", "/detokenize", "/apply-template"}
STREAMING = {("GET", "/models/sse")}
UNLOADING = {("POST", "/models/unload"), ("GET", "/unload")}
# The router's management surface (llama.cpp router mode, llama-swap, control, dashboard).
MANAGEMENT_PATHS = {"/models/load", "/models/unload", "/props", "/slots", "/running", "/unload",
                    "/v1/chat/completions/control", "/dashboard/state"}
SSE_BYTE_CAP = 64 * 1024


def _cap_lengths(body: object) -> None:
    """Missing or allowed lengths (-1 and null mean "to the end of the context") become MAX_FUZZ_TOKENS."""
    if not isinstance(body, dict):
        return
    for name in LENGTH_FIELDS:
        value = body.get(name)
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if value is None or is_int and (value == -1 or value > MAX_FUZZ_TOKENS):
            body[name] = MAX_FUZZ_TOKENS


def _operations(url: str) -> list:
    schema = schemathesis.openapi.from_url(f"{url}/docs/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def _key(operation) -> tuple[str, str]:
    return operation.method.upper(), operation.path


def _checks_for(key: tuple[str, str], response) -> list:
    """CHECKS, less positive_data_acceptance for a refusal ACCEPTANCE_EXEMPT names (its status and message)."""
    fragments = ACCEPTANCE_EXEMPT.get((*key, response.status_code), ())
    if any(fragment in response.text for fragment in fragments):
        return [check for check in CHECKS if check is not positive_data_acceptance]
    return CHECKS


def _server_errors(operations: list) -> list[str]:
    """Fuzzes each operation; returns one report per operation that answered a 5xx or an answer the document does
    not describe."""
    # schemathesis' pytest plugin does not run under pytest 9 yet, so each operation's strategy is driven by
    # hypothesis here directly.
    failures: list[str] = []
    for operation in operations:
        cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))
        examples = EXAMPLES_PER_GENERATION_OPERATION if operation.path in GENERATION_PATHS else EXAMPLES_PER_OPERATION

        @given(case=cases)
        @settings(
            max_examples=examples,
            deadline=None,
            derandomize=DEEP_EXAMPLES is None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def no_server_error(case) -> None:
            _cap_lengths(case.body)
            response = case.call(timeout=60)
            case.validate_response(response, checks=_checks_for(_key(case.operation), response))

        try:
            no_server_error()
        except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - go on: one report naming every operation that failed
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:1500]}")
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


# The fields each generation and token route documents (docs/serving.md): the OpenAPI document must give each its
# type, so that schemathesis draws values of that type (positive) and of every other (negative).
DOCUMENTED_FIELDS = {
    "/v1/chat/completions": {"messages": "array", "max_tokens": "integer", "max_completion_tokens": "integer",
                             "temperature": "number", "top_p": "number", "top_k": "integer", "seed": "integer",
                             "stop": "array", "stream": "boolean", "tools": "array", "response_format": "object",
                             "logprobs": "boolean", "top_logprobs": "integer", "n": "integer"},
    "/v1/completions": {"prompt": "string", "max_tokens": "integer", "temperature": "number", "logprobs": "integer",
                        "echo": "boolean", "stream": "boolean"},
    "/v1/responses": {"input": "array", "instructions": "string", "max_output_tokens": "integer", "tools": "array",
                      "text": "object", "reasoning": "object", "previous_response_id": "string", "stream": "boolean"},
    "/v1/messages": {"messages": "array", "max_tokens": "integer", "system": "array", "tools": "array",
                     "thinking": "object", "stop_sequences": "array", "temperature": "number", "stream": "boolean"},
    "/v1/messages/count_tokens": {"messages": "array", "system": "string", "tools": "array"},
    "/tokenize": {"content": "string", "add_special": "boolean", "with_pieces": "boolean"},
    "/detokenize": {"tokens": "array"},
}


def _types(schema: dict, components: dict) -> set[str]:
    """Every JSON type a (possibly referenced, possibly oneOf) schema allows."""
    if "$ref" in schema:
        return _types(components[schema["$ref"].rsplit("/", 1)[1]], components)
    found = {schema["type"]} if isinstance(schema.get("type"), str) else set(schema.get("type") or ())
    for option in schema.get("oneOf", []) + schema.get("anyOf", []):
        found |= _types(option, components)
    return found or ({"object"} if "properties" in schema else set())


def test_the_document_types_every_documented_request_field(qwen35_server):
    document = httpx.get(f"{qwen35_server.url}/docs/openapi.json", timeout=60).json()
    components = document["components"]["schemas"]
    for path, fields in DOCUMENTED_FIELDS.items():
        body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        properties = components[body["$ref"].rsplit("/", 1)[1]]["properties"]
        for field, json_type in fields.items():
            assert json_type in _types(properties[field], components), (path, field, properties[field])


def _component(document: dict, ref: dict) -> dict:
    return document["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]


def test_the_document_gives_bounds_error_bodies_and_streams_as_served(qwen35_server):
    """The bounds that are 0 (which Litestar's own translation drops), each protocol's real error body, and the
    event stream of a generation route; checked against what the server answers, not only against the document."""
    url = qwen35_server.url
    document = httpx.get(f"{url}/docs/openapi.json", timeout=60).json()
    chat = document["paths"]["/v1/chat/completions"]["post"]
    fields = _component(document, chat["requestBody"]["content"]["application/json"]["schema"])["properties"]
    # top_p's is float32's smallest positive normal: 0 would keep no token (the sampler refuses it)
    for name, low in {"top_k": 0, "top_p": 2.0**-126, "min_p": 0, "temperature": 0, "top_logprobs": 0}.items():
        assert {"minimum": low}.items() <= next(o for o in fields[name]["anyOf"] if o["type"] != "null").items(), name
        refused = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                             json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, name: -1})
        assert refused.status_code == 400, (name, refused.text)
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    for path, body_keys in (("/v1/chat/completions", {"error"}), ("/v1/messages", {"type", "error"})):
        documented = document["paths"][path]["post"]["responses"]["400"]["content"]["application/json"]["schema"]
        assert set(_component(document, documented)["required"]) == body_keys
        answered = httpx.post(f"{url}{path}", json={"messages": 5}, timeout=60)
        assert answered.status_code == 400 and set(answered.json()) == body_keys, answered.text
    stored = document["paths"]["/v1/responses/{response_id}"]
    assert {"get", "delete"} <= set(stored) and "404" in stored["delete"]["responses"]


@pytest.mark.parametrize("path", ["/v1/responses/resp-none", "/v1/stream/none", "/v1/stream"])
def test_options_lists_every_method_of_the_path(qwen35_server, path):
    response = httpx.options(f"{qwen35_server.url}{path}", timeout=60)
    assert response.status_code == 204
    assert set(response.headers["allow"].split(", ")) == {"GET", "DELETE", "OPTIONS"}


def test_the_document_gives_the_enums_and_non_empty_prompts_the_server_enforces(qwen35_server):
    """The closed sets and the non-empty prompt are in the body models (so in the document, for schemathesis' positive
    cases to respect); each is checked against what the server answers: a value outside is a 400, one inside is not."""
    url = qwen35_server.url
    document = httpx.get(f"{url}/docs/openapi.json", timeout=60).json()
    (order,) = [p for p in document["paths"]["/v1/responses/{response_id}/input_items"]["get"]["parameters"]
                if p["name"] == "order"]
    assert set(order["schema"]["enum"]) == {"asc", "desc"}, order
    assert httpx.get(f"{url}/v1/responses/resp-none/input_items?order=sideways", timeout=60).status_code == 400
    assert httpx.get(f"{url}/v1/responses/resp-none/input_items?order=asc", timeout=60).status_code == 404
    control = _component(document, document["paths"]["/v1/chat/completions/control"]["post"]["requestBody"]["content"]
                         ["application/json"]["schema"])["properties"]["action"]
    for action in control["enum"]:
        reply = httpx.post(f"{url}/v1/chat/completions/control", json={"id": "none", "action": action}, timeout=60)
        assert reply.status_code == 404, (action, reply.text)  # a known action, for no generation
    assert httpx.post(f"{url}/v1/chat/completions/control", json={"id": "none", "action": "pause"},
                      timeout=60).status_code == 400
    messages = document["paths"]["/v1/messages"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    message = _component(document, _component(document, messages)["properties"]["messages"]["items"])
    assert set(message["properties"]["role"]["enum"]) == {"user", "assistant"}
    refused = httpx.post(f"{url}/v1/messages", timeout=60,
                         json={"max_tokens": 1, "messages": [{"role": "system", "content": "Hi"}]})
    assert refused.status_code == 400, refused.text
    completions = document["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    text, batch = _component(document, completions)["properties"]["prompt"]["anyOf"]
    assert text["minLength"] == 1 and batch["minItems"] == 1
    assert [o.get("minLength") or o.get("minItems") for o in batch["items"]["anyOf"]] == [None, 1, 1]
    for empty in ("", [], [""], [[]]):
        reply = httpx.post(f"{url}/v1/completions", json={"prompt": empty, "max_tokens": 1}, timeout=60)
        assert reply.status_code == 400, (empty, reply.text)
