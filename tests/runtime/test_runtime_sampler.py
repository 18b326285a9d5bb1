"""The C++ sampler against a numpy reference written straight from the definitions, on fresh random logits."""

from __future__ import annotations

import numpy as np
import pytest
from ninfer import _engine, _testing, errors


def params(**fields) -> _engine.SamplingParams:
    p = _engine.SamplingParams()
    for k, v in fields.items():
        setattr(p, k, v)
    return p


def reference_distribution(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, presence_penalty=0.0,
                           frequency_penalty=0.0, repetition_penalty=1.0, prompt=(), generated=()):
    z = np.asarray(logits, dtype=np.float64).copy()
    for t in set(prompt) | set(generated):  # CTRL repetition penalty over everything seen
        z[t] = z[t] / repetition_penalty if z[t] > 0 else z[t] * repetition_penalty
    for t in set(generated):  # OpenAI presence / frequency penalties over the output
        z[t] -= presence_penalty + frequency_penalty * list(generated).count(t)
    if temperature == 0:
        out = np.zeros_like(z)
        out[np.argmax(z)] = 1
        return out
    p = np.exp((z - z.max()) / temperature)
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros(len(p), dtype=bool)
    keep[order[: top_k or len(p)]] = True
    if top_p < 1:
        q = np.where(keep, p, 0)
        q /= q.sum()
        cumulative = np.cumsum(q[order])
        cut = int(np.searchsorted(cumulative, top_p)) + 1  # smallest prefix reaching top_p
        keep[order[cut:]] = False
    if min_p > 0:
        keep &= p >= min_p * p.max()
    out = np.where(keep, p, 0)
    return out / out.sum()


CASES = [
    dict(temperature=0),
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=0.9, min_p=0.05),
    dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02),
    dict(temperature=1.0, repetition_penalty=1.3),
    dict(temperature=1.0, presence_penalty=0.7, frequency_penalty=0.4),
    dict(temperature=0, repetition_penalty=2.0, frequency_penalty=1.5),
]


@pytest.mark.parametrize("case", CASES, ids=[",".join(f"{k}={v}" for k, v in c.items()) for c in CASES])
def test_distribution_matches_reference(case):
    rng = np.random.default_rng()
    for _ in range(5):
        logits = rng.normal(0, 3, size=300).astype(np.float32)
        prompt = rng.integers(0, 300, size=20).tolist()
        generated = rng.integers(0, 300, size=15).tolist()
        got = np.array(_testing.sampler_distribution(logits.tolist(), params(**case), prompt, generated))
        want = reference_distribution(logits, prompt=prompt, generated=generated, **case)
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_draws_follow_the_distribution_and_repeat_with_the_seed():
    rng = np.random.default_rng()
    logits = rng.normal(0, 1.5, size=12).astype(np.float32)
    p = params(temperature=0.9, top_k=8, has_seed=True, seed=int(rng.integers(1 << 62)))
    draws = _testing.sampler_draw(logits.tolist(), p, 20000)
    assert draws == _testing.sampler_draw(logits.tolist(), p, 20000)  # same seed, same stream
    p.seed += 1
    assert draws != _testing.sampler_draw(logits.tolist(), p, 20000)
    want = reference_distribution(logits, temperature=0.9, top_k=8)
    freq = np.bincount(draws, minlength=12) / len(draws)
    # 20000 draws: the standard error of each frequency is below 0.0036; 5 sigma.
    np.testing.assert_allclose(freq, want, atol=0.018)
    assert freq[want == 0].sum() == 0


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", -0.1), ("temperature", float("nan")), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1),
    ("min_p", 1.5), ("presence_penalty", 3.0), ("frequency_penalty", -2.5), ("repetition_penalty", 0.0),
    ("top_logprobs", 21),
])
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(errors.EngineError, match=f"invalid sampling value: {field} = "):
        _engine.sampling_params_validate(params(**{field: value}))


def random_mask(rng, vocab: int, density: float) -> np.ndarray:
    bits = rng.random(((vocab + 31) // 32) * 32) < density
    bits[int(rng.integers(vocab))] = True  # at least one allowed token
    return np.packbits(bits, bitorder="little").view("<u4").copy()


def test_token_mask_matches_the_numpy_twin():
    from ninfer.serve.structured import apply_mask

    rng = np.random.default_rng()
    for vocab in (1, 31, 32, 33, 300, 1000):
        logits = rng.normal(0, 3, size=vocab).astype(np.float32)
        mask = random_mask(rng, vocab, float(rng.random()))
        want = logits.copy()
        apply_mask(want, mask)
        got = np.array(_testing.apply_token_mask(logits.tolist(), mask), dtype=np.float32)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", CASES, ids=[",".join(f"{k}={v}" for k, v in c.items()) for c in CASES])
def test_masked_distribution_keeps_only_allowed_tokens(case):
    from ninfer.serve.structured import apply_mask

    rng = np.random.default_rng()
    for _ in range(5):
        logits = rng.normal(0, 3, size=300).astype(np.float32)
        apply_mask(logits, random_mask(rng, 300, 0.2))
        prompt = rng.integers(0, 300, size=20).tolist()
        generated = rng.integers(0, 300, size=15).tolist()
        got = np.array(_testing.sampler_distribution(logits.tolist(), params(**case), prompt, generated))
        with np.errstate(invalid="ignore"):
            want = reference_distribution(logits, prompt=prompt, generated=generated, **case)
        assert not got[np.isneginf(logits)].any()
        np.testing.assert_allclose(got, want, atol=1e-6)
