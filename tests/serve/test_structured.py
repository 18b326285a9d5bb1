"""Structured output (ninfer.serve.structured) against llguidance directly, with the real Qwen3.5 tokenizer.

The engine's per-step mask hook is not in this build yet, so these tests drive `TokenConstraint` the way the engine
will: ask for a mask, pick a token it allows (from random logits), feed it back. The fast mask (llguidance's trie
walk) is compared with a slow twin that tries each token on a copy of the parser.
"""

from __future__ import annotations

import json
import random

import anthropic
import jsonschema
import live_servers
import llguidance
import numpy as np
import openai
import pytest
from ninfer.artifact.tokenizer_build import qwen35_tokenizer_json
from ninfer.errors import EngineError
from ninfer.frontend.text import Frontend
from ninfer.serve import structured
from ninfer.serve.structured import (
    OutputFormat,
    TokenConstraint,
    allowed_token_ids,
    anthropic_output_format,
    apply_mask,
    chat_response_format,
    compile_grammar,
    grammar_tokenizer,
    mask_words,
    responses_text_format,
)

QWEN35_VOCAB = 248320  # the model's logits width; the tokenizer has fewer entries
QWEN35_EOS = [248046, 248044]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "tags", "active"],
    "additionalProperties": False,
}
POINT_LIST = {
    "type": "object",
    "properties": {
        "points": {
            "type": "array",
            "maxItems": 4,
            "items": {
                "type": "object",
                "properties": {
                    "x": {"type": "number", "minimum": -10, "maximum": 10},
                    "label": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 5}]},
                },
                "required": ["x", "label"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["points"],
    "additionalProperties": False,
}


@pytest.fixture(scope="session")
def frontend() -> Frontend:
    return Frontend(
        {"tokenizer_json": qwen35_tokenizer_json(), "special_tokens": {"eos": QWEN35_EOS}}, QWEN35_EOS
    )


@pytest.fixture(scope="session")
def llg_tokenizer(frontend: Frontend) -> llguidance.LLTokenizer:
    return grammar_tokenizer(frontend, QWEN35_VOCAB)


def _constraint(frontend, llg_tokenizer, schema, starts_in_reasoning=False) -> TokenConstraint:
    grammar = compile_grammar(OutputFormat("json_schema", schema), "text.format.schema")
    return TokenConstraint(grammar, llg_tokenizer, frontend, starts_in_reasoning=starts_in_reasoning)


# --- request fields ------------------------------------------------------------------------------------------


def test_request_fields_parse_to_one_format():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = chat_response_format(
        {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}}
    )
    assert chat == OutputFormat("json_schema", schema, "t", True)
    resp = responses_text_format(
        {"format": {"type": "json_schema", "name": "t", "schema": schema, "strict": True}}
    )
    assert resp == chat
    assert anthropic_output_format({"type": "json_schema", "schema": schema}) == OutputFormat(
        "json_schema", schema
    )
    assert chat_response_format({"type": "json_object"}).schema == {"type": "object"}
    assert responses_text_format({"format": {"type": "json_object"}}).kind == "json_object"
    assert chat_response_format({"type": "text"}) is None
    assert responses_text_format({"format": {"type": "text"}}) is None
    assert responses_text_format(None) is None and chat_response_format(None) is None


@pytest.mark.parametrize(
    ("parse", "value", "message"),
    [
        (chat_response_format, {"type": "xml"}, "response_format.type must be"),
        (chat_response_format, {"type": "json_schema"}, "response_format.json_schema must be an object"),
        (
            chat_response_format,
            {"type": "json_schema", "json_schema": {"schema": 3}},
            "schema must be an object",
        ),
        (
            responses_text_format,
            {"format": {"type": "json_schema", "schema": {}, "strict": "yes"}},
            "strict must",
        ),
        (responses_text_format, {"format": "json"}, "text.format must be an object"),
        (anthropic_output_format, {"type": "json_schema"}, "output_format.schema must be an object"),
    ],
)
def test_request_field_errors_name_the_field(parse, value, message):
    with pytest.raises(EngineError, match=message):
        parse(value)


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, ['"not"']),
        ({"if": {"type": "string"}, "then": {"maxLength": 3}}, ['"if"', '"then"']),
        ({"type": "object", "unevaluatedProperties": False}, ['"unevaluatedProperties"']),
        ({"type": "object", "dependentSchemas": {"a": {}}}, ['"dependentSchemas"']),
    ],
)
def test_unsupported_schema_features_are_named(schema, named):
    with pytest.raises(EngineError) as info:
        compile_grammar(OutputFormat("json_schema", schema), "response_format.json_schema.schema")
    message = str(info.value)
    assert message.startswith("response_format.json_schema.schema uses JSON Schema features")
    for key in named:
        assert key in message


