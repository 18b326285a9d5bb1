"""The CPU sampler's llama.cpp stages (typical-p, top-n-sigma, dynamic temperature, XTC, DRY, the penalty window and
the sampler order) against a numpy reference written from llama.cpp's definitions, on fresh random logits.

The reference keeps a dict token -> logit and applies each stage literally; DRY compares every earlier position with
the end of the context directly (quadratic), where the engine runs a linear Z-algorithm pass."""

from __future__ import annotations

import math

import numpy as np
import pytest
from ninfer import _engine, _testing, errors

VOCAB = 48


def params(**fields) -> _engine.SamplingParams:
    p = _engine.SamplingParams()
    for k, v in fields.items():
        setattr(p, k, [getattr(_engine.SamplerStage, s) for s in v] if k == "order" else v)
    return p


def softmax(c: dict[int, float]) -> dict[int, float]:
    top = max(c.values())
    e = {t: math.exp(v - top) for t, v in c.items()}
    total = sum(e.values())
    return {t: v / total for t, v in e.items()}


def by_likelihood(c: dict[int, float]) -> list[int]:
    return sorted(c, key=lambda t: (-c[t], t))


def ref_penalties(c, p, prompt, generated):
    window = list(prompt) + list(generated)
    first_generated = len(prompt)
    if p["repeat_last_n"] >= 0:
        start = max(0, len(window) - p["repeat_last_n"])
    else:
        start = 0
    seen = window[start:]
    out = [t for i, t in enumerate(window) if i >= max(start, first_generated)]
    for t in set(seen):
        if t in c:
            c[t] = c[t] / p["repetition_penalty"] if c[t] > 0 else c[t] * p["repetition_penalty"]
    for t in set(out):
        if t in c:
            c[t] -= p["presence_penalty"] + p["frequency_penalty"] * out.count(t)
    return c


def ref_dry(c, p, context):
    if p["dry_multiplier"] == 0 or p["dry_penalty_last_n"] == 0:
        return c
    n = len(context) if p["dry_penalty_last_n"] < 0 else min(len(context), p["dry_penalty_last_n"])
    w = context[len(context) - n:]
    allowed, breakers = p["dry_allowed_length"], set(p["dry_breakers"])
    if n <= allowed:
        return c
    # a repeat may not reach back across the last breaker
    limit = next((i for i in range(n) if w[n - 1 - i] in breakers), n)
    if limit < allowed:
        return c
    longest: dict[int, int] = {}
    for j in range(n - 1):  # an earlier stretch ending at j, followed by w[j + 1]
        length = 0
        while length <= j and w[j - length] == w[n - 1 - length]:
            length += 1
        length = min(length, limit)
        if length >= allowed:
            longest[w[j + 1]] = max(longest.get(w[j + 1], 0), length)
    for t, length in longest.items():
        if t in c and t not in breakers:
            c[t] -= p["dry_multiplier"] * p["dry_base"] ** (length - allowed)
    return c


def ref_top_n_sigma(c, n):
    if n <= 0 or len(c) <= 1:
        return c
    values = np.array(list(c.values()), dtype=np.float64)
    floor = values.max() - n * values.std()
    return {t: v for t, v in c.items() if v >= floor}


def ref_top_k(c, k):
    return c if k <= 0 else {t: c[t] for t in by_likelihood(c)[:k]}


def ref_typical(c, typical_p):
    if typical_p >= 1 or len(c) <= 1:
        return c
    probs = softmax(c)
    entropy = -sum(q * math.log(q) for q in probs.values() if q > 0)
    ranked = sorted(by_likelihood(c), key=lambda t: abs(-math.log(probs[t]) - entropy))
    kept, mass = [], 0.0
    for t in ranked:
        kept.append(t)
        mass += probs[t]
        if mass > typical_p:
            break
    return {t: c[t] for t in kept}


def ref_top_p(c, top_p):
    if top_p >= 1:
        return c
    probs = softmax(c)
    kept, mass = [], 0.0
    for t in by_likelihood(c):
        kept.append(t)
        mass += probs[t]
        if mass >= top_p:
            break
    return {t: c[t] for t in kept}


def ref_min_p(c, min_p):
    if min_p <= 0:
        return c
    probs = softmax(c)
    best = max(probs.values())
    return {t: v for t, v in c.items() if probs[t] >= min_p * best}


