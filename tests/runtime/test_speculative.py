"""Speculative decoding with the MTP head (`EngineOptions(spec="mtp", draft_tokens=K)`): lossless against plain
decoding, token for token, greedy and seeded-sampled, with logprobs, stop tokens, max_new_tokens, several lanes,
constrained requests and cancellation; and the sampled distribution checked against the exact one.

Random tiny weights accept few drafts, so the all-accepted path gets its own checkpoint (tests/agreeing_mtp.py),
whose MTP head predicts exactly what the model will.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from pathlib import Path

import agreeing_mtp
import numpy as np
import pytest
from engine_helpers import collect, run_together
from ninfer import errors
from ninfer.artifact.convert import convert
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams
from tiny_models import QWEN35_VOCAB

MAX_CONTEXT = 512


@pytest.fixture(scope="session")
def tiny_qwen35_moe_artifact(pytestconfig, tiny_qwen3_5_moe) -> Path:
    out = Path(pytestconfig.cache.mkdir("runtime-artifacts")) / f"{tiny_qwen3_5_moe.name}.bf16.ninfer"
    if not out.exists():
        convert(tiny_qwen3_5_moe, out, recipe="bf16", progress=False)
    return out


@pytest.fixture(scope="session")
def agreeing_artifact(pytestconfig, tiny_qwen3_5) -> Path:
    return agreeing_mtp.agreeing_artifact(Path(pytestconfig.cache.mkdir("runtime-artifacts")), tiny_qwen3_5)


@pytest.fixture(scope="session")
def partly_agreeing_artifact(pytestconfig, tiny_qwen3_5) -> Path:
    """The agreeing head, with 5 % of the Gated DeltaNet layers' output kept: the model's tokens then depend on its
    recurrent state too, and some drafts are rejected (seen: from 4 % to half of them accepted, by prompt and
    sampling)."""
    folder = Path(pytestconfig.cache.mkdir("runtime-artifacts"))
    return agreeing_mtp.agreeing_artifact(folder, tiny_qwen3_5, gdn_scale=0.05)


def _options(spec_k: int, lanes: int = 3, queue: int = 16) -> EngineOptions:
    spec = {"spec": "mtp", "draft_tokens": spec_k} if spec_k else {}
    return EngineOptions(backend="cpu", max_context=MAX_CONTEXT, max_concurrency=lanes, max_queue=queue, threads=2,
                         **spec)


def _prompts(rng: np.random.Generator, lengths) -> list[list[int]]:
    return [rng.integers(0, QWEN35_VOCAB, size=n).tolist() for n in lengths]


def _requests(prompts, n: int, **sampling) -> list[Request]:
    return [Request(p, SamplingParams(**sampling), max_new_tokens=n, stop_token_ids=(), logprobs=True)
            for p in prompts]


def _generate(artifact: Path, spec_k: int, requests: list[Request]):
    with Engine.open_sync(artifact, _options(spec_k)) as engine:
        results = run_together(engine, requests)
        stats = engine.stats()
    return results, stats


def _assert_same(plain, spec) -> None:
    for (tokens_a, last_a), (tokens_b, last_b) in zip(plain, spec, strict=True):
        assert tokens_b == tokens_a
        assert last_b.finish_reason == last_a.finish_reason
        assert last_b.usage.generated_tokens == last_a.usage.generated_tokens


def _logprobs(events_of) -> list[float]:
    return [lp for ev in events_of for lp in ev.logprobs or ()]


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_greedy_output_is_identical_to_plain_decoding_for_every_draft_count(
        model, tiny_qwen35_artifact, tiny_qwen35_moe_artifact):
    artifact = tiny_qwen35_artifact if model == "dense" else tiny_qwen35_moe_artifact
    rng = np.random.default_rng()
    # Prompts ending on, just before and just after a 64-token page boundary, run three lanes at once.
    requests = _requests(_prompts(rng, (64, 63, 129)), 20, temperature=0)
    plain, _ = _generate(artifact, 0, requests)
    for k in range(1, 6):
        spec, stats = _generate(artifact, k, requests)
        _assert_same(plain, spec)
        assert stats.draft_tokens > 0  # it did draft
        for (_, a), (_, b) in zip(plain, spec, strict=True):
            assert b.timings.draft_n > 0 and 0 <= b.timings.draft_n_accepted <= b.timings.draft_n
            assert a.timings.draft_n == 0


def test_logprobs_and_seeded_sampling_match_plain_decoding(tiny_qwen35_artifact):
    rng = np.random.default_rng()
    prompts = _prompts(rng, (40, 64, 100))
    sampling = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "min_p": 0.01, "presence_penalty": 0.3,
                    "frequency_penalty": 0.2, "repetition_penalty": 1.1, "seed": int(rng.integers(1 << 30))}

    async def events(engine, request):
        return [ev async for ev in engine.generate(request)]

    async def run_all(engine, requests):
        return await asyncio.gather(*(events(engine, r) for r in requests))

    for kwargs in ({"temperature": 0}, sampling):
        requests = _requests(prompts, 16, **kwargs)
        out = {}
        for k in (0, 3):
            with Engine.open_sync(tiny_qwen35_artifact, _options(k)) as engine:
                out[k] = asyncio.run(run_all(engine, requests))
        for plain, spec in zip(out[0], out[3], strict=True):
            assert [t for ev in spec for t in ev.token_ids] == [t for ev in plain for t in ev.token_ids]
            np.testing.assert_allclose(_logprobs(spec), _logprobs(plain), rtol=0, atol=1e-5)


def test_agreeing_drafts_are_accepted_and_output_stays_identical(agreeing_artifact):
    rng = np.random.default_rng()
    requests = _requests(_prompts(rng, (10, 64, 77)), 30, temperature=0)
    plain, _ = _generate(agreeing_artifact, 0, requests)
    for k in (1, 3, 5):
        spec, stats = _generate(agreeing_artifact, k, requests)
        _assert_same(plain, spec)
        # Whole rounds accepted (a near-tie may flip one draft; random tiny weights accept almost none).
        assert stats.draft_tokens_accepted >= 0.9 * stats.draft_tokens > 0


@pytest.mark.parametrize("k", [2, 4])
def test_rounds_that_accept_some_drafts_keep_the_exact_state_of_the_last_accepted_one(partly_agreeing_artifact, k):
    """Random weights accept no draft (each round keeps row 0's state) and the agreeing head every one (whose model
    ignores its state): here rounds stop anywhere in between, and the state kept must be that row's exactly, or
    the next tokens differ. Greedy and seeded sampling, two lanes."""
    rng = np.random.default_rng()
    prompts = _prompts(rng, (30, 64, 90))
    seed = int(rng.integers(1 << 30))
    for sampling in ({"temperature": 0}, {"temperature": 0.7, "top_k": 20, "seed": seed}):
        requests = _requests(prompts, 40, **sampling)
        plain, _ = _generate(partly_agreeing_artifact, 0, requests)
        spec, stats = _generate(partly_agreeing_artifact, k, requests)
        _assert_same(plain, spec)
        if sampling["temperature"] == 0:  # (sampled draws agree with argmax drafts less often)
            assert 0 < stats.draft_tokens_accepted < stats.draft_tokens


def test_stop_tokens_and_max_new_tokens_end_inside_an_accepted_run(agreeing_artifact):
    rng = np.random.default_rng()
    prompt = _prompts(rng, (20,))[0]
    (tokens, _), = _generate(agreeing_artifact, 0, _requests([prompt], 30, temperature=0))[0]
    # a stop token in the middle of the output: generation ends there (it is not emitted)
    at = next(i for i in range(5, len(tokens)) if tokens[i] not in tokens[:i])
    for k in (2, 5):
        # max_new_tokens that a round of k + 1 would overshoot, and the stop token, in lanes side by side
        lengths = (1, 2, k + 2, 11)
        requests = [Request(prompt, SamplingParams(temperature=0), max_new_tokens=n, stop_token_ids=())
                    for n in lengths]
        requests.append(Request(prompt, SamplingParams(temperature=0), max_new_tokens=30,
                                stop_token_ids=(tokens[at],)))
        with Engine.open_sync(agreeing_artifact, _options(k, lanes=len(requests))) as engine:
            results = run_together(engine, requests)
        for n, (got, last) in zip(lengths, results, strict=False):
            assert got == tokens[:n] and last.finish_reason == "length"
        got, last = results[-1]
        assert got == tokens[:at] and last.finish_reason == "stop"
        assert last.usage.generated_tokens == at + 1
        assert last.timings.draft_n_accepted > 0


class RandomSubsets:
    """A constraint allowing a fresh random half of the vocabulary at each step."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def fill_next_mask(self, new_token_ids, mask):
        bits = self.rng.random(mask.size * 32) < 0.5
        mask[:] = np.packbits(bits, bitorder="little").view("<u4")
        return True