def test_invalid_schema_is_refused():
    with pytest.raises(EngineError, match="Invalid type"):
        compile_grammar(OutputFormat("json_schema", {"type": "strin"}), "text.format.schema")


# --- masks ---------------------------------------------------------------------------------------------------


def _reference_mask(constraint: TokenConstraint, token_ids: np.ndarray) -> np.ndarray:
    """Slow twin: a token is allowed when a copy of the parser accepts it (EOS: when the value is complete)."""
    matcher = constraint._matcher
    allowed = []
    for token in token_ids.tolist():
        if token in QWEN35_EOS:
            ok = matcher.is_accepting()
        else:
            ok = matcher.deep_copy().try_consume_tokens([token]) == 1
        allowed.append(ok)
    return np.array(allowed)


def _random_instance(rng: random.Random, schema: dict) -> object:
    alphabet = 'abcxyz 0é"\\\n{}'
    if schema is PERSON:
        return {
            "name": "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))),
            "age": rng.randint(0, 150),
            "role": rng.choice(["admin", "user", "guest"]),
            "tags": [
                "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
                for _ in range(rng.randint(0, 3))
            ],
            "active": rng.random() < 0.5,
        }
    return {
        "points": [
            {
                "x": round(rng.uniform(-10, 10), rng.randint(0, 3)) or 0.0,  # never -0.0 (see below)
                "label": None
                if rng.random() < 0.5
                else "".join(rng.choice("ab ") for _ in range(rng.randint(0, 5))),
            }
            for _ in range(rng.randint(0, 4))
        ]
    }


# Fixed seeds: the test is deterministic, and each seed draws several instances.
@pytest.mark.parametrize("seed", [11, 2024, 31337])
@pytest.mark.parametrize("schema", [PERSON, POINT_LIST], ids=["person", "points"])
def test_fast_mask_agrees_with_slow_twin_on_random_prefixes(frontend, llg_tokenizer, schema, seed):
    rng = random.Random(seed)
    np_rng = np.random.default_rng(seed)
    for _ in range(3):
        value = _random_instance(rng, schema)
        jsonschema.validate(value, schema)
        # Non-ASCII characters as themselves: llguidance 1.9.1 rejects `\uXXXX` escapes (see below).
        text = json.dumps(value, indent=rng.choice([None, 1]), ensure_ascii=False)
        tokens = frontend.encode(text)
        cut = rng.randint(0, len(tokens))
        constraint = _constraint(frontend, llg_tokenizer, schema)
        mask = np.zeros(mask_words(QWEN35_VOCAB), dtype=np.uint32)
        assert constraint.fill_next_mask(tokens[:cut], mask), f"seed {seed}"
        assert constraint.error is None, f"seed {seed}: {constraint.error}"
        fast = allowed_token_ids(mask)
        assert fast.size > 0
        # Every allowed token, and a fresh random sample of the rest, checked one by one.
        sample = np.union1d(fast, np_rng.choice(llg_tokenizer.vocab_size, 3000, replace=False))
        reference = _reference_mask(constraint, sample)
        assert np.array_equal(sample[reference], np.intersect1d(sample, fast)), (
            f"seed {seed}, cut {cut}: {text!r}"
        )
        # The token the real text continues with is always allowed.
        if cut < len(tokens):
            assert tokens[cut] in set(fast.tolist()), f"seed {seed}"