def ref_xtc(c, probability, threshold):
    if probability <= 0 or threshold > 0.5 or len(c) < 2:
        return c
    probs = softmax(c)
    above = [t for t in by_likelihood(c) if probs[t] >= threshold]
    if len(above) < 2:
        return c
    return {t: v for t, v in c.items() if t not in above[:-1]}


def ref_temperature(c, p):
    t = p["temperature"]
    if p["dynatemp_range"] > 0 and len(c) > 1:
        probs = softmax(c)
        entropy = -sum(q * math.log(q) for q in probs.values() if q > 0)
        low, high = max(0.0, t - p["dynatemp_range"]), t + p["dynatemp_range"]
        t = low + (high - low) * (entropy / math.log(len(c))) ** p["dynatemp_exponent"]
    if t <= 0:
        best = by_likelihood(c)[0]
        return {best: c[best]}
    return {tok: v / t for tok, v in c.items()}


DEFAULTS = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                "repetition_penalty": 1.0, "repeat_last_n": -1, "typical_p": 1.0, "top_n_sigma": -1.0, "dynatemp_range": 0.0,
                "dynatemp_exponent": 1.0, "xtc_probability": 0.0, "xtc_threshold": 0.1, "dry_multiplier": 0.0, "dry_base": 1.75,
                "dry_allowed_length": 2, "dry_penalty_last_n": -1, "dry_breakers": ()}
DEFAULT_ORDER = ["penalties", "dry", "top_n_sigma", "top_k", "temperature", "top_p", "min_p", "typ_p", "xtc"]


def reference(logits, case, prompt, generated, xtc_fires=True):
    p = {**DEFAULTS, **case}
    c = {t: float(v) for t, v in enumerate(logits)}
    stages = {
        "penalties": lambda c: ref_penalties(c, p, prompt, generated),
        "dry": lambda c: ref_dry(c, p, list(prompt) + list(generated)),
        "top_n_sigma": lambda c: ref_top_n_sigma(c, p["top_n_sigma"]),
        "top_k": lambda c: ref_top_k(c, p["top_k"]),
        "typ_p": lambda c: ref_typical(c, p["typical_p"]),
        "top_p": lambda c: ref_top_p(c, p["top_p"]),
        "min_p": lambda c: ref_min_p(c, p["min_p"]),
        "xtc": lambda c: ref_xtc(c, p["xtc_probability"], p["xtc_threshold"]) if xtc_fires else c,
        "temperature": lambda c: ref_temperature(c, p),
    }
    for stage in case.get("order", DEFAULT_ORDER):
        c = stages[stage](c)
    out = np.zeros(len(logits))
    for t, q in softmax(c).items():
        out[t] = q
    return out


def native_case(case):
    fields = {("penalty_last_n" if k == "repeat_last_n" else k): v for k, v in case.items()}
    if "dry_breakers" in fields:
        fields["dry_breakers"] = list(fields["dry_breakers"])
    return params(**fields)


