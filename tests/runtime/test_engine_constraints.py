"""Per-step token constraints (the structured-output hook): the engine asks the request's constraint for a mask
before each sampled token, passes it the tokens sampled since the last call, and samples only allowed tokens."""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np
import pytest
from engine_helpers import collect, run_alone, run_together
from ninfer import errors
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams
from ninfer.serve.structured import allowed_token_ids


class RandomSubsets:
    """Allows a fresh random tenth of the vocabulary at each step and records what it was told and allowed."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.calls: list[tuple[int, ...]] = []
        self.allowed: list[set[int]] = []

    def fill_next_mask(self, new_token_ids, mask):
        self.calls.append(tuple(new_token_ids))
        bits = self.rng.random(mask.size * 32) < 0.1
        mask[:] = np.packbits(bits, bitorder="little").view("<u4")
        self.allowed.append(set(allowed_token_ids(mask).tolist()))
        return True


class Unconstrained:
    def fill_next_mask(self, new_token_ids, mask):
        return False


def request(prompt, n, constraint=None, **sampling):
    return Request(prompt, SamplingParams(**sampling), max_new_tokens=n, stop_token_ids=(), constraint=constraint)


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=1.0, top_k=50, seed=7)])
def test_every_token_is_allowed_and_the_constraint_sees_each_one(tiny_llama_artifact, sampling):
    rng = np.random.default_rng()
    with Engine.open_sync(tiny_llama_artifact, EngineOptions(max_context=512, max_concurrency=2)) as engine:
        assert engine.supports_token_constraints
        prompt = rng.integers(3, 500, size=int(rng.integers(5, 90))).tolist()
        constraint = RandomSubsets(int(rng.integers(1 << 30)))
        tokens, last = asyncio.run(collect(engine, request(prompt, 24, constraint, **sampling)))
        assert last.finish_reason == "length" and len(tokens) == 24
        assert constraint.calls == [()] + [(t,) for t in tokens[:-1]]  # first call right after prefill
        assert all(t in allowed for t, allowed in zip(tokens, constraint.allowed, strict=True))


def test_unconstrained_neighbours_are_unchanged_and_false_means_unconstrained(tiny_llama_artifact):
    rng = np.random.default_rng()
    with Engine.open_sync(tiny_llama_artifact, EngineOptions(max_context=512, max_concurrency=3)) as engine:
        prompts = [rng.integers(3, 500, size=n).tolist() for n in (7, 40, 13)]
        plain = [request(p, 20, temperature=0) for p in prompts]
        alone = run_alone(engine, plain)
        mixed = [plain[0], request(prompts[1], 20, RandomSubsets(1), temperature=0),
                 request(prompts[2], 20, Unconstrained(), temperature=0)]
        together = [tokens for tokens, _ in run_together(engine, mixed)]
        assert together[0] == alone[0]
        assert together[2] == alone[2]  # a constraint that declines every step changes nothing
        assert together[1] != alone[1]


def test_a_failing_constraint_ends_its_request_with_a_typed_error(tiny_llama_artifact):
    class Broken:
        def fill_next_mask(self, new_token_ids, mask):
            raise RuntimeError("grammar exploded")

    class Empty:
        def fill_next_mask(self, new_token_ids, mask):
            mask[:] = 0
            return True

    with Engine.open_sync(tiny_llama_artifact, EngineOptions(max_context=512, max_concurrency=2)) as engine:
        with pytest.raises(errors.EngineError, match="grammar exploded"):
            asyncio.run(collect(engine, request([5, 6, 7], 10, Broken(), temperature=0)))
        with pytest.raises(errors.EngineError, match="allows no token"):
            asyncio.run(collect(engine, request([5, 6, 7], 10, Empty(), temperature=0)))
        tokens, last = asyncio.run(collect(engine, request([5, 6, 7], 5, temperature=0)))
        assert last.finish_reason == "length" and len(tokens) == 5
        s = engine.stats()
        assert (s.busy_lanes, s.kv_free_tokens) == (0, s.kv_capacity_tokens)


def test_cancel_while_the_engine_waits_for_a_mask_frees_the_lane_at_once(tiny_llama_artifact):
    class Slow:
        def fill_next_mask(self, new_token_ids, mask):
            time.sleep(1.0)
            return False

    with Engine.open_sync(tiny_llama_artifact, EngineOptions(max_context=512, max_concurrency=1)) as engine:

        async def main():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(collect(engine, request([5, 6, 7], 50, Slow(), temperature=0)), 0.2)
            began = time.monotonic()
            while engine.stats().busy_lanes and time.monotonic() - began < 5:
                await asyncio.sleep(0.01)
            return time.monotonic() - began

        assert asyncio.run(main()) < 0.5  # the mask's answer (1 s away) is not awaited
        tokens, last = asyncio.run(collect(engine, request([5, 6, 7], 5, temperature=0)))
        assert last.finish_reason == "length" and len(tokens) == 5