# Valid JSON that llguidance 1.9.1's JSON grammar refuses (it reports ParserTooComplex, "token ... doesn't satisfy
# the grammar"): a `\uXXXX` escape in any string, and -0.0 in a bounded number. A model under the mask can never
# write these (it writes the character itself, or 0.0), so generation is unaffected; feeding them from outside is
# what once made the random-prefix test above flaky. Strict: this fails once the library accepts them.
@pytest.mark.xfail(strict=True, reason="llguidance 1.9.1 refuses \\u escapes and a bounded -0.0")
@pytest.mark.parametrize("schema, text", [
    ({"type": "string", "maxLength": 6}, '"\\u00e9"'),
    (POINT_LIST, '{"points": [{"x": -0.0, "label": null}]}'),
], ids=["u-escape", "negative-zero"])
def test_grammar_library_accepts_every_valid_spelling(frontend, llg_tokenizer, schema, text):
    jsonschema.validate(json.loads(text), schema)
    constraint = _constraint(frontend, llg_tokenizer, schema)
    mask = np.zeros(mask_words(QWEN35_VOCAB), dtype=np.uint32)
    constraint.fill_next_mask(frontend.encode(text), mask)
    assert constraint.error is None


def _decode_with_random_logits(constraint: TokenConstraint, rng: np.random.Generator, max_steps: int = 400):
    mask = np.zeros(mask_words(QWEN35_VOCAB), dtype=np.uint32)
    generated: list[int] = []
    last: list[int] = []
    for _ in range(max_steps):
        logits = rng.standard_normal(QWEN35_VOCAB).astype(np.float32)
        if constraint.fill_next_mask(last, mask):
            apply_mask(logits, mask)
        token = int(np.argmax(logits))
        if token in QWEN35_EOS:
            return generated, True
        generated.append(token)
        last = [token]
    return generated, False


@pytest.mark.parametrize(
    "schema",
    [PERSON, POINT_LIST, {"type": "object", "maxProperties": 0}],
    ids=["person", "points", "empty-object"],
)
def test_random_logits_under_the_mask_give_schema_valid_json(frontend, llg_tokenizer, schema):
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    for _ in range(2):
        constraint = _constraint(frontend, llg_tokenizer, schema)
        tokens, ended = _decode_with_random_logits(constraint, rng)
        text = frontend.decode(tokens)
        assert ended, f"seed {seed}: no end-of-sequence within the step budget: {text!r}"
        assert constraint.accepting and constraint.error is None
        jsonschema.validate(json.loads(text), schema)


def test_unconstrained_random_logits_do_not_give_json(frontend):
    """Negative control for the test above: without the mask the same loop produces no JSON."""
    rng = np.random.default_rng(random.randrange(2**32))
    tokens = [int(np.argmax(rng.standard_normal(QWEN35_VOCAB))) % 248000 for _ in range(20)]
    with pytest.raises(ValueError):
        json.loads(frontend.decode(tokens))


def test_reasoning_is_free_and_the_answer_after_it_is_masked(frontend, llg_tokenizer):
    constraint = _constraint(frontend, llg_tokenizer, PERSON, starts_in_reasoning=True)
    mask = np.zeros(mask_words(QWEN35_VOCAB), dtype=np.uint32)
    for token in frontend.encode("The user wants JSON. <tool_call> is not an answer."):
        assert not constraint.fill_next_mask([token], mask)
        assert not constraint.active
    assert not mask.any(), "an unconstrained step leaves the mask untouched"
    # `</think>`, newlines and the start of the value arrive in one step: the value's tokens are consumed.
    assert constraint.fill_next_mask(frontend.encode('</think>\n\n{"name": "A"'), mask)
    assert constraint.active and constraint.error is None
    allowed = set(allowed_token_ids(mask).tolist())
    assert frontend.encode(",")[0] in allowed
    assert frontend.encode("}")[0] not in allowed  # "age", "role", ... are required
    assert not set(QWEN35_EOS) & allowed


def test_whitespace_before_and_inside_the_value_is_bounded(frontend, llg_tokenizer):
    mask = np.zeros(mask_words(QWEN35_VOCAB), dtype=np.uint32)
    ok = _constraint(frontend, llg_tokenizer, PERSON)
    ok.fill_next_mask(frontend.encode('\n\n{\n  "name": "x",\n  "age": 1'), mask)
    assert ok.error is None
    runaway = _constraint(frontend, llg_tokenizer, PERSON)
    runaway.fill_next_mask(frontend.encode("{" + " " * 40), mask)
    assert runaway.error is not None
    # A broken state only allows end-of-sequence, so the generation ends instead of going on unconstrained.
    assert allowed_token_ids(mask).tolist() == sorted(QWEN35_EOS)


