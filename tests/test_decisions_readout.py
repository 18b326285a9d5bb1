"""ninfer.decisions without an engine: the readout's formulas against direct computations on random
distributions, the label schemes, the frozen state rendering, and the contract's checks."""

from __future__ import annotations

import math
import random

import pytest
from ninfer.decisions.contract import (
    ContractError,
    DecisionLimits,
    Question,
    TooLargeError,
    load_json,
    parse_request,
)
from ninfer.decisions.prompt import content_text, labels_for
from ninfer.decisions.readout import answer, chain_codes, choice_confidence, score_confidence, softmax


def _random_p(rng: random.Random, n: int) -> list[float]:
    w = [rng.random() ** 3 for _ in range(n)]
    return [x / sum(w) for x in w]


def test_confidences_match_their_definitions_on_random_distributions():
    rng = random.Random()
    for _ in range(200):
        n = rng.randrange(1, 60)
        p = _random_p(rng, n)
        gini = 1.0 if n == 1 else (n * sum(x * x for x in p) - 1) / (n - 1)
        assert choice_confidence(p) == pytest.approx(gini, abs=1e-12)
        if n == 1:
            assert score_confidence(p) == 1.0
            continue
        m = max(range(n), key=lambda i: (p[i], -i))
        spread = sum(x * abs(i - m) for i, x in enumerate(p))
        uniform = math.floor(n * n / 4) / n  # U = floor(N^2/4)/N (the contract's closed form)
        assert score_confidence(p) == pytest.approx(min(1, max(0, 1 - spread / uniform)), abs=1e-12)
    assert choice_confidence([0.8, 0.2]) == pytest.approx(0.36)


def test_softmax_sums_to_one_and_temperature_keeps_the_argmax():
    rng = random.Random()
    for _ in range(100):
        lps = [rng.uniform(-30, 0) for _ in range(rng.randrange(1, 300))]
        for t in (0.5, 1.0, 1.7):
            p = softmax(lps, t)
            assert math.fsum(p) == pytest.approx(1.0, abs=1e-12)
            assert p.index(max(p)) == lps.index(max(lps))


def test_two_token_codes_chain_letter_then_digit():
    rng = random.Random()
    n = rng.randrange(63, 256)
    letters = [rng.uniform(-5, 0) for _ in range(26)]
    digits = {i: [rng.uniform(-5, 0) for _ in range(10)] for i in range((n - 1) // 10 + 1)}
    codes = chain_codes(letters, digits, n)
    for i in (0, n // 2, n - 1):
        assert codes[i] == letters[i // 10] + digits[i // 10][i % 10]


def test_label_schemes():
    assert labels_for(Question("a", "noul", None, None)).labels == ["Yes", "No"]
    assert labels_for(Question("a", "score", None, ["x"] * 10)).labels == [str(i) for i in range(10)]
    eleven = labels_for(Question("a", "score", None, ["x"] * 11)).labels
    assert eleven[0] == "A" and len(set(eleven)) == 11
    assert labels_for(Question("a", "choice", None, {"x": 1, "?": 2})).labels == ["x", "?"]
    assert labels_for(Question("a", "choice", None, {"long": 1, "key": 2})).labels == ["A", "B"]
    wide = labels_for(Question("a", "choice", None, {f"k{i}": None for i in range(255)}))
    assert wide.two_token and wide.labels[0] == "A0" and wide.labels[-1] == "Z4"


def test_state_rendering_is_frozen_compact_json_in_source_order():
    assert content_text("as is {") == "as is {"
    assert content_text({"b": 1, "a": [1, "é"]}) == '{"b":1,"a":[1,"é"]}'


def test_score_answer_is_the_expected_level_with_a_legend():
    q = Question("s", "score", None, ["lo", {"mid": 1}, "hi"])
    a = answer(q, [0.2, 0.3, 0.5])
    assert a["score"] == pytest.approx(1.3) and a["legend"] == {"0": "lo", "1": {"mid": 1}, "2": "hi"}


def test_the_contract_lists_every_violation_and_bounds_the_request():
    limits = DecisionLimits(max_questions=2)
    with pytest.raises(ContractError) as info:
        parse_request({"state": "", "questions": {"a": {"type": "x"}, "": {"type": "noul", "zz": 1}}}, limits)
    kinds = {p["type"] for p in info.value.problems}
    assert {"content_type", "union_tag_invalid", "string_too_short", "extra_forbidden"} <= kinds
    with pytest.raises(TooLargeError):
        parse_request({"state": "s", "questions": {f"q{i}": {"type": "noul"} for i in range(3)}}, limits)
    with pytest.raises(ContractError) as dup:
        load_json(b'{"a": 1, "a": 2}')
    assert dup.value.status == 422
    ok = parse_request({"state": [{"role": "user", "content": "hi"}], "questions": {"b": {"type": "noul"},
                                                                                    "a": {"type": "noul"}}}, limits)
    assert ok.messages and [q.id for q in ok.questions] == ["b", "a"]
