"""n > 1 in the engine (Engine.submit_choices; CPU backend, tiny random models): the prompt is prefilled once and
forked, and each choice is the request alone with its own seed (seed + i): the same tokens, the same logprobs within
the backend's batching bound, greedy and sampled; the prefix cache serves every choice; cancelling at any point
leaves no lane, page or state slot held; a queued group leaves the queue whole; more choices than lanes are
refused."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prefix_cache_checks import assert_same, assert_same_within_ties, collect_with_logprobs

from ninfer import errors
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams

MODELS = ["tiny_qwen35_artifact", "tiny_qwen35_moe_artifact", "tiny_llama_artifact"]
TOP_K = 8  # the seeded case's candidates; every request reports them all as its top logprobs


def open_engine(path, **options) -> Engine:
    defaults = {"max_context": 1024, "max_concurrency": 4, "prefill_chunk": 128, "decision_lanes": 0}
    return Engine.open_sync(path, EngineOptions(**{**defaults, **options}))


def request(prompt, sampling: SamplingParams, n_new: int = 5) -> Request:
    return Request(list(prompt), sampling, max_new_tokens=n_new, stop_token_ids=(), top_logprobs=TOP_K)


async def _drain(stream):
    tokens, top, last = [], [], None
    async for ev in stream:
        tokens.extend(ev.token_ids)
        top.extend(ev.top_logprobs or ())
        last = ev
    return (tokens, top), last


def run_choices(engine: Engine, req: Request, n: int):
    async def main():
        return await asyncio.gather(*(_drain(s) for s in engine.submit_choices(req, n)))

    return asyncio.run(main())


def assert_nothing_held(engine: Engine) -> None:
    s = engine.stats()
    assert (s.busy_lanes, s.queued, s.kv_free_tokens) == (0, 0, s.kv_capacity_tokens)
    assert s.free_state_slots == s.prefix.total_state_slots


def sampling_of(kind: str, seed: int) -> SamplingParams:
    """Greedy, or seeded sampling among a few tokens: a choice computes the prompt's last token as a decode row where
    the request alone computes it in its last prefill chunk, so their logits agree within the backend's batching
    bound, not bit for bit, and a draw over the tiny random model's near-uniform 248k tokens could fall on a
    boundary that moved by that much."""
    if kind == "greedy":
        return SamplingParams(temperature=0, seed=seed)
    return SamplingParams(temperature=0.8, top_k=TOP_K, seed=seed)


def diverges_at_a_moved_boundary(got, ref) -> bool:
    """Two seeded runs of one request whose logits agree within rounding: the same tokens, or the same up to one draw
    that landed on either side of a boundary rounding moved. There the two candidate lists (all TOP_K, most likely
    first, the order the draw walks) agree within near-ties and the two tokens are neighbours in them or swapped
    places by a tie; the rest continues from different tokens and is not compared. True where they diverged so."""
    (tokens, top), (ref_tokens, ref_top) = got, ref
    assert len(tokens) == len(ref_tokens) == len(top) == len(ref_top)
    for token, ref_token, mine, theirs in zip(tokens, ref_tokens, top, ref_top, strict=True):
        assert_same_within_ties(dict(mine), dict(theirs))
        if token != ref_token:
            order, ref_order = [t for t, _ in mine], [t for t, _ in theirs]
            assert abs(order.index(token) - ref_order.index(ref_token)) <= 1, (token, ref_token, mine, theirs)
            return True
    return False


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
@pytest.mark.parametrize("model", MODELS)
def test_each_choice_is_the_request_alone_with_its_seed(request_fixture_value, model, kind):
    path = request_fixture_value(model)
    rng = np.random.default_rng()
    n, n_new = 3, 5
    with open_engine(path, prefix_cache=False) as engine:
        length = int(rng.integers(2, 400))  # a prompt of several chunks or of one, cut anywhere in a block
        prompt = rng.integers(3, engine.info.vocab_size, size=length).tolist()
        seed = int(rng.integers(0, 2**63))
        before = engine.stats().tokens_prefilled
        choices = run_choices(engine, request(prompt, sampling_of(kind, seed), n_new), n)
        # One prefill: the prompt but its last token once, then each choice its last token and its decodes.
        assert engine.stats().tokens_prefilled - before == (length - 1) + n * n_new
        for (_, _), last in choices:
            assert last.finish_reason == "length"
            assert (last.usage.prompt_tokens, last.usage.cached_tokens, last.usage.generated_tokens) == (
                length, 0, n_new)
        assert_nothing_held(engine)
        alone = [asyncio.run(collect_with_logprobs(engine, request(prompt, sampling_of(kind, seed + i), n_new)))[0]
                 for i in range(n)]
        assert engine.stats().tokens_prefilled - before == (length - 1) + n * n_new + n * (length + n_new - 1)
    if kind == "greedy":
        for (got, _), ref in zip(choices, alone, strict=True):
            assert_same(got, ref)
    else:  # one draw of the n x n_new may fall across a moved boundary (a CI run saw it); a
        # choice drawing with another seed than seed + i diverges in nearly every choice at its first token
        diverged = [diverges_at_a_moved_boundary(got, ref) for (got, _), ref in zip(choices, alone, strict=True)]
        assert sum(diverged) <= 1, diverged
    if kind == "seeded":  # a seed each: the streams differ (all three alike: about 8^-10)
        assert len({tuple(tokens) for (tokens, _), _ in choices}) > 1


@pytest.mark.parametrize("model", MODELS)
def test_the_prefix_cache_serves_every_choice(request_fixture_value, model):
    rng = np.random.default_rng()
    with open_engine(request_fixture_value(model)) as engine:
        prompt = rng.integers(3, engine.info.vocab_size, size=300).tolist()
        req = request(prompt, SamplingParams(temperature=0))
        first = run_choices(engine, req, 2)
        again = run_choices(engine, req, 4)
        assert {last.usage.cached_tokens for _, last in first} == {0}
        cached = {last.usage.cached_tokens for _, last in again}
        assert len(cached) == 1 and 0 < cached.pop() < 300
        for got, _ in again:
            assert_same(got, first[0][0])
        assert_nothing_held(engine)


def test_more_choices_than_lanes_are_refused(tiny_qwen35_artifact):
    with open_engine(tiny_qwen35_artifact, max_concurrency=2) as engine:
        async def submit():
            engine.submit_choices(request([5, 6, 7], SamplingParams()), 3)

        with pytest.raises(errors.CapacityError, match="n = 3 choices need a lane each; this engine has 2"):
            asyncio.run(submit())
        assert_nothing_held(engine)


@pytest.mark.parametrize("model", ["tiny_qwen35_artifact", "tiny_llama_artifact"])
@pytest.mark.parametrize("when", ["prefill", "decode", "first-choice-in-prefill"])
def test_cancelling_leaves_nothing_held(request_fixture_value, model, when):
    """Every choice cancelled mid-prefill (the others waiting for its fork), or one choice mid-decode and then the
    rest, or the first choice alone during the prefill (the others end with it): no lane, page or slot stays."""
    rng = np.random.default_rng()
    with open_engine(request_fixture_value(model)) as engine:
        prompt = rng.integers(3, engine.info.vocab_size, size=900).tolist()

        async def main():
            streams = engine.submit_choices(request(prompt, SamplingParams(seed=1), n_new=200), 3)
            before = engine.stats().tokens_prefilled
            if when == "decode":
                first = await anext(streams[1])
                assert first.token_ids
                engine.cancel(streams[1].request_id)
                await asyncio.sleep(0.01)
                for s in (streams[0], streams[2]):
                    engine.cancel(s.request_id)
            else:
                while engine.stats().tokens_prefilled < before + 256:
                    await asyncio.sleep(0.0002)
                for s in streams[:1] if when == "first-choice-in-prefill" else streams:
                    engine.cancel(s.request_id)
            return [await _drain(s) for s in streams]

        ends = asyncio.run(main())
        assert {last.finish_reason for _, last in ends} == {"cancelled"}
        assert_nothing_held(engine)
        # and it serves on
        (tokens, _), last = run_choices(engine, request(prompt[:100], SamplingParams(temperature=0)), 4)[3]
        assert last.finish_reason == "length" and len(tokens) == 5
        assert_nothing_held(engine)


def test_a_queued_group_leaves_the_queue_whole(tiny_qwen35_artifact):
    """A group waits for all its lanes (FIFO); cancelling any of its ids while it waits removes all of it."""
    rng = np.random.default_rng()
    with open_engine(tiny_qwen35_artifact, max_concurrency=2) as engine:
        prompt = rng.integers(3, engine.info.vocab_size, size=40).tolist()

        async def main():
            busy = engine.submit(request(prompt, SamplingParams(), n_new=300))
            group = engine.submit_choices(request(prompt, SamplingParams()), 2)
            await anext(busy)  # the busy request runs: the group needs both lanes and waits
            assert engine.stats().queued == 1
            assert engine.cancel(group[1].request_id)
            ends = [await _drain(s) for s in group]
            engine.cancel(busy.request_id)
            await _drain(busy)
            return ends

        ends = asyncio.run(main())
        assert [(tokens, last.finish_reason) for (tokens, _), last in ends] == [([], "cancelled")] * 2
        assert_nothing_held(engine)


@pytest.fixture
def request_fixture_value(request):
    return request.getfixturevalue
