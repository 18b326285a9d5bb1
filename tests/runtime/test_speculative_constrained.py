"""Speculative decoding of constrained requests: each verify row is drawn under the caller's mask after the drafts
before it (MaskRequest::drafts, Engine::provide_masks, DraftTokenConstraint), so a draft the mask forbids is
rejected, and the output is what plain decoding under the same masks gives, token for token, greedy and
seeded-sampled.

A stand-in grammar on the tiny agreeing checkpoint (whose head drafts exactly what the model says, so every
rejection is the mask's) covers K = 1..5, unconstrained rows and callers that speak for fewer rows than asked;
the embedded SmolLM2 with its trained head covers the real grammars: a JSON schema, a tool call, and reasoning
closed by a budget before the answer's grammar starts.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import agreeing_mtp
import llguidance
import numpy as np
import pytest
from draft_masks import CountingConstraint, HistoryMasks
from engine_helpers import collect, run_together
from ninfer import errors
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams
from ninfer.frontend.reasoning import split_reasoning
from ninfer.serve.reasoning_control import ReasoningControl
from ninfer.serve.structured import OutputFormat, TokenConstraint, compile_grammar, grammar_tokenizer
from tiny_models import QWEN35_VOCAB


@pytest.fixture(scope="session")
def agreeing_artifact(pytestconfig, tiny_qwen3_5) -> Path:
    return agreeing_mtp.agreeing_artifact(Path(pytestconfig.cache.mkdir("runtime-artifacts")), tiny_qwen3_5)


def _run(artifact: Path, spec_k: int, requests: list[Request], max_context: int = 512):
    spec = {"spec": "mtp", "draft_tokens": spec_k} if spec_k else {}
    options = EngineOptions(backend="cpu", max_context=max_context, max_concurrency=len(requests), threads=2, **spec)
    with Engine.open_sync(artifact, options) as engine:
        return run_together(engine, requests)


def _assert_same(plain, spec) -> None:
    for (tokens_a, last_a), (tokens_b, last_b) in zip(plain, spec, strict=True):
        assert tokens_b == tokens_a
        assert last_b.finish_reason == last_a.finish_reason


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.5, "top_k": 3}],
                         ids=["greedy", "sampled"])
def test_stand_in_grammar_output_is_unchanged_by_speculation_and_its_forbidden_drafts_are_rejected(
        agreeing_artifact, sampling):
    rng = np.random.default_rng()
    prompts = [rng.integers(0, QWEN35_VOCAB, size=n).tolist() for n in (23, 64)]
    seeds = [int(s) for s in rng.integers(1 << 30, size=2)]

    def requests(constraints):
        return [Request(p, SamplingParams(**sampling, seed=s), max_new_tokens=24, stop_token_ids=(), logprobs=True,
                        constraint=c) for p, s, c in zip(prompts, seeds, constraints, strict=True)]

    plain = _run(agreeing_artifact, 0, requests([HistoryMasks(s) for s in seeds]))
    for k in range(1, 6):
        constraints = [HistoryMasks(s) for s in seeds]
        spec = _run(agreeing_artifact, k, requests(constraints))
        _assert_same(plain, spec)
        # the head drafts what the model says, so only the masks reject: some drafts pass them, some do not
        assert sum(c.forbidden for c in constraints) > 0, k
        assert sum(last.timings.draft_n_accepted for _, last in spec) > 0, k
        # a forbidden draft counts as drafted and rejected
        assert (sum(last.timings.draft_n for _, last in spec) >=
                sum(last.timings.draft_n_accepted for _, last in spec) + sum(c.forbidden for c in constraints))
        assert sum(c.rows_given for c in constraints) > sum(last.usage.generated_tokens for _, last in spec) / 2


class EmptyFrom(HistoryMasks):
    """HistoryMasks, but from the `at`-th generated token on no token is allowed; its draft rows go on past that
    position (the engine cuts a round before a row that allows nothing)."""

    def __init__(self, seed: int, at: int) -> None:
        super().__init__(seed)
        self.end = at

    def _mask(self, history, mask):
        if len(history) >= self.end:
            mask[:] = 0
            return True
        return super()._mask(history, mask)

    def fill_draft_masks(self, new_token_ids, drafts, masks):
        self.history += list(new_token_ids)
        return [self._mask(self.history + list(drafts[:i]), masks[i]) for i in range(len(drafts) + 1)]


def test_a_mask_allowing_nothing_ends_the_request_where_plain_decoding_does(agreeing_artifact):
    rng = np.random.default_rng()
    prompt = rng.integers(0, QWEN35_VOCAB, size=30).tolist()
    seed, at = int(rng.integers(1 << 30)), int(rng.integers(3, 12))

    async def until_error(engine):
        tokens = []
        with pytest.raises(errors.EngineError, match="allows no token"):
            async for ev in engine.generate(Request(prompt, SamplingParams(temperature=0), max_new_tokens=30,
                                                    stop_token_ids=(), constraint=EmptyFrom(seed, at))):
                tokens.extend(ev.token_ids)
        return tokens

    got = []
    for k in (0, 3):
        spec = {"spec": "mtp", "draft_tokens": k} if k else {}
        with Engine.open_sync(agreeing_artifact, EngineOptions(backend="cpu", max_context=512, threads=2,
                                                               **spec)) as engine:
            got.append(asyncio.run(until_error(engine)))
    assert got[1] == got[0] and len(got[0]) == at


@pytest.mark.parametrize("answer, message", [("raise", "draft rows exploded"), ("too many", "mask rows for a round"),
                                             ("none", "mask rows for a round")])
def test_a_failing_draft_constraint_ends_its_request_with_a_typed_error(agreeing_artifact, answer, message):
    class Broken(HistoryMasks):
        def fill_draft_masks(self, new_token_ids, drafts, masks):
            if answer == "raise":
                raise RuntimeError("draft rows exploded")
            return [True] * (len(drafts) + 2) if answer == "too many" else []

    rng = np.random.default_rng()
    prompt = rng.integers(0, QWEN35_VOCAB, size=20).tolist()
    options = EngineOptions(backend="cpu", max_context=512, threads=2, spec="mtp", draft_tokens=2)
    with Engine.open_sync(agreeing_artifact, options) as engine:
        with pytest.raises(errors.EngineError, match=message):
            asyncio.run(collect(engine, Request(prompt, SamplingParams(temperature=0), max_new_tokens=20,
                                                stop_token_ids=(), constraint=Broken(1))))
        tokens, last = asyncio.run(collect(engine, Request(prompt, SamplingParams(temperature=0), max_new_tokens=5,
                                                           stop_token_ids=())))
        assert last.finish_reason == "length" and len(tokens) == 5
        s = engine.stats()
        assert (s.busy_lanes, s.kv_free_tokens) == (0, s.kv_capacity_tokens)


# --- the embedded SmolLM2 and its trained head, with real grammars ---------------------------------------------

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                   "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}},
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}
WEATHER_CALL = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"},
                   "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                                  "unit": {"enum": ["celsius", "fahrenheit"]}},
                                 "required": ["city", "unit"], "additionalProperties": False}},
    "required": ["name", "arguments"],
    "additionalProperties": False,
}


def _tool_call_grammar() -> str:
    """A Hermes-style tool call: the tags around one JSON call of the weather tool."""
    schema = json.dumps(WEATHER_CALL)
    return llguidance.LLMatcher.grammar_from_lark(
        f'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: %json {schema}\n')


def _smollm2_requests(engine: Engine, question: str, grammar: str, n: int, sampling: dict, *, reasoning_budget=None):
    frontend = engine.frontend
    tokenizer = grammar_tokenizer(frontend, engine.info.vocab_size)
    prompt = frontend.render([{"role": "user", "content": question}], add_generation_prompt=True).text
    if reasoning_budget is not None:
        prompt += "<think>\n"  # SmolLM2 never closes a block itself: the budget's forced close ends it
    grammar_part = TokenConstraint(grammar, tokenizer, frontend, starts_in_reasoning=reasoning_budget is not None)
    constraint = (grammar_part if reasoning_budget is None else
                  ReasoningControl(frontend, starts_in_reasoning=True, inner=grammar_part, budget=reasoning_budget))
    counting = CountingConstraint(constraint)
    request = Request(frontend.encode(prompt), SamplingParams(**sampling), max_new_tokens=n, constraint=counting)
    return [request], counting


def _smollm2_runs(artifact: Path, question: str, grammar: str, n: int, sampling: dict, ks, **kw):
    """Plain decoding, then speculative with each K: (tokens, last event) per run, the counting constraints, and the
    plain run's text."""
    runs, counters = [], []
    for k in (0, *ks):
        spec = {"spec": "mtp", "draft_tokens": k} if k else {}
        with Engine.open_sync(artifact, EngineOptions(backend="cpu", threads=2, max_context=1024, **spec)) as engine:
            requests, counting = _smollm2_requests(engine, question, grammar, n, sampling, **kw)
            runs.append(run_together(engine, requests)[0])
            counters.append(counting)
            if not k:
                text = engine.frontend.decode(runs[0][0])
    return runs, counters, text