def test_constrained_requests_decode_plainly_beside_speculative_ones(agreeing_artifact):
    rng = np.random.default_rng()
    prompts = _prompts(rng, (30, 50))
    seed = int(rng.integers(1 << 30))

    def requests():
        free = Request(prompts[0], SamplingParams(temperature=0), max_new_tokens=20, stop_token_ids=())
        constrained = Request(prompts[1], SamplingParams(temperature=0), max_new_tokens=20, stop_token_ids=(),
                              constraint=RandomSubsets(seed))
        return [free, constrained]

    plain, _ = _generate(agreeing_artifact, 0, requests())
    spec, _ = _generate(agreeing_artifact, 4, requests())
    _assert_same(plain, spec)
    assert spec[0][1].timings.draft_n > 0 and spec[1][1].timings.draft_n == 0


def test_cancelling_mid_generation_frees_the_lane_and_the_engine_goes_on(agreeing_artifact):
    rng = np.random.default_rng()
    prompt = _prompts(rng, (30,))[0]
    with Engine.open_sync(agreeing_artifact, _options(3, lanes=1)) as engine:
        slots = engine.stats().free_state_slots

        async def cancel_after_first_tokens():
            seen = []
            async for ev in engine.generate(Request(prompt, SamplingParams(temperature=0), max_new_tokens=400,
                                                    stop_token_ids=())):
                seen.extend(ev.token_ids)
                if len(seen) >= 6 and ev.finish_reason is None:
                    engine.cancel(ev.request_id)
                last = ev
            return seen, last

        seen, last = asyncio.run(cancel_after_first_tokens())
        assert last.finish_reason == "cancelled" and len(seen) < 400
        assert engine.stats().free_state_slots == slots and engine.stats().busy_lanes == 0
        again, last = asyncio.run(collect(engine, Request(prompt, SamplingParams(temperature=0), max_new_tokens=12,
                                                          stop_token_ids=())))
        assert again[:len(seen)] == seen[:len(again)]  # both are prefixes of the one greedy answer


