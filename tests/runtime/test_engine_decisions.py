"""Decision jobs on the real CPU engine (tiny Qwen3.5: KV pages and GDN state slots, so forks copy real state):
the candidate projection against the full-vocabulary logprobs of Engine.score restricted to the candidates, on
fresh random inputs; a question alone against the same question among fifty; all questions in one pass against one
at a time (dense and MoE); rounds; decision lanes under a chat flood; everything released after success, cancel
and error."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from ninfer import errors
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams
from prefix_cache_checks import decide_twice

VOCAB_SAMPLE = 5000  # random ids from the low part of the vocabulary (any id is a valid token)


def _engine(path, **options) -> Engine:
    return Engine.open_sync(path, EngineOptions(**{"max_context": 512, "max_concurrency": 1, **options}))


def _random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB_SAMPLE) for _ in range(n)]


def _restricted(engine: Engine, prefix: list[int], candidates: list[int]) -> list[float]:
    """The slow twin: each candidate's full-vocabulary logprob after `prefix` (Engine.score), renormalised over the
    candidates."""
    full = [engine.score_sync([*prefix, c])[-1] for c in candidates]
    top = max(full)
    log_total = top + math.log(math.fsum(math.exp(v - top) for v in full))
    return [v - log_total for v in full]


def _idle(engine: Engine) -> tuple:
    s = engine.stats()
    return s.busy_lanes, s.busy_decision_lanes, s.queued, s.kv_free_tokens, s.free_state_slots


@pytest.fixture(scope="module")
def engine(tiny_qwen35_artifact):
    with _engine(tiny_qwen35_artifact, decision_rows=3) as e:
        yield e


def test_candidate_projection_equals_full_logprobs_restricted_to_the_candidates(engine):
    rng = random.Random()  # fresh inputs each run; a failure prints them
    context = _random_ids(rng, rng.randrange(2, 150))
    questions = [(_random_ids(rng, rng.randrange(1, 90)), rng.sample(range(VOCAB_SAMPLE), rng.randrange(1, 9)))
                 for _ in range(5)]
    before = _idle(engine)
    got = asyncio.run(engine.decide(context, questions))
    for (suffix, candidates), lps in zip(questions, got, strict=True):
        want = _restricted(engine, context + suffix, candidates)
        assert lps == pytest.approx(want, abs=2e-4), (context, suffix, candidates)
        assert math.fsum(math.exp(v) for v in lps) == pytest.approx(1.0, abs=1e-5)
    assert _idle(engine) == before


def test_a_question_alone_equals_the_same_question_among_fifty(engine):
    rng = random.Random()
    context = _random_ids(rng, 70)  # past one page: the fork shares a full page and copies the partial one
    batch = [(_random_ids(rng, rng.randrange(1, 40)), rng.sample(range(VOCAB_SAMPLE), 4)) for _ in range(50)]
    together = asyncio.run(engine.decide(context, batch))
    for i in (0, 17, 49):
        alone = asyncio.run(engine.decide(context, [batch[i]]))[0]
        assert alone == pytest.approx(together[i], abs=1e-6)


@pytest.mark.parametrize("context_tokens", [300, 320])
def test_a_decision_again_prefills_only_the_context_tail_the_cache_lacks(tiny_qwen35_artifact, context_tokens):
    # The context's last block boundary holds a snapshot after the first run: the second restores it and computes
    # only the tokens after it (none at 320: a context's last token needs no logits), then forks as before.
    rng = random.Random()
    context = _random_ids(rng, context_tokens)
    questions = [(_random_ids(rng, rng.randrange(1, 20)), rng.sample(range(VOCAB_SAMPLE), 4)) for _ in range(10)]
    suffixes = sum(len(suffix) for suffix, _ in questions)
    with _engine(tiny_qwen35_artifact, prefix_cache=False) as off:
        want = asyncio.run(off.decide(context, questions))
    with _engine(tiny_qwen35_artifact) as on:
        idle = _idle(on)
        answers, prefilled = decide_twice(on, context, questions)
        s = on.stats()
        assert _idle(on) == idle
    for got in answers:
        for lps, ref in zip(got, want, strict=True):
            assert lps == pytest.approx(ref, abs=2e-4)
    boundary = context_tokens // 64 * 64
    assert prefilled == [context_tokens + suffixes, context_tokens - boundary + suffixes]
    assert (s.prefix.hits, s.prefix.cached_tokens, s.prefix.restores) == (1, boundary, 1)


@pytest.mark.parametrize("model", ["tiny_qwen35_artifact", "tiny_qwen35_moe_artifact"])
def test_questions_over_a_context_near_max_context_are_one_pass_with_the_answers_of_one_at_a_time(request, model):
    # A context that fills max_context but for the longest suffix leaves the default pool no slack for rows: the
    # decision lane's share still holds every row, so all the questions' suffixes are one forward pass after the
    # context's, and they answer as the sequential twin does (one row: each question alone, its own pass, the
    # context's state forked afresh for it). The context is one pass, or two when a snapshot at its last block
    # boundary ends a chunk before its tail; over the cached context only the tail is computed (no pass without).
    path = request.getfixturevalue(model)
    rng = random.Random()
    context = _random_ids(rng, rng.randrange(130, 400))
    questions = [(_random_ids(rng, rng.randrange(1, 48)), rng.sample(range(VOCAB_SAMPLE), rng.randrange(1, 5)))
                 for _ in range(10)]
    max_context = len(context) + max(len(suffix) for suffix, _ in questions)
    with _engine(path, max_context=max_context, decision_rows=1) as one_at_a_time:
        want = asyncio.run(one_at_a_time.decide(context, questions))
    with _engine(path, max_context=max_context, decision_rows=10) as batched:
        passes = []
        for _ in range(2):  # cold, then over the cached context (restored up to its last block boundary)
            before = batched.stats().forward_passes
            got = asyncio.run(batched.decide(context, questions))
            passes.append(batched.stats().forward_passes - before)
            for a, b in zip(got, want, strict=True):
                assert a == pytest.approx(b, abs=1e-6), (context, questions)
    tail = len(context) % 64 > 0  # context tokens after its last block boundary
    assert passes == [2 + tail, 1 + tail], (len(context), passes)


def test_rounds_give_the_answers_of_one_round(tiny_qwen35_artifact, engine):
    rng = random.Random()
    context = _random_ids(rng, 40)
    questions = [(_random_ids(rng, 5), rng.sample(range(VOCAB_SAMPLE), 3)) for _ in range(7)]
    with _engine(tiny_qwen35_artifact, decision_rows=8) as wide:
        one_round = asyncio.run(wide.decide(context, questions))
    three_rounds = asyncio.run(engine.decide(context, questions))  # decision_rows=3: rounds of 3, 3, 1
    for a, b in zip(one_round, three_rounds, strict=True):
        assert a == pytest.approx(b, abs=1e-6)


def test_decisions_run_on_their_own_lane_while_chat_fills_every_lane_and_queue_place(tiny_qwen35_artifact):
    rng = random.Random()
    with _engine(tiny_qwen35_artifact, max_queue=1) as e:
        idle = _idle(e)

        async def main():
            long = Request(prompt_tokens=_random_ids(rng, 8), max_new_tokens=400,
                           sampling=SamplingParams(temperature=0.0))
            flood = [e.submit(long) for _ in range(2)]  # the chat lane and the one queue place
            with pytest.raises(errors.EngineBusyError):
                e.submit(long)
            answers = await e.decide(_random_ids(rng, 30), [(_random_ids(rng, 4), [1, 2, 3])])
            assert e.stats().busy_lanes >= 1  # the chat flood still runs: the decision did not wait for it
            for stream in flood:
                await stream.aclose()
            return answers

        answers = asyncio.run(main())
        assert math.fsum(math.exp(v) for v in answers[0]) == pytest.approx(1.0, abs=1e-5)
        deadline = 300
        while _idle(e) != idle and deadline:
            asyncio.run(asyncio.sleep(0.05))
            deadline -= 1
        assert _idle(e) == idle


def test_a_cancelled_decision_releases_its_lane_rows_and_pages(engine):
    rng = random.Random()
    before = _idle(engine)
    questions = [(_random_ids(rng, 200), [5, 6])] * 60  # 12k suffix tokens: far longer than the wait below
    prefilled = engine.stats().tokens_prefilled

    async def main():
        task = asyncio.ensure_future(engine.decide(_random_ids(rng, 100), questions))
        while engine.stats().tokens_prefilled < prefilled + 300:  # the context and some rows are in
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    for _ in range(600):
        if _idle(engine) == before:
            break
        asyncio.run(asyncio.sleep(0.05))
    assert _idle(engine) == before
    assert engine.stats().tokens_prefilled - prefilled < 100 + 200 * 60  # it stopped part way


def test_bad_decisions_are_refused_typed_and_change_nothing(engine):
    before = _idle(engine)
    cases = [([], [([1], [2])], "the prompt is empty"),
             ([1, 2], [], "at least one question"),
             ([1, 2], [([], [2])], "needs a suffix"),
             ([1, 2], [([1], [])], "at least one candidate"),
             ([1, 2], [([1], [10**7])], "outside the vocabulary")]
    for context, questions, message in cases:
        with pytest.raises(errors.EngineError, match=message):
            asyncio.run(engine.decide(context, questions))
    with pytest.raises(errors.CapacityError, match="max_context"):
        asyncio.run(engine.decide([1] * 500, [([1] * 20, [2])]))
    assert _idle(engine) == before


def test_decision_lanes_off_refuses_decisions(tiny_qwen35_artifact):
    with _engine(tiny_qwen35_artifact, decision_lanes=0) as e, pytest.raises(errors.EngineError, match="off"):
        asyncio.run(e.decide([1, 2, 3], [([4], [5])]))


def test_a_full_decision_queue_refuses_with_engine_busy_and_frees_nothing_held(tiny_qwen35_artifact):
    rng = random.Random()
    with _engine(tiny_qwen35_artifact, max_queue=0) as e:
        idle = _idle(e)

        async def main():
            running = asyncio.ensure_future(e.decide(_random_ids(rng, 300), [(_random_ids(rng, 60), [1, 2])] * 8))
            while e.stats().busy_decision_lanes == 0 and not running.done():
                await asyncio.sleep(0.005)
            with pytest.raises(errors.EngineBusyError, match="decision lanes"):
                await e.decide([1, 2, 3], [([4], [5])])
            return await running

        assert len(asyncio.run(main())) == 8
        assert _idle(e) == idle
