"""The prefix cache's host tier in the engine (CPU backend: a second pool, copied with memcpy), on tiny Qwen3.5
dense and MoE and a plain decoder: a request restored from the host tier gives the same greedy tokens and logprobs
as with the cache off, also from a new engine opened on the tier a closed one left (warm resume); a tiny budget in
both tiers evicts from both, forgets the oldest conversations first, and leaves every page accounted for; the
options' range errors."""

from __future__ import annotations

import numpy as np
import pytest
from prefix_cache_checks import HOST_TIER_BUDGET, host_tier_round_trip, run_one

from ninfer import errors
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams

MODELS = ["tiny_qwen35_artifact", "tiny_qwen35_moe_artifact", "tiny_llama_artifact"]


def open_engine(path, host_tier=None, **options) -> Engine:
    return Engine(path, EngineOptions(**{"prefill_chunk": 256, **options}), host_tier=host_tier)


def greedy(prompt, n=6):
    return Request(list(prompt), SamplingParams(temperature=0), max_new_tokens=n, stop_token_ids=(), top_logprobs=3)


@pytest.mark.parametrize("model", MODELS)
def test_host_restores_equal_the_cache_off_and_survive_the_engine(request, model):
    path = request.getfixturevalue(model)
    stats = host_tier_round_trip(lambda **kw: open_engine(path, **kw), greedy)
    state = model != "tiny_llama_artifact"
    first, second = stats["first"], stats["second"]
    # The first engine: a's three deeper blocks came back from the host, with its snapshot (models with state).
    assert (first.host_restored_blocks, first.host_restored_snapshots) == (3, int(state))
    # Stored: a's 3 and b's 4 blocks; the snapshots of a, b and c, each pushed out by the next prompt's.
    assert first.host_stored_blocks == 7 and first.host_stored_snapshots == 3 * int(state)
    # The second: all five of a2's blocks and its prompt-end snapshot.
    assert (second.host_restored_blocks, second.host_restored_snapshots) == (5, int(state))
    assert second.lookups == second.hits == 1


def test_a_tiny_budget_in_both_tiers_forgets_the_oldest_and_accounts_for_every_page(tiny_qwen35_artifact):
    rng = np.random.default_rng()
    options = HOST_TIER_BUDGET | {"host_kv_mib": 1, "host_state_slots": 2}
    with open_engine(tiny_qwen35_artifact, **options) as engine:
        page_bytes = engine.memory_plan()["host_kv_page_bytes"]
        host_pages = engine.memory_plan()["host_kv_pages"]
        assert host_pages == (1 << 20) // page_bytes and engine.memory_plan()["host_state_slots"] == 2
        vocab = engine.info.vocab_size
        # Enough conversations of 4 blocks each to overflow the device (10 pages) and the host tier.
        talks = [rng.integers(3, vocab, size=300).tolist() for _ in range(host_pages // 4 + 4)]
        for t in talks:
            assert run_one(engine, greedy(t))[1].usage.cached_tokens == 0
        s = engine.stats().prefix
        assert s.host_evicted_blocks > 0 and s.host_evicted_snapshots > 0
        assert s.host_blocks <= host_pages and s.host_snapshots <= 2
        # GDSF with equal frequencies ages out the oldest first: the first conversation is gone, the last two
        # (one on the device, one just moved to the host with its snapshot) are whole.
        assert run_one(engine, greedy(talks[0] + [5]))[1].usage.cached_tokens == 0
        assert [run_one(engine, greedy(t + [5]))[1].usage.cached_tokens for t in talks[-2:]] == [256, 256]
        idle = engine.stats()
        assert (idle.busy_lanes, idle.kv_free_tokens) == (0, idle.kv_capacity_tokens)
        plan = engine.memory_plan()
        assert "host tier" in plan["summary"] and plan["host_tier_bytes"] >= host_pages * page_bytes


@pytest.mark.parametrize(("options", "message"), [
    ({"host_kv_mib": -1}, "host_kv_mib = -1 (must be >= 0"),
    ({"host_state_slots": -3}, "host_state_slots = -3 (must be >= 0"),
    ({"host_kv_mib": 4, "prefix_cache": False}, "need the prefix cache"),
])
def test_host_tier_options_out_of_range_are_refused(tiny_llama_artifact, options, message):
    with pytest.raises(errors.EngineError, match=message.replace("(", r"\(")):
        open_engine(tiny_llama_artifact, **options)


def test_a_host_tier_of_another_size_or_in_use_is_refused(tiny_llama_artifact):
    with open_engine(tiny_llama_artifact, max_context=256, host_kv_mib=2) as engine:
        tier = engine.host_tier
        with pytest.raises(errors.EngineError, match="in use by another engine"):
            open_engine(tiny_llama_artifact, max_context=256, host_kv_mib=2, host_tier=tier)
    with pytest.raises(errors.EngineError, match="holds 2 MiB and 0 state slots, the options ask for 3 and 0"):
        open_engine(tiny_llama_artifact, max_context=256, host_kv_mib=3, host_tier=tier)
    with open_engine(tiny_llama_artifact, max_context=256) as engine:
        assert engine.host_tier is None and "host tier" not in engine.memory_plan()["summary"]
