"""The prefix cache on the CUDA backend: requests served from it give the greedy tokens and logprobs of the same
requests with the cache off (the prefill GEMM on its f32 twin, so that how prompt rows are batched rounds nothing
differently), reuse exactly what the snapshot rules predict (state restored by a device copy), on tiny Qwen3.5
dense and MoE in bf16 and fp8 KV; a cancelled prefill sharing pages leaves the pools as they were; the host tier
(page-locked memory, copies on the copy stream) restores a conversation evicted from the device, and a new engine
resumes from the tier a closed one left, with the same tokens and logprobs as the cache off."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prefix_cache_checks import (
    SnapshotRules,
    assert_same,
    cancel_mid_prefill,
    decide_twice,
    host_tier_round_trip,
    run_one,
)

from ninfer.engine import Engine, EngineOptions, Request, SamplingParams

pytestmark = pytest.mark.gpu

INTERVAL = 128


def _open(path, **kw) -> Engine:
    options = {"backend": "cuda", "max_context": 2048, "max_concurrency": 2, "prefill_chunk": 256,
               "snapshot_interval": INTERVAL, "device_state_slots": 32, "cuda_gemm": "twin"} | kw
    return Engine.open_sync(path, EngineOptions(**options))


def _greedy(prompt, n=8):
    return Request(list(prompt), SamplingParams(temperature=0), max_new_tokens=n, stop_token_ids=(), top_logprobs=3)


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_5_moe"])
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8", "k8v4"])
def test_cached_requests_equal_uncached_on_the_device(tiny_artifacts, kind, kv_dtype):
    rng = np.random.default_rng()
    lengths = [63, 64, 65, 200, 1100, 700]
    with _open(tiny_artifacts[kind], kv_dtype=kv_dtype, prefix_cache=False) as off:
        stem = rng.integers(3, off.info.vocab_size, size=1100).tolist()
        reference = [run_one(off, _greedy(stem[:n]))[0] for n in lengths]
    with _open(tiny_artifacts[kind], kv_dtype=kv_dtype) as on:
        rules = SnapshotRules(True, INTERVAL)
        for n, ref in zip(lengths, reference, strict=True):
            for _ in range(2):
                got, last = run_one(on, _greedy(stem[:n]))
                assert last.usage.cached_tokens == rules.reuse(n), n
                assert_same(got, ref, near_ties=True)
                rules.ran(n)
        s = on.stats()
    assert s.prefix.restores == s.prefix.hits > 0
    # Idle: every slot free (or holding only a snapshot), the decision lanes' slots included.
    assert (s.busy_lanes, s.kv_free_tokens, s.free_state_slots) == (0, s.kv_capacity_tokens, s.prefix.total_state_slots)


def test_a_cancelled_prefill_sharing_pages_leaks_nothing_on_the_device(tiny_artifacts):
    rng = np.random.default_rng()
    with _open(tiny_artifacts["qwen3_5"], prefill_chunk=64, prefix_cache=False) as off:
        vocab = off.info.vocab_size
        shared = rng.integers(3, vocab, size=600).tolist()
        follow_up = shared[:520] + rng.integers(3, vocab, size=1200).tolist()
        reference = run_one(off, _greedy(follow_up))[0]
    with _open(tiny_artifacts["qwen3_5"], prefill_chunk=64) as on:
        run_one(on, _greedy(shared))
        assert asyncio.run(cancel_mid_prefill(on, _greedy(follow_up), 300)).finish_reason == "cancelled"
        s = on.stats()
        assert (s.busy_lanes, s.kv_free_tokens) == (0, s.kv_capacity_tokens)
        got, last = run_one(on, _greedy(follow_up))
    assert last.usage.cached_tokens >= 512
    assert_same(got, reference, near_ties=True)


@pytest.mark.parametrize("context_tokens", [300, 320])
def test_a_decision_again_restores_its_context_on_the_device(tiny_artifacts, context_tokens):
    # The second decision over the same context restores the snapshot at its last block boundary (a device copy)
    # and computes only the tail (none at 320), with the answers of the cache-off engine.
    rng = np.random.default_rng()
    context = rng.integers(3, 5000, context_tokens).tolist()
    questions = [(rng.integers(3, 5000, int(rng.integers(1, 20))).tolist(),
                  rng.choice(5000, 4, replace=False).tolist()) for _ in range(10)]
    suffixes = sum(len(suffix) for suffix, _ in questions)
    with _open(tiny_artifacts["qwen3_5"], prefix_cache=False) as off:
        want = asyncio.run(off.decide(context, questions))
    with _open(tiny_artifacts["qwen3_5"]) as on:
        answers, prefilled = decide_twice(on, context, questions)
        s = on.stats()
    for got in answers:
        for lps, ref in zip(got, want, strict=True):
            np.testing.assert_allclose(lps, ref, atol=5e-4)
    boundary = context_tokens // 64 * 64
    assert prefilled == [context_tokens + suffixes, context_tokens - boundary + suffixes]
    assert (s.prefix.hits, s.prefix.cached_tokens, s.prefix.restores) == (1, boundary, 1)


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_5_moe"])
def test_host_tier_restores_equal_uncached_on_the_device(tiny_artifacts, kind):
    def open_engine(host_tier=None, **kw) -> Engine:
        options = {"backend": "cuda", "prefill_chunk": 256, "cuda_gemm": "twin"} | kw
        return Engine(tiny_artifacts[kind], EngineOptions(**options), host_tier=host_tier)

    stats = host_tier_round_trip(open_engine, _greedy, near_ties=True)
    assert (stats["first"].host_restored_blocks, stats["first"].host_restored_snapshots) == (3, 1)
    assert (stats["second"].host_restored_blocks, stats["second"].host_restored_snapshots) == (5, 1)
