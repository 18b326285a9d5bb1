"""The device sampler (cpp/backend/cuda/sampling.cu) against the CPU Sampler and float64 references on fresh random
logits: greedy is the host argmax, logprobs and top_logprobs are float64 log-softmax values, the distribution is
the CPU Sampler's for random parameter sets (penalties, top-k / top-p / min-p, masks), draws pass a chi-square test
against it, and a seeded row draws the same token whatever shares its batch. Then the engine on backend="cuda":
seeded sampled generations are the same alone and alongside others, and greedy generation equals host sampling."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest
from ninfer import _engine, _testing

pytestmark = pytest.mark.gpu

QWEN35_VOCAB = 248320


def params(**fields) -> _engine.SamplingParams:
    p = _engine.SamplingParams()
    for k, v in fields.items():
        setattr(p, k, v)
    return p


def random_mask(rng, vocab: int, density: float) -> np.ndarray:
    bits = rng.random(((vocab + 31) // 32) * 32) < density
    bits[int(rng.integers(vocab))] = True  # at least one allowed token
    return np.packbits(bits, bitorder="little").view("<u4").copy()


def masked(logits: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    if mask is None:
        return logits
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[: logits.shape[-1]].astype(bool)
    return np.where(bits, logits, -np.inf).astype(np.float32)


def log_softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x[np.isfinite(x)].max()
    return x - (np.log(np.exp(x - m).sum()) + m)


def random_params(rng, vocab: int):
    """A random mix of what requests ask for; every field is exercised alone and combined."""
    p = {"temperature": float(rng.choice([0.0, 0.5, 1.0, 1.7]))}
    if rng.random() < 0.5:
        p["top_k"] = int(rng.choice([1, 2, 5, 40, vocab // 2 + 1, vocab + 7]))
    if rng.random() < 0.5:
        p["top_p"] = float(rng.choice([0.05, 0.5, 0.9, 0.999]))
    if rng.random() < 0.4:
        p["min_p"] = float(rng.choice([0.01, 0.1, 0.5]))
    if rng.random() < 0.4:
        p["repetition_penalty"] = float(rng.choice([0.8, 1.3, 2.0]))
    if rng.random() < 0.4:
        p["presence_penalty"] = float(rng.uniform(-2, 2))
        p["frequency_penalty"] = float(rng.uniform(-2, 2))
    return p


def random_rows(rng, n: int, vocab: int, *, mask_rate: float = 0.3, scale: float = 3.0):
    logits = rng.normal(0, scale, size=(n, vocab)).astype(np.float32)
    prompts = [rng.integers(0, vocab, int(rng.integers(0, 30))).tolist() for _ in range(n)]
    generated = [rng.integers(0, vocab, int(rng.integers(0, 20))).tolist() for _ in range(n)]
    masks = [random_mask(rng, vocab, float(rng.uniform(0.05, 0.9))) if rng.random() < mask_rate else None
             for _ in range(n)]
    return logits, prompts, generated, masks


def cpu_distribution(logits, p: dict, prompt, generated, mask) -> np.ndarray:
    return np.array(_testing.sampler_distribution(masked(logits, mask).tolist(), params(**p), prompt, generated))


@pytest.mark.parametrize("vocab", [1, 33, 300, 4097, QWEN35_VOCAB])
def test_greedy_is_the_host_argmax(vocab):
    rng = np.random.default_rng()
    rows = 9
    logits = rng.normal(0, 3, size=(rows, vocab)).astype(np.float32)
    for r in range(rows):  # ties: the first index wins, as np.argmax
        first = int(rng.integers(vocab))
        logits[r, first:] = np.minimum(logits[r, first:], logits[r, first])
        logits[r, rng.integers(first, vocab, 3)] = logits[r, first]
    ps = [params(temperature=0.0, logprobs=True) for _ in range(rows)]
    got = _testing.cuda.sample_rows(logits, ps, [0] * rows, [0] * rows, [[]] * rows, [[]] * rows, [None] * rows)
    assert [t for t, _, _ in got] == np.argmax(logits, axis=1).tolist()


@pytest.mark.parametrize("vocab", [7, 300, 5000, QWEN35_VOCAB])
def test_logprobs_and_top_logprobs_are_the_float64_log_softmax(vocab):
    rng = np.random.default_rng()
    rows = 8
    logits, prompts, generated, masks = random_rows(rng, rows, vocab, mask_rate=0.5)
    masks[0] = random_mask(rng, vocab, 0.0)  # a row with fewer allowed tokens than top_logprobs: -inf alternatives
    ps = [params(**random_params(rng, vocab), logprobs=True, top_logprobs=int(rng.integers(0, 21)))
          for _ in range(rows)]
    ps[0].top_logprobs = 20
    seeds = rng.integers(0, 1 << 63, rows).tolist()
    got = _testing.cuda.sample_rows(logits, ps, seeds, [5] * rows, prompts, generated, masks)
    for r, (token, logprob, top) in enumerate(got):
        want = log_softmax64(masked(logits[r], masks[r]))  # the constrained, unpenalised distribution
        assert 0 <= token < vocab and np.isfinite(want[token])
        np.testing.assert_allclose(logprob, want[token], rtol=0, atol=2e-5)
        n = min(ps[r].top_logprobs, vocab)
        order = np.lexsort((np.arange(vocab), -want))[:n]  # most likely first, ties by token id
        assert [t for t, _ in top] == order.tolist()
        np.testing.assert_allclose([v for _, v in top], want[order], rtol=0, atol=2e-5)


@pytest.mark.parametrize("vocab", [2, 300, 4097, 40000])
def test_distribution_matches_the_cpu_sampler(vocab):
    rng = np.random.default_rng()
    for _ in range(4):
        rows = int(rng.integers(1, 10))
        logits, prompts, generated, masks = random_rows(rng, rows, vocab)
        ps = [random_params(rng, vocab) for _ in range(rows)]
        got = _testing.cuda.sampling_distribution(logits, [params(**p) for p in ps], prompts, generated, masks)
        assert got.shape == (rows, vocab)
        for r in range(rows):
            want = cpu_distribution(logits[r], ps[r], prompts[r], generated[r], masks[r])
            np.testing.assert_allclose(got[r], want, rtol=0, atol=1e-6, err_msg=str(ps[r]))
            assert not got[r][want == 0].any(), ps[r]


def test_distribution_matches_the_cpu_sampler_at_qwen35_vocab():
    rng = np.random.default_rng()
    cases = [dict(temperature=0.7, top_p=0.8, top_k=20), dict(temperature=1.0, top_p=0.95),
             dict(temperature=0.6, min_p=0.05), dict(temperature=1.0), dict(temperature=0.0, repetition_penalty=1.5),
             dict(temperature=0.8, top_k=40, presence_penalty=1.5, frequency_penalty=0.5, repetition_penalty=1.1)]
    logits, prompts, generated, masks = random_rows(rng, len(cases), QWEN35_VOCAB, mask_rate=0.3, scale=4.0)
    got = _testing.cuda.sampling_distribution(logits, [params(**p) for p in cases], prompts, generated, masks)
    for r, case in enumerate(cases):
        want = cpu_distribution(logits[r], case, prompts[r], generated[r], masks[r])
        np.testing.assert_allclose(got[r], want, rtol=0, atol=1e-6, err_msg=str(case))


def chi_square_limit(dof: int, z: float = 4.0) -> float:
    """The chi-square quantile at normal quantile z (Wilson-Hilferty; z = 4: p about 3e-5)."""
    a = 2.0 / (9 * dof)
    return dof * (1 - a + z * np.sqrt(a)) ** 3


@pytest.mark.parametrize("case", [
    dict(temperature=0.9, top_k=30, top_p=0.95),  # the radix-sorted path
    dict(temperature=0.8, top_k=12, min_p=0.05),  # top-k by selection
    dict(temperature=1.3, min_p=0.02),            # the unsorted path with min-p
    dict(temperature=1.0),                        # plain temperature
])
def test_draws_follow_the_distribution(case):
    rng = np.random.default_rng()
    vocab, rows, calls = 64, 400, 50
    logits = rng.normal(0, 1.5, size=vocab).astype(np.float32)
    mask = random_mask(rng, vocab, 0.8)
    p = params(**case)
    seed = int(rng.integers(1 << 63))
    batch = np.repeat(logits[None], rows, axis=0)
    draws = []
    for call in range(calls):  # every draw its own counter: independent draws of one seeded stream
        counters = list(range(call * rows, (call + 1) * rows))
        got = _testing.cuda.sample_rows(batch, [p] * rows, [seed] * rows, counters, [[]] * rows, [[]] * rows,
                                       [mask] * rows)
        draws += [t for t, _, _ in got]
    want = cpu_distribution(logits, case, [], [], mask)
    counts = np.bincount(draws, minlength=vocab)
    assert counts[want == 0].sum() == 0
    expected = want * len(draws)
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expect = np.append(expected[big], expected[~big].sum())
    keep = expect > 0
    stat = float((((observed - expect) ** 2)[keep] / expect[keep]).sum())
    assert stat < chi_square_limit(int(keep.sum()) - 1), (stat, case)


def test_seeded_draws_do_not_depend_on_the_batch():
    rng = np.random.default_rng()
    vocab = 5000
    logits, prompts, generated, masks = random_rows(rng, 8, vocab, mask_rate=0.5, scale=1.0)
    ps = [params(**random_params(rng, vocab), logprobs=True, top_logprobs=3) for _ in range(8)]
    ps[3] = params(temperature=1.0, top_p=0.9, top_k=400, repetition_penalty=1.2, logprobs=True, top_logprobs=3)
    seeds = rng.integers(0, 1 << 63, 8).tolist()
    for counter in range(20):
        together = _testing.cuda.sample_rows(logits, ps, seeds, [counter] * 8, prompts, generated, masks)
        alone = _testing.cuda.sample_rows(logits[3:4], ps[3:4], seeds[3:4], [counter], prompts[3:4], generated[3:4],
                                         masks[3:4])
        reordered = _testing.cuda.sample_rows(logits[::-1].copy(), ps[::-1], seeds[::-1], [counter] * 8,
                                             prompts[::-1], generated[::-1], masks[::-1])
        assert together[3] == alone[0] == reordered[4]
    # The stream moves with the counter and differs between seeds.
    by_counter = [_testing.cuda.sample_rows(logits[3:4], ps[3:4], seeds[3:4], [c], prompts[3:4], generated[3:4],
                                           masks[3:4])[0][0] for c in range(40)]
    other_seed = [_testing.cuda.sample_rows(logits[3:4], ps[3:4], [seeds[3] ^ 1], [c], prompts[3:4], generated[3:4],
                                           masks[3:4])[0][0] for c in range(40)]
    assert len(set(by_counter)) > 1 and by_counter != other_seed


# --- the engine on backend="cuda" -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_qwen35(tmp_path_factory):
    from ninfer.artifact.convert import convert
    from tiny_models import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("tiny_sampling")
    out = root / "qwen3_5.bf16.ninfer"
    convert(build_tiny_checkpoint("qwen3_5", root), out, recipe="bf16", progress=False)
    return out


def _generate(engine, requests):
    """All requests at once; each one's (tokens, logprobs, top_logprobs)."""

    async def one(request):
        tokens, logprobs, tops = [], [], []
        async for ev in engine.generate(request):
            tokens += ev.token_ids
            logprobs += ev.logprobs or ()
            tops += ev.top_logprobs or ()
        return tokens, logprobs, tops

    async def everything():
        return list(await asyncio.gather(*(one(r) for r in requests)))

    return asyncio.run(everything())