def _chi2_critical(df: int, z: float) -> float:
    """Wilson-Hilferty's approximation of the chi-square quantile at normal quantile z."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_sampled_first_and_second_tokens_follow_the_target_distribution(tiny_qwen35_artifact):
    """Over many seeds, the (first, second) token pairs a speculative engine samples (top-k 4, so the exact
    distribution has 16 cells) match the exact probabilities from plain-decoding logprobs: Pearson's chi-square
    test at significance 0.001 (z = 3.09)."""
    rng = np.random.default_rng()
    prompt = _prompts(rng, (24,))[0]
    top_k, samples = 4, 480

    with Engine.open_sync(tiny_qwen35_artifact, _options(0)) as plain:
        def top(tokens):
            events = []

            async def run():
                async for ev in plain.generate(Request(tokens, SamplingParams(temperature=0), max_new_tokens=1,
                                                       stop_token_ids=(), top_logprobs=top_k)):
                    events.append(ev)

            asyncio.run(run())
            pairs = [p for ev in events for alternatives in ev.top_logprobs or () for p in alternatives]
            weights = np.exp([lp for _, lp in pairs])
            return {t: w / weights.sum() for (t, _), w in zip(pairs, weights, strict=True)}

        first = top(prompt)
        second = {t: top(prompt + [t]) for t in first}
    probability = {(a, b): pa * pb for a, pa in first.items() for b, pb in second[a].items()}

    requests = [Request(prompt, SamplingParams(temperature=1.0, top_k=top_k, seed=seed), max_new_tokens=3,
                        stop_token_ids=()) for seed in rng.integers(1 << 40, size=samples).tolist()]
    with Engine.open_sync(tiny_qwen35_artifact, _options(2, lanes=8, queue=samples)) as engine:
        results = run_together(engine, requests)
        assert engine.stats().draft_tokens > 0
    counts: dict[tuple[int, int], int] = {}
    for tokens, _ in results:
        counts[(tokens[0], tokens[1])] = counts.get((tokens[0], tokens[1]), 0) + 1
    assert set(counts) <= set(probability)  # nothing outside the top-k pairs
    chi2 = sum((counts.get(cell, 0) - samples * p) ** 2 / (samples * p) for cell, p in probability.items())
    assert chi2 < _chi2_critical(len(probability) - 1, 3.09)


def test_bad_speculative_options_are_refused(tiny_llama_artifact, tiny_qwen35_artifact):
    for k in (0, 6):
        with pytest.raises(errors.EngineError, match="draft_tokens"):
            Engine.open_sync(tiny_qwen35_artifact, EngineOptions(backend="cpu", spec="mtp", draft_tokens=k))
    with pytest.raises(errors.EngineError, match="spec"):
        Engine.open_sync(tiny_qwen35_artifact, EngineOptions(backend="cpu", spec="eagle"))
    with pytest.raises(errors.EngineError, match="no MTP head"):
        Engine.open_sync(tiny_llama_artifact, EngineOptions(backend="cpu", spec="mtp"))


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_a_verify_pass_is_decode_steps_row_for_row(model, tiny_qwen35_artifact, tiny_qwen35_moe_artifact):
    """The verify pass against its obviously-right twin, plain decode steps, on fresh random tokens: every row's
    logits are the decode step's bit for bit, and the state it keeps after row `keep` continues exactly as the
    decoded sequence's does."""
    from ninfer import _testing

    artifact = tiny_qwen35_artifact if model == "dense" else tiny_qwen35_moe_artifact
    rng = np.random.default_rng()
    m = _testing.Model.open(str(artifact), max_context=256, max_sequences=12, threads=2)  # 3 + up to 6 verify slots
    prompt = np.asarray(rng.integers(0, QWEN35_VOCAB, size=int(rng.integers(1, 130))), dtype=np.int32)
    rows = np.asarray(rng.integers(0, QWEN35_VOCAB, size=int(rng.integers(2, 7))), dtype=np.int32)
    keep = int(rng.integers(0, len(rows)))
    after = np.int32(rng.integers(0, QWEN35_VOCAB))
    verified, decoded, kept = m.new_sequence(), m.new_sequence(), m.new_sequence()
    for seq in (verified, decoded, kept):
        m.prefill(seq, prompt)
    logits = np.asarray(m.verify(verified, rows, keep))
    steps = np.concatenate([np.asarray(m.decode(decoded, int(t))) for t in rows])
    np.testing.assert_array_equal(logits, steps)
    for t in rows[:keep + 1]:
        m.decode(kept, int(t))
    np.testing.assert_array_equal(np.asarray(m.decode(verified, int(after))), np.asarray(m.decode(kept, int(after))))
    for seq in (verified, decoded, kept):
        m.release(seq)


