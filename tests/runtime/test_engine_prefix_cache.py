"""The prefix cache in the engine (CPU backend, tiny random models): a request served from the cache gives the same
greedy tokens and the same logprobs (within the backend's batching bound) as with the cache off, reusing exactly
the prefix the snapshot rules predict; prompts of 63, 64, 65 tokens, longer ones and one of 64k + 1; every KV dtype; a branch at
an edited middle part; 8 requests sharing a system prompt; eviction under a tiny budget; a cancelled prefill of a
request that shares pages; constrained requests."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from engine_helpers import collect, run_alone, run_together
from prefix_cache_checks import SnapshotRules, assert_same, cancel_mid_prefill, run_one

from ninfer.engine import Engine, EngineOptions, Request, SamplingParams

MODELS = ["tiny_qwen35_artifact", "tiny_qwen35_moe_artifact", "tiny_llama_artifact"]
INTERVAL = 128


def open_engine(path, **options) -> Engine:
    defaults = {"max_context": 2048, "max_concurrency": 2, "prefill_chunk": 256, "snapshot_interval": INTERVAL,
                "device_state_slots": 64}
    return Engine.open_sync(path, EngineOptions(**{**defaults, **options}))


def greedy(prompt, n=6, **kw):
    return Request(list(prompt), SamplingParams(temperature=0), max_new_tokens=n, stop_token_ids=(), top_logprobs=3,
                   **kw)


@pytest.mark.parametrize("model", MODELS)
def test_cached_prompts_give_the_uncached_tokens_and_logprobs(request, model):
    path = request.getfixturevalue(model)
    rng = np.random.default_rng()
    with open_engine(path, prefix_cache=False) as off:
        stem = rng.integers(3, off.info.vocab_size, size=1100).tolist()
        lengths = [63, 64, 65, 200, 1100]
        reference = [run_one(off, greedy(stem[:n]))[0] for n in lengths]
    with open_engine(path) as on:
        rules = SnapshotRules(on.stats().prefix.total_state_slots > 0, INTERVAL)
        served = []
        for n, ref in zip(lengths, reference, strict=True):
            for _ in range(2):  # the second run of each prompt is served from what the first left
                got, last = run_one(on, greedy(stem[:n]))
                assert last.usage.cached_tokens == rules.reuse(n), n
                assert_same(got, ref)
                served.append(last.usage.cached_tokens)
                rules.ran(n)
        s = on.stats()
    assert (s.prefix.lookups, s.prefix.hits, s.prefix.cached_tokens) == (
        len(served), sum(c > 0 for c in served), sum(served))
    assert s.prefix.restores == (s.prefix.hits if rules.has_state else 0)
    assert (s.busy_lanes, s.kv_free_tokens) == (0, s.kv_capacity_tokens)


def test_a_prompt_of_64k_plus_one_tokens_reuses_all_its_blocks(tiny_qwen35_artifact):
    """A 65,537-token prompt (the issue's 64k + 1): served again, every one of its 1,024 whole blocks and the state
    at its last block boundary come from the cache (the last token is computed), with the answer of its first run,
    which had nothing cached (so computed it all, as with the cache off: two 64k prefills on the CPU are minutes)."""
    n = 64 * 1024 + 1
    with open_engine(tiny_qwen35_artifact, max_context=n + 64, prefill_chunk=4096, snapshot_interval=16384) as on:
        prompt = np.random.default_rng().integers(3, on.info.vocab_size, size=n).tolist()
        first, first_last = run_one(on, greedy(prompt, n=3))
        again, last = run_one(on, greedy(prompt, n=3))
    assert (first_last.usage.cached_tokens, last.usage.cached_tokens) == (0, n - 1)
    assert_same(again, first)


@pytest.mark.parametrize("kv_dtype", ["fp8", "int8", "f32"])
def test_every_kv_dtype_reuses_its_own_pages(tiny_qwen35_artifact, kv_dtype):
    rng = np.random.default_rng()
    prompts = []
    with open_engine(tiny_qwen35_artifact, kv_dtype=kv_dtype, prefix_cache=False) as off:
        stem = rng.integers(3, off.info.vocab_size, size=400).tolist()
        prompts = [stem[:300], stem, stem[:200] + [5, 6, 7]]
        reference = [run_one(off, greedy(p))[0] for p in prompts]
    with open_engine(tiny_qwen35_artifact, kv_dtype=kv_dtype) as on:
        results = [run_one(on, greedy(p)) for p in prompts]
    assert [last.usage.cached_tokens for _, last in results] == [0, 256, 128]
    for (got, _), ref in zip(results, reference, strict=True):
        assert_same(got, ref)


def test_an_edited_middle_part_reuses_the_snapshot_before_it(tiny_qwen35_artifact):
    rng = np.random.default_rng()
    with open_engine(tiny_qwen35_artifact, prefix_cache=False) as off:
        vocab = off.info.vocab_size
        first = rng.integers(3, vocab, size=600).tolist()
        edited = first[:300] + rng.integers(3, vocab, size=20).tolist() + first[320:]
        ref_first, ref_edited = (run_one(off, greedy(p))[0] for p in (first, edited))
    with open_engine(tiny_qwen35_artifact) as on:
        got_first, _ = run_one(on, greedy(first))
        got_edited, last = run_one(on, greedy(edited))
    assert last.usage.cached_tokens == 256  # the last interior snapshot before the edit at 300
    assert_same(got_first, ref_first)
    assert_same(got_edited, ref_edited)


def test_eight_requests_sharing_a_system_prompt(tiny_qwen35_artifact):
    rng = np.random.default_rng()
    with open_engine(tiny_qwen35_artifact, prefix_cache=False, max_concurrency=4) as off:
        vocab = off.info.vocab_size
        system = rng.integers(3, vocab, size=300).tolist()
        requests = [greedy(system + rng.integers(3, vocab, size=int(n)).tolist(), 8, logprobs=False)
                    for n in rng.integers(5, 60, 8)]
        reference = run_alone(off, requests)
    with open_engine(tiny_qwen35_artifact, max_concurrency=4) as on:
        together = run_together(on, requests)
        s = on.stats()
    assert [tokens for tokens, _ in together] == reference
    # The first four start together (those admitted a step after another started may reuse its first chunk, up
    # to the snapshot at 128); the next four get a lane only when one of those finished: they reuse the system
    # prompt up to its snapshot at 256.
    cached = [last.usage.cached_tokens for _, last in together]
    assert set(cached[:4]) <= {0, 128, 256} and cached[4:] == [256] * 4
    assert s.prefix.hits == s.prefix.restores == sum(c > 0 for c in cached)
    # Idle: every slot free (or holding only a snapshot), the decision lanes' slots included.
    assert (s.busy_lanes, s.kv_free_tokens, s.free_state_slots) == (0, s.kv_capacity_tokens, s.prefix.total_state_slots)


def test_a_tiny_budget_evicts_the_oldest_and_never_a_running_request(tiny_qwen35_artifact):
    rng = np.random.default_rng()
    # 12 pages of KV, 2 lanes of up to 5 pages each: three 300-token conversations cannot all stay cached.
    options = {"max_context": 320, "kv_capacity": 768, "device_state_slots": 5}
    with open_engine(tiny_qwen35_artifact, prefix_cache=False, **options) as off:
        vocab = off.info.vocab_size
        stems = [rng.integers(3, vocab, size=300).tolist() for _ in range(3)]
        requests = [greedy(stems[i], 8) for i in (0, 1, 2, 0, 2)]
        reference = [run_one(off, r)[0] for r in requests]
    with open_engine(tiny_qwen35_artifact, **options) as on:
        results = [run_one(on, r) for r in requests[:3]]
        # Two of these at once: each holds its pages while the other needs room.
        pair = run_together(on, requests[3:])
        s = on.stats()
    assert [last.usage.cached_tokens for _, last in results] == [0, 0, 0]
    assert s.prefix.evicted_blocks > 0
    cached = [last.usage.cached_tokens for _, last in pair]
    assert cached[1] == 256  # the most recent conversation is still cached; the oldest was evicted for it
    for (got, _), ref in zip(results, reference[:3], strict=True):
        assert_same(got, ref)
    assert [tokens for tokens, _ in pair] == [ref[0] for ref in reference[3:]]
    assert (s.busy_lanes, s.kv_free_tokens) == (0, s.kv_capacity_tokens)


def test_a_cancelled_prefill_that_shares_pages_leaks_nothing_and_publishes_only_whole_blocks(tiny_qwen35_artifact):
    rng = np.random.default_rng()
    with open_engine(tiny_qwen35_artifact, prefix_cache=False, prefill_chunk=64) as off:
        vocab = off.info.vocab_size
        shared = rng.integers(3, vocab, size=600).tolist()
        follow_up = shared[:520] + rng.integers(3, vocab, size=1200).tolist()
        ref_shared, ref_follow = (run_one(off, greedy(p))[0] for p in (shared, follow_up))
    with open_engine(tiny_qwen35_artifact, prefill_chunk=64) as on:
        run_one(on, greedy(shared))
        ev = asyncio.run(cancel_mid_prefill(on, greedy(follow_up), 300))
        assert ev.finish_reason == "cancelled" and ev.usage.cached_tokens == 512
        s = on.stats()
        assert (s.busy_lanes, s.kv_free_tokens) == (0, s.kv_capacity_tokens)
        again_follow, last_follow = run_one(on, greedy(follow_up))
        again_shared, last_shared = run_one(on, greedy(shared))
    # The cancelled run published the blocks it finished, with their snapshots: the retry starts after them.
    assert last_follow.usage.cached_tokens > 512 and last_follow.usage.cached_tokens % INTERVAL == 0
    assert last_shared.usage.cached_tokens == 576
    assert_same(again_follow, ref_follow)
    assert_same(again_shared, ref_shared)


class AllowEven:
    """Allows only even token ids."""

    def fill_next_mask(self, new_token_ids, mask):
        bits = np.zeros(mask.size * 32, dtype=bool)
        bits[::2] = True
        mask[:] = np.packbits(bits, bitorder="little").view("<u4")
        return True


def test_constrained_requests_reuse_the_cache_and_keep_their_constraint(tiny_llama_artifact):
    rng = np.random.default_rng()
    with open_engine(tiny_llama_artifact, prefix_cache=False) as off:
        prompt = rng.integers(3, off.info.vocab_size, size=300).tolist()
        reference, _ = asyncio.run(collect(off, greedy(prompt, 10, constraint=AllowEven())))
    with open_engine(tiny_llama_artifact) as on:
        first, _ = asyncio.run(collect(on, greedy(prompt, 10, constraint=AllowEven())))
        again, last = asyncio.run(collect(on, greedy(prompt, 10, constraint=AllowEven())))
    assert first == again == reference and all(t % 2 == 0 for t in again)
    assert last.usage.cached_tokens == 256
