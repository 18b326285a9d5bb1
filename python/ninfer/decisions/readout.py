"""From candidate logprobs to answers: temperature, the two-token code chain, the answer objects and their
confidences (docs/decisions.md).

- p_j = softmax(lp_j / T) over a question's labels; lp_j is the engine's log-softmax over the candidates (the
  full vocabulary's normaliser cancels), so T = 1 gives the renormalised full-vocabulary probabilities.
- two-token codes: lp(code) = lp(letter) + lp(digit | letter), then the softmax over the codes.
- choice confidence: normalised Gini (N·Σp² − 1)/(N − 1), 1 when N = 1 (issue 16's settlement).
- score: the expected level Σ i·p_i; confidence 1 − D/U (the Jev formula): m the first most likely level,
  D = Σ p_i·|i − m|, U = (1/N)·Σ |i − (N − 1)/2|; clamped to [0, 1], 1 when N = 1.
- ties: the first maximum in request order wins.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ninfer.decisions.contract import Question


def softmax(logprobs: Sequence[float], temperature: float = 1.0) -> list[float]:
    scaled = [(lp if math.isfinite(lp) else -9999.0) / temperature for lp in logprobs]
    top = max(scaled)
    weights = [math.exp(v - top) for v in scaled]
    total = math.fsum(weights)
    return [w / total for w in weights]


def chain_codes(letter_lp: Sequence[float], digit_lp: dict[int, Sequence[float]], n: int) -> list[float]:
    """lp of codes 0..n-1 (code i = letter i // 10, digit i % 10): letter then digit given the letter."""
    return [letter_lp[i // 10] + digit_lp[i // 10][i % 10] for i in range(n)]


def choice_confidence(p: Sequence[float]) -> float:
    n = len(p)
    if n == 1:
        return 1.0
    return min(1.0, max(0.0, (n * math.fsum(x * x for x in p) - 1.0) / (n - 1)))


def score_confidence(p: Sequence[float]) -> float:
    n = len(p)
    if n == 1:
        return 1.0
    m = argmax(p)
    d = math.fsum(pi * abs(i - m) for i, pi in enumerate(p))
    u = math.fsum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return min(1.0, max(0.0, 1.0 - d / u))


def argmax(p: Sequence[float]) -> int:
    best = 0
    for i, v in enumerate(p):
        if v > p[best]:
            best = i
    return best


def answer(q: Question, p: Sequence[float]) -> dict[str, Any]:
    """The wire answer of one question from its label probabilities (request order)."""
    if q.type == "noul":
        return {"type": "noul", "noul": p[0]}  # labels (Yes, No)
    if q.type == "choice":
        keys = list(q.criteria)
        return {"type": "choice", "choice": keys[argmax(p)], "confidence": choice_confidence(p),
                "probabilities": dict(zip(keys, p, strict=True))}
    return {"type": "score", "score": math.fsum(i * pi for i, pi in enumerate(p)), "confidence": score_confidence(p),
            "legend": {str(i): level for i, level in enumerate(q.criteria)},
            "probabilities": {str(i): pi for i, pi in enumerate(p)}}