def _check_runs(runs, counters) -> None:
    (plain_tokens, plain_last), *spec = runs
    for (tokens, last), counting in zip(spec, counters[1:], strict=True):
        assert tokens == plain_tokens
        assert last.finish_reason == plain_last.finish_reason
        assert counting.rounds > 0


def test_json_schema_answers_are_unchanged_by_speculation(smollm2_default_artifact):
    grammar = compile_grammar(OutputFormat("json_schema", PERSON), "response_format")
    runs, counters, text = _smollm2_runs(smollm2_default_artifact, "Describe a software engineer as JSON.", grammar, 96,
                                   {"temperature": 0}, range(1, 6))
    _check_runs(runs, counters)
    assert set(json.loads(text)) == set(PERSON["properties"])
    assert sum(last.timings.draft_n_accepted for _, last in runs[1:]) > 0
    assert sum(c.forbidden for c in counters) > 0  # drafts the grammar forbade were rejected


def test_tool_calls_under_their_grammar_are_unchanged_by_speculation(smollm2_default_artifact):
    runs, counters, text = _smollm2_runs(smollm2_default_artifact, "What is the weather in Paris? Call the tool.",
                                   _tool_call_grammar(), 64, {"temperature": 0}, range(1, 6))
    _check_runs(runs, counters)
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    assert json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))["name"] == "get_weather"
    assert sum(last.timings.draft_n_accepted for _, last in runs[1:]) > 0
    assert sum(c.forbidden for c in counters) > 0