def test_a_prompt_reusing_the_prefix_cache_drafts_and_answers_as_plain_decoding(agreeing_artifact, tiny_qwen35_artifact):
    # The second request's prompt starts with the first's whole conversation: admission restores its cached blocks
    # (and state snapshot), and the MTP head catches up from the first token computed after them.
    for artifact in (agreeing_artifact, tiny_qwen35_artifact):
        rng = np.random.default_rng()
        first = _prompts(rng, (200,))[0]
        with Engine.open_sync(artifact, _options(0, lanes=1)) as engine:
            (tokens, _), = run_together(engine, _requests([first], 30, temperature=0))
        follow_up = first + tokens + _prompts(rng, (70,))[0]
        requests = _requests([first, follow_up], 30, temperature=0)
        with Engine.open_sync(artifact, replace(_options(0, lanes=1), prefix_cache=False)) as engine:
            plain = [run_together(engine, [r])[0] for r in requests]
        with Engine.open_sync(artifact, _options(3, lanes=1)) as engine:
            spec = [run_together(engine, [r])[0] for r in requests]
            stats = engine.stats()
        _assert_same(plain, spec)
        assert stats.prefix.hits >= 1 and stats.prefix.cached_tokens >= 192
        assert spec[1][1].usage.cached_tokens >= 192 and spec[1][1].timings.draft_n > 0