def _options(**kw):
    from ninfer.engine import EngineOptions

    base = dict(backend="cuda", max_context=512, kv_dtype="f32", max_concurrency=3, prefill_chunk=64)
    return EngineOptions(**(base | kw))


def test_seeded_generation_is_the_same_alone_and_alongside_others(tiny_qwen35):
    from ninfer.engine import Engine, Request, SamplingParams

    rng = np.random.default_rng(3)
    seeded = Request(prompt_tokens=rng.integers(0, 200, 17).tolist(), max_new_tokens=24, stop_token_ids=(),
                     sampling=SamplingParams(temperature=0.9, top_p=0.9, top_k=50, repetition_penalty=1.1, seed=1234),
                     logprobs=True)
    others = [Request(prompt_tokens=rng.integers(0, 200, 40).tolist(), max_new_tokens=30, stop_token_ids=(),
                      sampling=SamplingParams(temperature=1.2, min_p=0.05)),
              Request(prompt_tokens=rng.integers(0, 200, 9).tolist(), max_new_tokens=10, stop_token_ids=(),
                      sampling=SamplingParams(temperature=0.0), top_logprobs=4)]
    with Engine.open_sync(tiny_qwen35, _options()) as engine:
        alone = _generate(engine, [seeded])[0]
        together = _generate(engine, [others[0], seeded, others[1]])[1]
        again = _generate(engine, [seeded])[0]
        assert engine.memory_plan()["graph_replays"] > 0
    assert alone[0] == together[0] == again[0]
    assert len(alone[0]) == 24
    np.testing.assert_allclose(alone[1], together[1], atol=1e-4)  # batch-size numerics of the forward only
    with Engine.open_sync(tiny_qwen35, _options()) as engine:
        other_seed = _generate(engine, [replace(seeded, sampling=replace(seeded.sampling, seed=1235))])[0]
    assert other_seed[0] != alone[0]


