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


def assert_same(cached, uncached, *, near_ties: bool = False):
    """The same greedy tokens and top candidates, their logprobs within LOGPROB_ATOL. near_ties (a device backend,
    whose two prefills differ by rounding: a prefix read back from the KV pool in its stored dtype, sums in another
    order): the runs may also order candidates whose logprobs are within LOGPROB_ATOL of each other differently (the
    random test models' 248k flat logits have such near-ties), and where they pick different tokens so, the rest of
    the two answers continues from different tokens and is not compared."""
    (tokens, top), (ref_tokens, ref_top) = cached, uncached
    if not near_ties:
        assert tokens == ref_tokens
    assert len(tokens) == len(ref_tokens) == len(top) == len(ref_top)
    for token, ref_token, mine, ref in zip(tokens, ref_tokens, top, ref_top, strict=True):
        if not near_ties:
            assert [t for t, _ in mine] == [t for t, _ in ref]
            np.testing.assert_allclose([v for _, v in mine], [v for _, v in ref], atol=LOGPROB_ATOL)
            continue
        assert_same_within_ties(dict(mine), dict(ref))
        if token != ref_token:  # a tie at the top (checked above): the answers go on from different tokens
            return


def assert_same_within_ties(mine: dict[int, float], ref: dict[int, float]) -> None:
    """Two top-k lists (id -> logprob) that differ at most by near-ties: a candidate in both has the same logprob
    within LOGPROB_ATOL; one in only one of them is within LOGPROB_ATOL of the other list's last (it fell off the cut
    by a tie); so the top candidate of either is within 2 x LOGPROB_ATOL of the other's."""
    for t in mine.keys() & ref.keys():
        assert abs(mine[t] - ref[t]) <= LOGPROB_ATOL, (t, mine, ref)
    for one, other in ((mine, ref), (ref, mine)):
        for t in one.keys() - other.keys():
            assert one[t] <= min(other.values()) + LOGPROB_ATOL, (t, mine, ref)


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


# A device tier of 10 pages and one snapshot slot beside one lane, and a host tier: three 300-token conversations
# push the first one's deeper blocks and its snapshot to the host; max_context leaves room for its follow-ups.
HOST_TIER_BUDGET = {"max_context": 384, "kv_capacity": 640, "max_concurrency": 1, "decision_lanes": 0,
                    "device_state_slots": 2, "snapshot_interval": 4096}


def host_tier_round_trip(open_engine, greedy, *, near_ties: bool = False) -> dict:
    """Conversation A, then B and C, which move A's deeper blocks (and its snapshot) to the host tier; A continued is
    restored from there; then the engine is closed and a new one opened on the same host tier: A continued again is
    restored from what the first engine left. Every answer equals the cache-off engine's. `open_engine(**options)`
    opens the backend's engine; `greedy(prompt)` makes the request. Returns the two engines' prefix stats."""
    with open_engine(prefix_cache=False, **HOST_TIER_BUDGET) as off:
        rng = np.random.default_rng()
        a, b, c = (rng.integers(3, off.info.vocab_size, size=300).tolist() for _ in range(3))
        a2 = a + rng.integers(3, off.info.vocab_size, size=20).tolist()
        a3 = a2 + rng.integers(3, off.info.vocab_size, size=20).tolist()
        reference = [run_one(off, greedy(p))[0] for p in (a, b, c, a2, a3)]
    tiered = HOST_TIER_BUDGET | {"host_kv_mib": 16, "host_state_slots": 8}
    with open_engine(**tiered) as first:
        results = [run_one(first, greedy(p)) for p in (a, b, c, a2)]
        before_close = first.stats()
        tier = first.host_tier
    assert [last.usage.cached_tokens for _, last in results] == [0, 0, 0, 256]
    assert tier.stats()["parked"]
    with open_engine(host_tier=tier, **tiered) as second:
        assert not tier.stats()["parked"]
        got, last = run_one(second, greedy(a3))
        after_reopen = second.stats()
        assert tier.stats()["used_pages"] == after_reopen.prefix.host_blocks
    assert last.usage.cached_tokens == 320  # a2's blocks and its prompt-end snapshot, all from the host
    for (mine, _), ref in zip([*results, (got, last)], reference, strict=True):
        assert_same(mine, ref, near_ties=near_ties)
    s = after_reopen
    assert (s.busy_lanes, s.kv_free_tokens) == (0, s.kv_capacity_tokens)
    return {"first": before_close.prefix, "second": after_reopen.prefix}