def test_mask_buffer_is_checked(frontend, llg_tokenizer):
    constraint = _constraint(frontend, llg_tokenizer, PERSON)
    for bad in (
        np.zeros(mask_words(QWEN35_VOCAB), dtype=np.int64),
        np.zeros(10, dtype=np.uint32),
        np.zeros(2 * mask_words(QWEN35_VOCAB), dtype=np.uint32)[::2],
    ):
        with pytest.raises(ValueError, match="contiguous uint32"):
            constraint.fill_next_mask([], bad)


def test_mask_helpers_agree_with_bit_by_bit_python():
    rng = np.random.default_rng(random.randrange(2**32))
    vocab = int(rng.integers(1, 500))
    mask = rng.integers(0, 2**32, size=mask_words(vocab), dtype=np.uint64).astype(np.uint32)
    expected = [t for t in range(32 * mask.size) if (int(mask[t // 32]) >> (t % 32)) & 1]
    assert allowed_token_ids(mask).tolist() == expected
    logits = rng.standard_normal(vocab).astype(np.float32)
    masked = logits.copy()
    apply_mask(masked, mask)
    for t in range(vocab):
        assert masked[t] == (logits[t] if t in set(expected) else -np.inf)


def test_grammar_tokenizer_is_built_once_per_model(frontend, llg_tokenizer):
    assert grammar_tokenizer(frontend, QWEN35_VOCAB) is llg_tokenizer
    assert llg_tokenizer.vocab_size == QWEN35_VOCAB
    assert structured.GRAMMAR_LIBRARY == "llguidance"


def test_build_constraint_for_a_real_engine(pytestconfig, tiny_qwen3_5):
    """The route-side entry point: the engine's own frontend and logits width, the tokenizer index built once."""
    import asyncio

    from live_servers import artifact_for
    from ninfer.engine import Engine, EngineOptions
    from ninfer.serve.structured import build_constraint

    with Engine.open_sync(artifact_for(pytestconfig, tiny_qwen3_5), EngineOptions(max_context=256)) as engine:
        fmt = OutputFormat("json_schema", PERSON)
        first = asyncio.run(build_constraint(engine, fmt, "text.format.schema", starts_in_reasoning=True))
        second = asyncio.run(build_constraint(engine, fmt, "text.format.schema", starts_in_reasoning=False))
        assert first.vocab_size == second.vocab_size == engine.info.vocab_size
        assert first._tokenizer is second._tokenizer
        mask = np.zeros(mask_words(engine.info.vocab_size), dtype=np.uint32)
        assert not first.fill_next_mask([], mask)  # reasoning first
        assert second.fill_next_mask([], mask)
        assert set(allowed_token_ids(mask).tolist()) >= set(engine.frontend.encode("{"))
        with pytest.raises(EngineError, match='"not"'):
            asyncio.run(
                build_constraint(
                    engine, OutputFormat("json_schema", {"not": {}}), "f", starts_in_reasoning=False
                )
            )


# --- live server: the mask through the engine, clients are the official SDKs -----------------------------------


# Every field bounded, so even a random model under the mask must finish the value within max_tokens.
BOUNDED = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "rank": {"type": "integer", "minimum": 0, "maximum": 99},
        "kind": {"enum": ["capital", "port", "village"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
    },
    "required": ["city", "rank", "kind", "tags"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe Paris as JSON."}]


def _openai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("server_name", ["qwen35_server", "smollm2_server"])
def test_chat_structured_output_validates(request, server_name):
    server = request.getfixturevalue(server_name)
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": BOUNDED, "strict": True}}
    r = _openai(server).chat.completions.create(
        model="any", messages=ASK, temperature=0.8, seed=3, max_tokens=300, response_format=fmt,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), BOUNDED)


def test_streamed_chat_structured_output_validates(qwen35_server):
    # Streamed deltas join into the constrained value.
    stream = _openai(qwen35_server).chat.completions.create(
        model="any", messages=ASK, temperature=0, max_tokens=300, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": BOUNDED}},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), BOUNDED)


def test_responses_and_messages_structured_output_validate(qwen35_server):
    r = _openai(qwen35_server).responses.create(
        model="any", input="Describe Paris as JSON.", temperature=0.7, max_output_tokens=300,
        text={"format": {"type": "json_schema", "name": "city", "schema": BOUNDED}},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    jsonschema.validate(json.loads(r.output_text), BOUNDED)
    client = anthropic.Anthropic(base_url=qwen35_server.url, api_key="unused", max_retries=0)
    m = client.messages.create(
        model="any", max_tokens=300, messages=ASK,
        thinking={"type": "disabled"},
        extra_body={"output_format": {"type": "json_schema", "schema": BOUNDED}},
    )
    text = "".join(block.text for block in m.content if block.type == "text")
    jsonschema.validate(json.loads(text), BOUNDED)


@pytest.mark.parametrize("server_name", ["qwen35_server", "smollm2_server"])
def test_json_object_output_parses_as_an_object(request, server_name):
    """`response_format: {type: json_object}` (chat) and `text.format: {type: json_object}` (Responses): the answer
    is one JSON object, even from the random model, whose unconstrained answer is not JSON at all."""
    server = request.getfixturevalue(server_name)
    client = _openai(server)
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    calls = [
        lambda: client.chat.completions.create(model="any", messages=ASK, temperature=0, max_tokens=200,
                                               response_format={"type": "json_object"}, extra_body=off),
        lambda: client.responses.create(model="any", input=ASK, temperature=0, max_output_tokens=200,
                                        text={"format": {"type": "json_object"}}, extra_body=off),
    ]
    if server_name == "qwen35_server":  # the same request unconstrained, which shows the mask is what did it
        calls.append(lambda: client.chat.completions.create(model="any", messages=ASK, temperature=0, max_tokens=30,
                                                            extra_body=off))
    chat, response, *free = live_servers.concurrently(*calls)
    assert chat.choices[0].finish_reason == "stop" and response.status == "completed"
    assert isinstance(json.loads(chat.choices[0].message.content), dict)
    assert isinstance(json.loads(response.output_text), dict)
    for unconstrained in free:
        with pytest.raises(ValueError):
            json.loads(unconstrained.choices[0].message.content)


def test_unenforceable_schema_is_a_400_naming_it(qwen35_server):
    bad = {"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}}
    with pytest.raises(openai.BadRequestError, match="response_format"):
        _openai(qwen35_server).chat.completions.create(
            model="any", messages=ASK, max_tokens=5,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad}},
        )


# --- draft rows (speculative decoding) -----------------------------------------------------------------------


def _allows(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask[token >> 5]) >> (token & 31)) & 1)


def _plain_rows(make, committed, steps):
    """The masks plain decoding meets: a fresh constraint (`make()`) fed `committed` one token per step (as the
    engine feeds a non-speculative request), then each of `steps`; (constrained, mask) after each step."""
    twin = make()
    mask = np.zeros(mask_words(QWEN35_VOCAB), dtype=np.uint32)
    twin.fill_next_mask([], mask)
    for token in committed:
        twin.fill_next_mask([token], mask)
    out = []
    for step in steps:
        constrained = twin.fill_next_mask(step, mask)
        out.append((constrained, mask.copy()))
    return out


def _draft_round(speculative, make, committed, new, drafts, seed):
    """One round's draft rows of `speculative`, checked against plain decoding's masks (`_plain_rows`)."""
    masks = np.zeros((len(drafts) + 1, mask_words(QWEN35_VOCAB)), dtype=np.uint32)
    rows = speculative.fill_draft_masks(new, drafts, masks)
    assert 1 <= len(rows) <= len(drafts) + 1, f"seed {seed}"
    steps = [new] + [[t] for t in drafts[:len(rows) - 1]]
    for i, (constrained, mask) in enumerate(_plain_rows(make, committed, steps)):
        assert rows[i] == constrained, f"seed {seed}, row {i}"
        if constrained:
            assert np.array_equal(masks[i], mask), f"seed {seed}, row {i}"
    return rows, masks


@pytest.mark.parametrize("reasoning", [False, True], ids=["answer", "reasoning-first"])
@pytest.mark.parametrize("schema", [PERSON, POINT_LIST], ids=["person", "points"])
def test_draft_masks_are_the_masks_of_consuming_the_drafts(frontend, llg_tokenizer, schema, reasoning):
    """fill_draft_masks' rows against plain decoding's masks at the same positions, over whole answers taken in
    rounds of fresh random drafts (the answer's own tokens, some replaced by random ones); the committed state after
    each round is plain decoding's too (the next round's first row checks it)."""
    seed = int(np.random.default_rng().integers(1 << 30))
    rng = np.random.default_rng(seed)
    forbidden = lookahead = 0

    def make():
        return _constraint(frontend, llg_tokenizer, schema, starts_in_reasoning=reasoning)

    for _ in range(3):
        value = _random_instance(random.Random(int(rng.integers(1 << 30))), schema)
        prefix = "The user wants JSON, so a > b.</think>\n\n" if reasoning else ""
        answer = frontend.encode(prefix + json.dumps(value, ensure_ascii=False)) + [QWEN35_EOS[0]]
        speculative = make()
        committed: list[int] = []
        new: list[int] = []
        while len(committed) + len(new) < len(answer):
            start = len(committed) + len(new)
            drafts = list(answer[start:start + int(rng.integers(1, 6))])
            if rng.random() < 0.5:
                drafts[int(rng.integers(len(drafts)))] = int(rng.integers(llg_tokenizer.vocab_size))
            rows, masks = _draft_round(speculative, make, committed, new, drafts, seed)
            last = len(rows) - 1
            forbidden += last < len(drafts) and rows[last] and not _allows(masks[last], drafts[last])
            lookahead += last
            # the round accepts the drafts that follow the answer (at most the rows given), then the answer's next
            accepted = 0
            while accepted < last and drafts[accepted] == answer[start + accepted]:
                accepted += 1
            committed += new
            new = answer[start:start + accepted + 1]
        assert speculative.error is None, f"seed {seed}: {speculative.error}"
    assert forbidden > 0 and lookahead > 0, f"seed {seed}"


def test_reasoning_control_draft_rows_are_plain_decodings(frontend, llg_tokenizer):
    """A reasoning budget's forced close, then the schema: ReasoningControl's draft rows (cut where a forced token
    may fall) against plain decoding's masks. The simulated model writes its reasoning text while unconstrained and
    a random allowed token under a mask; drafts are its text with random tokens in."""
    from ninfer.serve.reasoning_control import ReasoningControl

    seed = int(np.random.default_rng().integers(1 << 30))
    rng = np.random.default_rng(seed)
    budget = int(rng.integers(3, 12))

    def make():
        inner = _constraint(frontend, llg_tokenizer, PERSON, starts_in_reasoning=True)
        return ReasoningControl(frontend, starts_in_reasoning=True, inner=inner, budget=budget)

    script = frontend.encode("I think a > b and b > c, so the answer is a person named Ann whose age is 7 " * 3)
    speculative = make()
    committed: list[int] = []
    new: list[int] = []
    lookahead = 0
    while len(committed) + len(new) < 60:
        at = len(committed) + len(new)
        drafts = [script[(at + i) % len(script)] if rng.random() < 0.7 else int(rng.integers(llg_tokenizer.vocab_size))
                  for i in range(int(rng.integers(1, 6)))]
        rows, masks = _draft_round(speculative, make, committed, new, drafts, seed)
        lookahead += len(rows) - 1
        # the drafts the rows allow and the simulated model writes are accepted; the last row's draw follows them
        out: list[int] = []
        for i, constrained in enumerate(rows):
            want = script[(at + i) % len(script)]
            if constrained and not _allows(masks[i], want):
                want = int(rng.choice(allowed_token_ids(masks[i])))
            out.append(want)
            if i == len(drafts) or want != drafts[i]:
                break
        committed += new
        new = out
    assert lookahead > 0 and speculative.forced_at is not None, f"seed {seed}"