CASES = {
    "typical": {"typical_p": 0.7},
    "typical-strict": {"typical_p": 0.2, "temperature": 0.8},
    "top-n-sigma": {"top_n_sigma": 1.0},
    "dynatemp": {"temperature": 0.8, "dynatemp_range": 0.5, "dynatemp_exponent": 1.0},
    "dynatemp-exponent": {"temperature": 1.2, "dynatemp_range": 1.5, "dynatemp_exponent": 2.5, "top_k": 10},
    "xtc": {"xtc_probability": 1.0, "xtc_threshold": 0.05, "temperature": 0.6},
    "xtc-high-threshold": {"xtc_probability": 1.0, "xtc_threshold": 0.6},
    "dry": {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2},
    "dry-window-breakers": {"dry_multiplier": 1.5, "dry_base": 2.0, "dry_allowed_length": 1, "dry_penalty_last_n": 30,
                                "dry_breakers": (3, 7)},
    "penalty-window": {"repeat_last_n": 12, "repetition_penalty": 1.5, "presence_penalty": 0.5, "frequency_penalty": 0.3},
    "penalty-window-0": {"repeat_last_n": 0, "repetition_penalty": 1.5},
    "llama.cpp-order": {"order": ["penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
                            "temperature": 0.5, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "typical_p": 0.9, "dry_multiplier": 0.5,
                            "repetition_penalty": 1.2, "xtc_probability": 1.0, "xtc_threshold": 0.08},
    "ui-order-without-penalties": {"order": ["top_k", "typ_p", "top_p", "min_p", "temperature"], "top_k": 30,
                                       "temperature": 0.7, "repetition_penalty": 2.0, "dry_multiplier": 2.0},
    "reversed": {"order": ["temperature", "min_p", "top_p", "typ_p", "top_k"], "temperature": 0.4, "min_p": 0.1,
                     "top_p": 0.8, "typical_p": 0.95, "top_k": 8},
}


def repetitive_context(rng):
    """A prompt and output with repeats, so that DRY and the penalties have something to act on."""
    motif = list(rng.integers(0, VOCAB, size=5))
    prompt = [int(t) for t in [*rng.integers(0, VOCAB, size=6), *motif, *rng.integers(0, VOCAB, size=4), *motif]]
    generated = [int(t) for t in [*rng.integers(0, VOCAB, size=3), *motif[:3]]]
    return prompt, generated


@pytest.mark.parametrize("name", CASES)
def test_stage_matches_reference(name):
    rng = np.random.default_rng()
    case = CASES[name]
    for _ in range(20):
        logits = rng.normal(0, 2.0, size=VOCAB).astype(np.float32)
        prompt, generated = repetitive_context(rng)
        want = reference(logits, case, prompt, generated)
        got = np.array(_testing.sampler_distribution(logits.tolist(), native_case(case), prompt, generated))
        np.testing.assert_allclose(got, want, atol=2e-5, err_msg=f"{name}: logits {logits.tolist()}, "
                                                                f"prompt {prompt}, generated {generated}")


def test_dry_penalises_the_token_that_extends_a_repeat():
    """A hand-checked case: `1 2 3 4 ... 1 2 3` -> 4 would extend a repeat of length 3 (allowed 2: 0.8 * 1.75)."""
    logits = [0.0] * 8
    case = {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2, "temperature": 1.0}
    got = np.array(_testing.sampler_distribution(logits, native_case(case), [1, 2, 3, 4, 6, 1, 2], [3]))
    weights = np.ones(8)
    weights[4] = math.exp(-0.8 * 1.75)
    np.testing.assert_allclose(got, weights / weights.sum(), atol=1e-6)
    breaker = native_case({**case, "dry_breakers": [2]})  # the repeat may not reach back across the 2: length 1
    got = np.array(_testing.sampler_distribution(logits, breaker, [1, 2, 3, 4, 6, 1, 2], [3]))
    np.testing.assert_allclose(got, np.full(8, 1 / 8), atol=1e-6)


def test_xtc_acts_only_when_its_coin_says_so():
    rng = np.random.default_rng()
    logits = rng.normal(0, 2.0, size=VOCAB).astype(np.float32)
    case = {"xtc_probability": 0.5, "xtc_threshold": 0.05}
    spared = np.array(_testing.sampler_distribution(logits.tolist(), native_case(case), [], [], False))
    np.testing.assert_allclose(spared, reference(logits, case, [], [], xtc_fires=False), atol=2e-5)
    # Drawn: about half the tokens come from the cut distribution, which never gives the likeliest token.
    cut = reference(logits, case, [], [])
    top = int(np.argmax(logits))
    assert cut[top] == 0
    draws = _testing.sampler_draw(logits.tolist(), native_case({**case, "has_seed": True, "seed": 7}), 4000)
    share_top = draws.count(top) / len(draws)
    expected = 0.5 * spared[top]
    assert abs(share_top - expected) < 0.05, (share_top, expected)


@pytest.mark.parametrize("field,value", [("typical_p", 0.0), ("dynatemp_range", -1.0), ("xtc_probability", 1.5),
                                         ("dry_base", 0.5), ("dry_allowed_length", -1), ("penalty_last_n", -2),
                                         ("dry_penalty_last_n", -3)])
def test_invalid_values_are_refused_by_name(field, value):
    with pytest.raises(errors.EngineError, match=field.replace("penalty_last_n", "repeat_last_n")
                       if field == "penalty_last_n" else field):
        _engine.sampling_params_validate(params(**{field: value}))


def test_default_order_is_the_documented_one():
    assert [s.name for s in _engine.sampler_default_order()] == DEFAULT_ORDER
