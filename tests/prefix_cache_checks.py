"""What a request served from the prefix cache must give, whatever the backend: the runtime tests (CPU) and the GPU
tests share it."""

from __future__ import annotations

import asyncio

import numpy as np

# A prompt served from the cache is prefilled in other chunks than one computed whole (attention and the chunked
# Gated DeltaNet sum in another order): logprobs agree to float rounding, far below any difference a wrong reuse
# makes (another sequence's state or pages change them at the first token).
LOGPROB_ATOL = 2e-3


def run_one(engine, request):
    tokens, last = asyncio.run(collect_with_logprobs(engine, request))
    return tokens, last


async def collect_with_logprobs(engine, request):
    tokens, top, last = [], [], None
    async for ev in engine.generate(request):
        tokens.extend(ev.token_ids)
        top.extend(ev.top_logprobs or ())
        last = ev
    return (tokens, top), last


async def cancel_mid_prefill(engine, request, after_tokens: int):
    """Submits `request`, cancels it once the engine prefilled `after_tokens` more tokens, returns its last event."""
    stream = engine.submit(request)
    before = engine.stats().tokens_prefilled
    while engine.stats().tokens_prefilled < before + after_tokens:
        await asyncio.sleep(0.0002)
    assert engine.cancel(stream.request_id)
    while (ev := await anext(stream)).finish_reason is None:
        pass
    return ev


def decide_twice(engine, context, questions):
    """The same decision run twice on `engine`: both runs' answers and the tokens the engine prefilled for each."""
    answers, prefilled = [], []
    for _ in range(2):
        before = engine.stats().tokens_prefilled
        answers.append(asyncio.run(engine.decide(context, questions)))
        prefilled.append(engine.stats().tokens_prefilled - before)
    return answers, prefilled


def assert_same(cached, uncached):
    (tokens, top), (ref_tokens, ref_top) = cached, uncached
    assert tokens == ref_tokens
    for mine, ref in zip(top, ref_top, strict=True):
        assert [t for t, _ in mine] == [t for t, _ in ref]
        np.testing.assert_allclose([v for _, v in mine], [v for _, v in ref], atol=LOGPROB_ATOL)


class SnapshotRules:
    """Which prefix of one stem (prompts that are its beginnings) the cache can serve, from the documented rules:
    KV at every block boundary a prompt computed; Gated DeltaNet state only at the prompt's last block boundary and
    every `interval` tokens."""

    def __init__(self, has_state: bool, interval: int) -> None:
        self.has_state, self.interval = has_state, interval
        self.points: set[int] = set()

    def ran(self, n: int) -> None:
        last = n // 64 * 64
        if self.has_state:
            self.points |= set(range(self.interval, last + 1, self.interval)) | ({last} if last else set())
        else:
            self.points |= set(range(64, last + 1, 64))

    def reuse(self, n: int) -> int:
        return max((p for p in self.points if p <= n - 1), default=0)
