"""The runtime's cache manager over simulated pools: exact page ids and slots at admission, release, fork (shared
full pages, copied partial page and state) and snapshots, and a random-sequence property test against a plain
Python model of the pools that checks every reference count and that nothing leaks."""

from __future__ import annotations

import numpy as np
import pytest
from ninfer import _testing, errors


def test_admission_takes_pages_lowest_first_and_release_reuses_the_last_freed():
    cache = _testing.SimulatedCache(pages=8, state_slots=2)
    a, computed = cache.admit(130)  # 3 pages
    assert (a.pages, a.state_slot, computed) == ([0, 1, 2], 0, 0)
    assert cache.take_ops() == [("zero_state", 0, 0)]
    b, _ = cache.admit(64)
    assert (b.pages, b.state_slot) == ([3], 1)
    assert cache.admit(1) is None  # no state slot left: nothing taken
    assert cache.stats()["free_pages"] == 4
    cache.release(a)
    assert (a.pages, a.state_slot) == ([], -1)
    c, _ = cache.admit(65)
    assert (c.pages, c.state_slot) == ([2, 1], 0)  # a stack: the most recently freed page first
    assert cache.admit(64 * 7) is None and cache.stats()["free_pages"] == 5


def test_fork_shares_full_pages_copies_the_partial_one_and_the_state():
    cache = _testing.SimulatedCache(pages=16, state_slots=3)
    parent, _ = cache.admit(200)  # pages 0..3
    cache.take_ops()
    child = cache.fork(parent, tokens=150, reserve_tokens=300)  # 2 shared, partial page 2 copied, 5 pages in all
    assert child.pages[:2] == [0, 1] and len(child.pages) == 5 and child.pages[2] not in parent.pages
    assert cache.take_ops() == [("copy_page", 2, child.pages[2]), ("copy_state", 0, child.state_slot)]
    assert [cache.refcount(p) for p in parent.pages] == [2, 2, 1, 1]
    assert cache.stats()["shared_pages"] == 2
    aligned = cache.fork(parent, tokens=128, reserve_tokens=128)  # on a page boundary: no page copy
    assert aligned.pages == [0, 1] and cache.take_ops() == [("copy_state", 0, aligned.state_slot)]
    cache.release(parent)
    assert cache.refcount(0) == 2 and cache.refcount(2) == 0
    cache.release(child)
    cache.release(aligned)
    assert cache.stats()["free_pages"] == 16 and cache.stats()["shared_pages"] == 0


def test_snapshot_uses_a_spare_slot_and_restore_copies_it_back():
    cache = _testing.SimulatedCache(pages=4, state_slots=2)
    lane, _ = cache.admit(64)
    cache.take_ops()
    snap = cache.snapshot(lane)
    assert snap == 1 and cache.take_ops() == [("copy_state", 0, 1)]
    assert cache.snapshot(lane) == -1  # no spare slot
    cache.restore(snap, lane)
    assert cache.take_ops() == [("copy_state", 1, 0)]
    assert cache.stats()["snapshots"] == 1
    cache.drop_snapshot(snap)
    assert cache.stats()["free_state_slots"] == 1 and cache.stats()["snapshots"] == 0


def test_a_model_without_state_keeps_no_slots():
    cache = _testing.SimulatedCache(pages=2, state_slots=0)
    a, _ = cache.admit(64)
    assert a.state_slot == -1 and cache.take_ops() == []
    assert cache.snapshot(a) == -1


def test_a_fork_without_a_free_slot_is_refused_and_misuse_raises():
    cache = _testing.SimulatedCache(pages=2, state_slots=1)
    a, _ = cache.admit(64)
    assert cache.fork(a, 0, 64) is None and cache.stats()["free_pages"] == 1
    with pytest.raises(errors.EngineError):
        cache.fork(a, 65, 200)  # beyond the parent's pages
    cache.release(a)
    cache.release(a)  # already empty: nothing to give back
    with pytest.raises(errors.EngineError):
        cache.drop_snapshot(0)  # a free slot


def test_random_sequences_match_a_simple_model_and_leak_nothing():
    rng = np.random.default_rng()
    pages, slots = 40, 6
    cache = _testing.SimulatedCache(pages=pages, state_slots=slots)
    refs = [0] * pages  # the model: holders per page
    live: list = []
    snapshots: list[int] = []
    for _ in range(3000):
        op = rng.integers(4)
        if op == 0:
            tokens = int(rng.integers(1, 64 * 8))
            got = cache.admit(tokens)
            need = -(-tokens // 64)
            fits = need <= refs.count(0) and len(live) + len(snapshots) < slots
            assert (got is not None) == fits
            if got:
                seq, _ = got
                assert len(seq.pages) == need and all(refs[p] == 0 for p in seq.pages)
                for p in seq.pages:
                    refs[p] = 1
                live.append((seq, need * 64))
        elif op == 1 and live:
            seq, _ = live.pop(int(rng.integers(len(live))))
            for p in seq.pages:
                refs[p] -= 1
            cache.release(seq)
        elif op == 2 and live:
            parent, size = live[int(rng.integers(len(live)))]
            tokens = int(rng.integers(0, size + 1))
            reserve = tokens + int(rng.integers(1, 200))
            child = cache.fork(parent, tokens, reserve)
            shared = tokens // 64
            fits = -(-reserve // 64) - shared <= refs.count(0) and len(live) + len(snapshots) < slots
            assert (child is not None) == fits
            if child:
                assert child.pages[:shared] == parent.pages[:shared]
                for p in child.pages:
                    refs[p] += 1
                live.append((child, -(-reserve // 64) * 64))
        elif op == 3:
            if snapshots and rng.integers(2):
                cache.drop_snapshot(snapshots.pop())
            elif live:
                snap = cache.snapshot(live[0][0])
                assert (snap >= 0) == (len(live) + len(snapshots) < slots)
                if snap >= 0:
                    snapshots.append(snap)
        assert all(cache.refcount(p) == refs[p] for p in range(pages))
        stats = cache.stats()
        assert stats["free_pages"] == refs.count(0)
        assert stats["shared_pages"] == sum(r > 1 for r in refs)
        assert stats["free_state_slots"] == slots - len(live) - len(snapshots)
    for seq, _ in live:
        cache.release(seq)
    for snap in snapshots:
        cache.drop_snapshot(snap)
    stats = cache.stats()
    assert (stats["free_pages"], stats["free_state_slots"], stats["shared_pages"]) == (pages, slots, 0)