class _AllowFew:
    """A constraint allowing a fixed set of tokens at every step."""

    def __init__(self, allowed):
        self.allowed = allowed

    def fill_next_mask(self, new_token_ids, mask):
        mask[:] = 0
        for t in self.allowed:
            mask[t // 32] |= np.uint32(1 << (t % 32))
        return True


def test_greedy_and_constrained_generation_equal_host_sampling(tiny_qwen35):
    from ninfer.engine import Engine, Request, SamplingParams

    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 200, int(n)).tolist() for n in (5, 33, 70)]
    allowed = sorted(rng.choice(200, 12, replace=False).tolist())

    def requests():
        return [Request(prompt_tokens=p, sampling=SamplingParams(temperature=0.0, repetition_penalty=1.3),
                        max_new_tokens=12, stop_token_ids=(), logprobs=True, top_logprobs=5,
                        constraint=_AllowFew(allowed) if i == 1 else None) for i, p in enumerate(prompts)]

    results = {}
    for device_sampling in (True, False):
        with Engine.open_sync(tiny_qwen35, _options(device_sampling=device_sampling)) as engine:
            results[device_sampling] = _generate(engine, requests())
    for (d_tokens, d_lp, d_top), (h_tokens, h_lp, h_top) in zip(results[True], results[False], strict=True):
        assert d_tokens == h_tokens
        np.testing.assert_allclose(d_lp, h_lp, atol=1e-5)
        assert [[t for t, _ in alts] for alts in d_top] == [[t for t, _ in alts] for alts in h_top]
        np.testing.assert_allclose([[v for _, v in alts] for alts in d_top], [[v for _, v in alts] for alts in h_top],
                                   atol=1e-5)
    assert set(results[True][1][0]) <= set(allowed)


def test_llama_cpp_stages_sample_on_the_host_and_match_it(tiny_qwen35):
    """A request using a stage only the CPU Sampler has (typical-p, DRY, XTC, an order) samples on the host from
    logits copied back: seeded, it gives exactly the host sampler's tokens (device_sampling off), while the device
    sampler's draws for the same seed would differ (a counter-based generator)."""
    from ninfer.engine import Engine, Request, SamplingParams

    rng = np.random.default_rng(11)
    prompt = rng.integers(0, 200, 21).tolist()
    stages = SamplingParams(temperature=0.9, typical_p=0.8, dry_multiplier=0.8, xtc_probability=0.5,
                            xtc_threshold=0.05, order=("penalties", "dry", "top_k", "typ_p", "xtc", "temperature"),
                            top_k=40, seed=99)
    request = Request(prompt_tokens=prompt, sampling=stages, max_new_tokens=20, stop_token_ids=())
    results = {}
    for device_sampling in (True, False):
        with Engine.open_sync(tiny_qwen35, _options(device_sampling=device_sampling)) as engine:
            results[device_sampling] = _generate(engine, [request])[0][0]
    assert len(results[True]) == 20 and results[True] == results[False]