def test_reasoning_then_a_structured_answer_is_unchanged_by_speculation(smollm2_default_artifact):
    runs, counters, text = _smollm2_runs(smollm2_default_artifact, "Describe a teacher as JSON.",
                                   compile_grammar(OutputFormat("json_schema", PERSON), "response_format"), 110,
                                   {"temperature": 0}, (2, 4), reasoning_budget=12)
    _check_runs(runs, counters)
    split = split_reasoning(text, starts_in_reasoning=True)
    assert split.reasoning_ended and set(json.loads(split.content)) == set(PERSON["properties"])
    assert sum(last.timings.draft_n_accepted for _, last in runs[1:]) > 0


def test_sampled_structured_answers_with_a_seed_are_unchanged_by_speculation(smollm2_default_artifact):
    seed = int(np.random.default_rng().integers(1 << 30))
    grammar = compile_grammar(OutputFormat("json_schema", PERSON), "response_format")
    runs, counters, text = _smollm2_runs(smollm2_default_artifact, "Describe a painter as JSON.", grammar, 96,
                                   {"temperature": 0.7, "seed": seed}, (1, 3, 5))
    _check_runs(runs, counters)
    assert set(json.loads(text)) == set(PERSON["properties"])
    assert sum(last.timings.draft_n_accepted for _, last in runs[1:]) > 0
