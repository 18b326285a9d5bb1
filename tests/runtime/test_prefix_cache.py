"""The prefix cache inside the cache manager, over simulated pools: which prefix an admission reuses (block
boundaries, snapshots, the last prompt token always computed), publication, eviction order under a tiny budget, and
random request sequences (hypothesis) against a plain Python model of the index that predicts every hit, every
eviction, every reference count and every free page and slot. Then 10,000 requests with nothing leaked."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ninfer import _engine, _testing, errors

B = 64  # tokens per block


def run(cache, prompt, generated=(), reserve=None, reuse=True, interval_boundaries=True):
    """Admits `prompt`, commits it as the engine would (snapshots where the cache's policy says), then the
    generated tokens one at a time, and releases. Returns the tokens the admission reused."""
    tokens = list(prompt) + list(generated)
    seq, computed = cache.admit(reserve or len(tokens) + 1, list(prompt), reuse=reuse)
    done = computed
    while done < len(prompt):
        nxt = cache.next_snapshot(done, len(prompt))
        done = min(len(prompt), nxt) if nxt > 0 and interval_boundaries else len(prompt)
        cache.commit(seq, tokens, done, cache.snapshot_use(done, len(prompt)))
    for done in range(len(prompt) + 1, len(tokens) + 1):
        cache.commit(seq, tokens, done, cache.snapshot_use(done, len(prompt)))
    cache.release(seq)
    return computed


def test_reuse_stops_before_the_last_prompt_token_on_a_block_boundary_with_a_snapshot():
    rng = np.random.default_rng()
    prompt = [int(t) for t in rng.integers(0, 1000, 200)]
    for n, reused in [(63, 0), (64, 0), (65, 0), (192, 0), (193, 192), (200, 192), (300, 192)]:
        cache = _testing.SimulatedCache(pages=32, state_slots=4)
        assert run(cache, prompt) == 0
        # blocks 0..2, one snapshot: at 192, the last boundary (no interior one below the 4096 interval)
        assert cache.stats()["cached_blocks"] == 3 and cache.stats()["cached_snapshots"] == 1
        assert run(cache, (prompt + [7] * 100)[:n]) == reused, n
    # A 64-token prompt leaves a snapshot at 64: a longer prompt starting with it reuses it, itself never does.
    other = [int(t) for t in rng.integers(1000, 2000, 65)]
    run(cache, other[:64])
    assert [run(cache, other[:n]) for n in (63, 64, 65)] == [0, 0, 64]


def test_a_plain_decoder_reuses_every_block_boundary():
    rng = np.random.default_rng()
    cache = _testing.SimulatedCache(pages=32, state_slots=0)
    prompt = [int(t) for t in rng.integers(0, 1000, 300)]
    run(cache, prompt)
    assert cache.stats()["cached_snapshots"] == 0
    assert [run(cache, prompt[:n]) for n in (64, 65, 129, 300)] == [0, 64, 128, 256]
    assert cache.next_snapshot(0, 300) == -1  # no snapshot positions for the chunks to end on


def test_interval_and_frontier_snapshots():
    rng = np.random.default_rng()
    cache = _testing.SimulatedCache(pages=64, state_slots=8, lanes=1, snapshot_interval=128)
    assert [cache.next_snapshot(b, 1000) for b in (0, 128, 900, 960)] == [128, 256, 960, -1]
    assert [cache.snapshot_use(p, 300) for p in (0, 64, 128, 256, 300, 320, 384)] == [
        "none", "none", "keep", "keep", "none", "frontier", "frontier"]
    prompt = [int(t) for t in rng.integers(0, 1000, 600)]
    answer = [int(t) for t in rng.integers(0, 1000, 200)]
    run(cache, prompt, answer)
    # Interior snapshots at 128..512, the prompt's last boundary 576, and only the latest frontier (768; 640 and
    # 704 were replaced).
    assert cache.stats()["cached_snapshots"] == 6
    edited = prompt[:300] + [1] + prompt[301:]
    assert run(cache, edited) == 256  # the branch reuses the interior snapshot before the edit
    assert run(cache, prompt + answer + [5, 6]) == 768  # the next turn continues from the frontier
    assert run(cache, prompt + answer[:100]) == 576  # an answer dropped (reasoning): the prompt-end snapshot


def test_salts_name_blocks_tokens_alone_do_not():
    cache = _testing.SimulatedCache(pages=16, state_slots=0)
    prompt = list(range(130))
    seq, _ = cache.admit(131, prompt, salts=[7])
    cache.commit(seq, prompt, 128, "none", salts=[7])
    cache.release(seq)
    assert cache.admit(131, prompt)[1] == 0  # same tokens, other media
    seq, computed = cache.admit(131, prompt, salts=[7, 0])
    assert computed == 128
    cache.release(seq)


def test_scoring_publishes_but_does_not_reuse():
    cache = _testing.SimulatedCache(pages=16, state_slots=0)
    prompt = list(range(200))
    seq, computed = cache.admit(200, prompt, reuse=False)
    cache.commit(seq, prompt, 200, "none")
    cache.release(seq)
    assert computed == 0 and cache.admit(200, prompt, reuse=False)[1] == 0 and cache.stats()["lookups"] == 0
    assert cache.admit(200, prompt)[1] == 192  # what it published is found by a lookup


def test_eviction_takes_the_least_recently_used_unheld_leaf_first():
    cache = _testing.SimulatedCache(pages=6, state_slots=0)
    a, b = [1] * 129, [2] * 129  # two blocks each
    run(cache, a, reserve=129)
    run(cache, b, reserve=129)
    assert cache.stats()["free_pages"] == 2 and cache.stats()["cached_blocks"] == 4
    assert run(cache, a, reserve=129) == 128  # a is now the more recent
    held, computed = cache.admit(3 * 64, [3] * 192)  # needs 3 pages: 2 free + b's leaf block
    assert computed == 0 and cache.stats()["evicted_blocks"] == 1
    # Nothing it may evict is enough: refused, nothing taken or evicted.
    before = cache.stats()
    assert cache.admit(64 * 4) is None and cache.stats() == before
    cache.release(held)
    assert run(cache, b, reserve=129) == 64 and run(cache, a, reserve=129) == 128


def test_a_running_sequence_pages_are_never_evicted():
    cache = _testing.SimulatedCache(pages=4, state_slots=0)
    prompt = [9] * 130
    seq, _ = cache.admit(192, prompt)
    cache.commit(seq, prompt, 128, "none")
    assert cache.stats()["cached_blocks"] == 2 and cache.stats()["free_pages"] == 1
    assert cache.admit(128) is None  # the two cached blocks are the running sequence's
    cache.release(seq)
    other, _ = cache.admit(256)  # now they can go
    assert cache.stats()["evicted_blocks"] == 2
    cache.release(other)


def test_concurrent_identical_blocks_share_the_first_published_page():
    cache = _testing.SimulatedCache(pages=8, state_slots=0, lanes=2)
    prompt = [4] * 100
    x, _ = cache.admit(128, prompt)
    y, _ = cache.admit(128, prompt)
    cache.commit(x, prompt, 64, "none")
    own = y.pages[0]
    cache.commit(y, prompt, 64, "none")
    assert y.pages[0] == x.pages[0] and cache.refcount(x.pages[0]) == 3 and cache.refcount(own) == 0
    cache.release(x)
    cache.release(y)
    assert cache.stats()["free_pages"] == 7


def test_commit_beyond_the_tokens_is_refused():
    cache = _testing.SimulatedCache(pages=4, state_slots=0)
    seq, _ = cache.admit(128)
    with pytest.raises(errors.EngineError):
        cache.commit(seq, [1] * 10, 64, "none")
    cache.release(seq)


class Model:
    """The index as plain Python: nodes keyed by their whole prefix, LRU ticks, leaf-first eviction of blocks only
    the index holds, LRU snapshots, one free slot kept per idle lane."""

    def __init__(self, pages: int, slots: int, lanes: int):
        self.refs = [0] * pages
        self.slots, self.lanes = slots, lanes
        self.nodes: dict[tuple, dict] = {}
        self.tick = 0
        self.held = 0
        self.snapshots = 0
        self.serial = 0  # names each snapshot taken (a frontier replaces only the one its sequence took)
        self.evicted_blocks = self.evicted_snapshots = 0

    def free_pages(self) -> int:
        return self.refs.count(0)

    def free_slots(self) -> int:
        return self.slots - self.held - self.snapshots

    def touch(self, key):
        self.tick += 1
        self.nodes[key]["used"] = self.tick

    def children(self, key) -> int:
        return sum(1 for k in self.nodes if len(k) == len(key) + B and k[: len(key)] == key)

    def evict_block(self):
        leaves = [k for k in self.nodes if self.children(k) == 0 and self.refs[self.nodes[k]["page"]] == 1]
        key = min(leaves, key=lambda k: self.nodes[k]["used"])
        node = self.nodes.pop(key)
        self.refs[node["page"]] -= 1
        if node["snap"]:
            self.snapshots -= 1
            self.evicted_snapshots += 1
        self.evicted_blocks += 1

    def evict_snapshot(self, keep=None) -> bool:
        snaps = [k for k in self.nodes if self.nodes[k]["snap"] and k != keep]
        if not snaps:
            return False
        self.nodes[min(snaps, key=lambda k: self.nodes[k]["used"])]["snap"] = 0
        self.snapshots -= 1
        self.evicted_snapshots += 1
        return True

    def cached_path(self, prompt):
        """The prompt's cached blocks from the root (never its last token's), and how many of them end at a
        snapshot-backed depth the admission can reuse."""
        path = []
        for i in range((len(prompt) - 1) // B):
            key = tuple(prompt[: (i + 1) * B])
            if key not in self.nodes:
                break
            path.append(key)
        depth = max((d for d in range(len(path) + 1) if d == 0 or self.nodes[path[d - 1]]["snap"]), default=0)
        return path, depth

    def admit(self, prompt, reserve):
        """Returns (reused tokens, the blocks restored from the host: none, with one tier) or None."""
        path, depth = self.cached_path(prompt)
        reused = path[:depth]
        for k in reused:
            self.refs[self.nodes[k]["page"]] += 1
        keep = reused[-1] if reused else None
        fresh = -(-reserve // B) - depth
        evictable = sum(1 for n in self.nodes.values() if self.refs[n["page"]] == 1)
        slot_ok = self.free_slots() > 0 or self.snapshots > (1 if keep else 0)
        if not slot_ok or fresh > self.free_pages() + evictable:
            for k in reused:
                self.refs[self.nodes[k]["page"]] -= 1
            return None
        while self.free_pages() < fresh:
            self.evict_block()
        if self.free_slots() == 0:
            self.evict_snapshot(keep)
        self.held += 1
        for k in reused:
            self.touch(k)
        return depth * B, []

    def commit(self, seq_pages, tokens, published, computed, use, frontier):
        """Returns the sequence's published block count and its frontier key after the commit."""
        while (published + 1) * B <= computed:
            key = tuple(tokens[: (published + 1) * B])
            if key in self.nodes:
                page = self.nodes[key]["page"]
                if page != seq_pages[published]:
                    self.refs[page] += 1
                    self.refs[seq_pages[published]] -= 1
                    seq_pages[published] = page
            else:
                self.nodes[key] = {"page": seq_pages[published], "used": 0, "snap": 0}
                self.refs[seq_pages[published]] += 1
            self.touch(key)
            published += 1
        if use == "none" or published * B != computed or published == 0:
            return published, frontier
        key = tuple(tokens[:computed])
        if use == "frontier" and frontier is not None and self.nodes[frontier[0]]["snap"] == frontier[1]:
            self.nodes[frontier[0]]["snap"] = 0
            self.snapshots -= 1
        if self.nodes[key]["snap"]:
            return published, frontier
        idle = max(0, self.lanes - self.held)
        if self.free_slots() <= idle and not self.evict_snapshot():
            return published, frontier
        if self.free_slots() <= idle:
            return published, frontier
        self.serial += 1
        self.nodes[key]["snap"] = self.serial
        self.snapshots += 1
        return published, (key, self.serial) if use == "frontier" else frontier

    def release(self, pages):
        for p in pages:
            self.refs[p] -= 1
        self.held -= 1


def check(cache, model: Model, pages: int, live):
    for p in range(pages):
        assert cache.refcount(p) == model.refs[p], p
    s = cache.stats()
    assert s["free_pages"] == model.free_pages()
    assert s["free_state_slots"] == model.free_slots()
    assert s["cached_blocks"] == len(model.nodes) and s["cached_snapshots"] == model.snapshots
    assert (s["evicted_blocks"], s["evicted_snapshots"]) == (model.evicted_blocks, model.evicted_snapshots)
    for entry in live:
        assert entry["seq"].pages == entry["pages"]


# A few shared beginnings, so that requests hit, branch and evict each other.
STEMS = [[int(t) for t in np.random.default_rng(s).integers(0, 50, 400)] for s in range(3)]


@st.composite
def operations(draw):
    ops = []
    for _ in range(draw(st.integers(10, 60))):
        kind = draw(st.sampled_from(["admit", "admit", "step", "step", "step", "release"]))
        stem = draw(st.integers(0, len(STEMS) - 1))
        cut = draw(st.integers(1, 400))
        tail = draw(st.lists(st.integers(0, 50), max_size=80))
        ops.append((kind, stem, cut, tail, draw(st.integers(0, 200)), draw(st.integers(0, 10**6))))
    return ops


def drive(cache, model, pages, ops, live, lanes, slots, check):
    """The random operations of the property tests on both the cache and its model, `check`ed after each."""
    for kind, stem, cut, tail, extra, pick in ops:
        if kind == "admit" and len(live) < min(lanes, max(slots, lanes)):
            prompt = STEMS[stem][:cut] + tail
            reserve = min(len(prompt) + extra, pages * B)
            if reserve < len(prompt):
                continue
            expected = model.admit(prompt, reserve)
            got = cache.admit(reserve, prompt)
            assert (got is None) == (expected is None)
            if got is None:
                continue
            seq, computed = got
            assert computed == expected[0]
            assert len(seq.pages) == -(-reserve // B)
            for key in expected[1]:
                model.placed(key, seq.pages[len(key) // B - 1])
            for p in seq.pages[computed // B:]:  # fresh pages: free until now
                assert model.refs[p] == 0
                model.refs[p] = 1
            gen = [int(t) for t in np.random.default_rng(pick).integers(0, 50, reserve - len(prompt))]
            live.append({"seq": seq, "tokens": prompt + gen, "prompt": len(prompt), "done": computed,
                         "pages": list(seq.pages), "published": computed // B, "frontier": None})
        elif kind == "step" and live:
            e = live[pick % len(live)]
            if e["done"] >= len(e["tokens"]):
                continue
            nxt = cache.next_snapshot(e["done"], e["prompt"])
            end = e["prompt"] if e["done"] < e["prompt"] else e["done"] + 1
            if nxt > 0:
                end = min(end, nxt)
            use = cache.snapshot_use(end, e["prompt"])
            e["published"], e["frontier"] = model.commit(e["pages"], e["tokens"], e["published"], end, use,
                                                         e["frontier"])
            cache.commit(e["seq"], e["tokens"], end, use)
            e["done"] = end
        elif kind == "release" and live:
            e = live.pop(pick % len(live))
            model.release(e["pages"])
            cache.release(e["seq"])
        check(cache, model, pages, live)
    for e in live:
        model.release(e["pages"])
        cache.release(e["seq"])
    live.clear()
    check(cache, model, pages, [])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations(), slots=st.integers(2, 6), pages=st.integers(8, 24))
def test_random_requests_match_the_model_and_account_for_every_page_and_slot(ops, slots, pages):
    lanes = 2
    cache = _testing.SimulatedCache(pages=pages, state_slots=slots, lanes=lanes, snapshot_interval=128)
    model = Model(pages, slots, lanes)
    drive(cache, model, pages, ops, [], lanes, slots, check)
    # What is left is the index's alone: one reference per cached block, every other page free.
    assert cache.stats()["free_pages"] == pages - cache.stats()["cached_blocks"]
    assert cache.stats()["free_state_slots"] == slots - cache.stats()["cached_snapshots"]


def test_ten_thousand_requests_leak_nothing_and_count_exactly():
    rng = np.random.default_rng()
    pages, slots, lanes = 48, 10, 4
    cache = _testing.SimulatedCache(pages=pages, state_slots=slots, lanes=lanes, snapshot_interval=128)
    systems = [[int(t) for t in rng.integers(0, 30000, int(n))] for n in rng.integers(64, 300, 6)]
    live = []
    hits = cached = lookups = 0
    for i in range(10_000):
        if len(live) == lanes or (live and rng.integers(3) == 0):
            seq, tokens, prompt = live.pop(int(rng.integers(len(live))))
            cut = int(rng.integers(prompt, len(tokens) + 1))  # finished or cancelled part-way
            done = seq.published_blocks * B
            while done < cut:
                nxt = cache.next_snapshot(done, prompt)
                done = min(cut, nxt) if nxt > 0 else cut
                cache.commit(seq, tokens, done, cache.snapshot_use(done, prompt))
            cache.release(seq)
            continue
        prompt = systems[int(rng.integers(len(systems)))] + [int(t) for t in rng.integers(0, 30000, int(rng.integers(1, 90)))]
        tokens = prompt + [int(t) for t in rng.integers(0, 30000, int(rng.integers(0, 120)))]
        got = cache.admit(len(tokens) + 1, prompt)
        assert got is not None  # a free lane always fits: the budget is that of every lane at its longest
        seq, computed = got
        lookups += 1
        hits += computed > 0
        cached += computed
        live.append((seq, tokens, len(prompt)))
    for seq, _, _ in live:
        cache.release(seq)
    s = cache.stats()
    assert (s["lookups"], s["hits"], s["cached_tokens"]) == (lookups, hits, cached)
    assert hits > 1000 and s["evicted_blocks"] > 0
    assert s["free_pages"] == pages - s["cached_blocks"] and s["shared_pages"] == 0
    assert s["free_state_slots"] == slots - s["cached_snapshots"]
    for p in range(pages):
        assert cache.refcount(p) in (0, 1)


# -- the host tier --------------------------------------------------------------------------------------------------
# Simulated pages and slots take one byte, so a HostTier(kv_bytes=n, state_slots=m) holds n pages and m snapshots,
# and GDSF's cost / size is 64 per block and the snapshot's position per snapshot.


def tiered(pages, slots, host_pages, host_slots, lanes=1, interval=4096, tier=None):
    tier = tier or _engine.HostTier(kv_bytes=host_pages, state_slots=host_slots)
    return _testing.SimulatedCache(pages=pages, state_slots=slots, lanes=lanes, snapshot_interval=interval,
                                  host_tier=tier), tier


def test_evicted_blocks_and_snapshots_move_to_the_host_and_come_back():
    rng = np.random.default_rng()
    a = [int(t) for t in rng.integers(0, 1000, 200)]
    b = [int(t) for t in rng.integers(1000, 2000, 200)]
    cache, _ = tiered(pages=4, slots=2, host_pages=8, host_slots=4)
    assert run(cache, a, reserve=256) == 0  # 3 blocks of a, a snapshot at 192
    assert cache.take_ops()[-1] == ("copy_state", 0, 1)  # the lane's state into the snapshot slot
    assert run(cache, b, reserve=256) == 0  # needs 4 pages: a's 3 blocks and its snapshot go to the host
    s = cache.stats()
    assert (s["host_blocks"], s["host_snapshots"], s["cached_blocks"], s["cached_snapshots"]) == (3, 1, 3, 1)
    assert (s["host_stored_blocks"], s["host_stored_snapshots"], s["evicted_blocks"]) == (3, 1, 3)
    ops = cache.take_ops()
    assert [op for op, _, _ in ops].count("store_page") == 3 and ("store_state", 1, 0) in ops
    # a again: its 3 blocks come back from the host (b's leaf-first to make room), its state from the host slot.
    assert run(cache, a, reserve=256) == 192
    ops = cache.take_ops()
    loads = [op for op in ops if op[0] == "load_page"]
    assert len(loads) == 3 and ("load_state", 0, 0) in ops
    s = cache.stats()
    assert (s["host_restored_blocks"], s["host_restored_snapshots"]) == (3, 1)
    assert s["host_blocks"] == 3  # now b's (moved out to make room), a's are on the device again
    # b comes back in turn: nothing was lost in either direction.
    assert run(cache, b, reserve=256) == 192


def test_a_full_host_tier_forgets_the_lowest_priority_first():
    """GDSF: a block reused often outranks one stored later but never reused (priority = clock + frequency x 64 /
    1 byte); the clock rises to what it forgot, so later entries start above it."""
    x, y, z, w, v = ([k] * 65 for k in range(1, 6))  # one block each, no state
    cache, _ = tiered(pages=3, slots=0, host_pages=2, host_slots=0)
    run(cache, x, reserve=65)
    for _ in range(3):
        assert run(cache, x, reserve=65) == 64  # x reused three times: frequency 4
    run(cache, y, reserve=65)  # x and y on the device
    run(cache, z, reserve=128)  # x (LRU) -> host, priority 256
    run(cache, w, reserve=128)  # y -> host, priority 64: the host is full
    assert cache.stats()["host_blocks"] == 2 and cache.stats()["host_evicted_blocks"] == 0
    run(cache, v, reserve=128)  # z -> host: y (64) is forgotten, the clock rises to 64, z gets 128
    s = cache.stats()
    assert s["host_evicted_blocks"] == 1 and s["host_blocks"] == 2 and s["host_stored_blocks"] == 3
    assert run(cache, y, reserve=65) == 0  # forgotten
    assert run(cache, x, reserve=65) == 64  # kept: its reuse outweighs z's recency


def test_a_prefix_being_restored_is_never_evicted_from_either_tier():
    """The admission's own host blocks are pinned while it makes room: the device page it needs comes from a block
    that the full host tier cannot take (it could only forget the pinned blocks), so that block is forgotten."""
    a, b = [5] * 129, [6] * 129  # two blocks each
    cache, _ = tiered(pages=4, slots=0, host_pages=2, host_slots=0)
    run(cache, a, reserve=192)
    run(cache, b, reserve=256)  # a -> host (2 pages: full)
    assert cache.stats()["host_blocks"] == 2
    assert run(cache, a, reserve=192) == 128  # 2 restored + 1 fresh page: 2 free, and b's leaf block, forgotten
    s = cache.stats()
    assert (s["host_restored_blocks"], s["host_blocks"], s["host_evicted_blocks"]) == (2, 0, 0)
    assert (s["evicted_blocks"], s["host_stored_blocks"]) == (3, 2)
    assert run(cache, b, reserve=192) == 64  # its first block stayed on the device


def test_a_host_block_published_again_takes_the_device_copy():
    cache, _ = tiered(pages=2, slots=0, host_pages=4, host_slots=0)
    a = [7] * 64
    run(cache, a, reserve=64)
    run(cache, [8] * 10, reserve=128)  # a's block -> host
    assert cache.stats()["host_blocks"] == 1
    seq, computed = cache.admit(128, a + [9], reuse=False)  # computes it afresh and publishes it
    cache.commit(seq, a + [9], 64, "none")
    s = cache.stats()
    assert computed == 0 and s["host_blocks"] == 0 and s["cached_blocks"] == 1
    assert cache.refcount(seq.pages[0]) == 2
    cache.release(seq)


def test_a_closed_cache_leaves_its_index_to_the_host_tier_for_the_next_engine():
    rng = np.random.default_rng()
    chats = [[int(t) for t in rng.integers(0, 1000, 300)] for _ in range(2)]
    cache, tier = tiered(pages=16, slots=4, host_pages=16, host_slots=4, lanes=1)
    for c in chats:
        run(cache, c)
    assert tier.stats()["used_pages"] == 0
    cache.close()
    assert tier.stats()["parked"]
    assert tier.stats()["used_pages"] == 8 and tier.stats()["used_slots"] == 2  # 4 blocks and a snapshot each
    with pytest.raises(errors.EngineError, match="in use"):
        again, _ = tiered(pages=16, slots=4, host_pages=16, host_slots=4, tier=tier)
        tiered(pages=16, slots=4, host_pages=16, host_slots=4, tier=tier)
    del again
    fresh, _ = tiered(pages=16, slots=4, host_pages=16, host_slots=4, tier=tier)
    assert [run(fresh, c + [1]) for c in chats] == [256, 256]  # each from its prompt-end snapshot at 256
    assert fresh.stats()["host_restored_blocks"] == 8 and fresh.stats()["lookups"] == 2


class TieredModel(Model):
    """Model with the host tier: evictions move the block (device leaf, LRU) or snapshot (LRU) to the host when it
    has room, else the host forgets its lowest-priority unpinned leaf block or snapshot (GDSF, ties LRU first) and
    its clock rises to that priority; without room at all the device's entry is forgotten. Admission restores its
    prefix's host blocks to device pages (their ids are read from the admitted sequence)."""

    def __init__(self, pages: int, slots: int, lanes: int, host_pages: int, host_slots: int):
        super().__init__(pages, slots, lanes)
        self.host_pages, self.host_slots = host_pages, host_slots
        self.kv_clock = self.state_clock = 0.0
        self.pinned: set[tuple] = set()
        self.c = dict.fromkeys(("stored_blocks", "stored_snapshots", "host_evicted_blocks",
                                "host_evicted_snapshots", "host_restored_blocks", "host_restored_snapshots"), 0)

    # node fields: page (None: on the host), used, hits, snap (serial, 0: none), snap_host, snap_hits, prio, snap_prio
    def new_node(self, page):
        return {"page": page, "used": 0, "hits": 0, "snap": 0, "snap_host": False, "snap_hits": 0,
                "prio": 0.0, "snap_prio": 0.0}

    def device(self):
        return [k for k, n in self.nodes.items() if n["page"] is not None]

    def host_blocks(self):
        return sum(1 for n in self.nodes.values() if n["page"] is None)

    def device_snaps(self):
        return sum(1 for n in self.nodes.values() if n["snap"] and not n["snap_host"])

    def host_snaps(self):
        return sum(1 for n in self.nodes.values() if n["snap"] and n["snap_host"])

    def free_slots(self) -> int:
        return self.slots - self.held - self.device_snaps() if self.slots else 0

    def kids(self, key):
        return [k for k in self.nodes if len(k) == len(key) + B and k[: len(key)] == key]

    def remove(self, key):
        node = self.nodes.pop(key)
        if node["page"] is not None:
            self.refs[node["page"]] -= 1
        return node

    def host_page(self) -> bool:
        if self.host_pages == 0:
            return False
        if self.host_blocks() == self.host_pages:
            leaves = [k for k, n in self.nodes.items()
                      if n["page"] is None and not self.kids(k) and k not in self.pinned]
            if not leaves:
                return False
            key = min(leaves, key=lambda k: (self.nodes[k]["prio"], self.nodes[k]["used"]))
            self.kv_clock = self.nodes[key]["prio"]
            node = self.remove(key)
            if node["snap"] and node["snap_host"]:
                self.c["host_evicted_snapshots"] += 1
            elif node["snap"]:
                self.evicted_snapshots += 1
            self.c["host_evicted_blocks"] += 1
        return True

    def host_slot(self) -> bool:
        if self.host_slots == 0:
            return False
        if self.host_snaps() == self.host_slots:
            snaps = [k for k, n in self.nodes.items() if n["snap"] and n["snap_host"] and k not in self.pinned]
            if not snaps:
                return False
            key = min(snaps, key=lambda k: (self.nodes[k]["snap_prio"], self.nodes[k]["used"]))
            self.state_clock = self.nodes[key]["snap_prio"]
            self.nodes[key]["snap"] = 0
            self.c["host_evicted_snapshots"] += 1
        return True

    def demote_block(self, key):
        if self.host_page():
            node = self.nodes[key]
            self.refs[node["page"]] -= 1
            node["page"] = None
            node["prio"] = self.kv_clock + (1 + node["hits"]) * B / 1
            self.c["stored_blocks"] += 1
        else:
            assert not self.kids(key)
            if self.remove(key)["snap"]:
                self.evicted_snapshots += 1
        self.evicted_blocks += 1

    def evict_block(self):
        dev = self.device()
        leaves = [k for k in dev if self.refs[self.nodes[k]["page"]] == 1 and k not in self.pinned
                  and not any(self.nodes[c]["page"] is not None for c in self.kids(k))]
        self.demote_block(min(leaves, key=lambda k: self.nodes[k]["used"]))

    def demote_snapshot(self, key):
        self.evicted_snapshots += 1
        node = self.nodes[key]
        if self.host_slot():
            node["snap_host"] = True
            node["snap_prio"] = self.state_clock + (1 + node["snap_hits"]) * len(key) / 1
            self.c["stored_snapshots"] += 1
        else:
            node["snap"] = 0

    def evict_snapshot(self, keep=None) -> bool:
        snaps = [k for k, n in self.nodes.items() if n["snap"] and not n["snap_host"] and k not in self.pinned]
        if not snaps:
            return False
        self.demote_snapshot(min(snaps, key=lambda k: self.nodes[k]["used"]))
        return True

    def admit(self, prompt, reserve):
        """Returns (reused tokens, indices of the blocks restored from the host) or None."""
        path, depth = self.cached_path(prompt)
        if self.slots == 0:
            depth = len(path)
        reused = path[:depth]
        restore = [i for i, k in enumerate(reused) if self.nodes[k]["page"] is None]
        for k in reused:
            if self.nodes[k]["page"] is not None:
                self.refs[self.nodes[k]["page"]] += 1
        self.pinned = set(reused)
        need = -(-reserve // B) - depth + len(restore)
        evictable = sum(1 for n in self.nodes.values() if n["page"] is not None and self.refs[n["page"]] == 1)
        pinned_snap = sum(1 for k in reused if self.nodes[k]["snap"] and not self.nodes[k]["snap_host"])
        slot_ok = self.slots == 0 or self.free_slots() + self.device_snaps() - pinned_snap >= 1
        if not slot_ok or need > self.free_pages() + evictable:
            for k in reused:
                if self.nodes[k]["page"] is not None:
                    self.refs[self.nodes[k]["page"]] -= 1
            self.pinned = set()
            return None
        while self.free_pages() < need:
            self.evict_block()
        self.c["host_restored_blocks"] += len(restore)
        if reused and self.nodes[reused[-1]]["snap_host"]:
            self.c["host_restored_snapshots"] += 1
        for i in restore:
            self.nodes[reused[i]]["page"] = -1  # on the device now; the id comes from the sequence (placed())
        if self.slots and self.free_slots() == 0:
            self.evict_snapshot()
        self.pinned = set()
        self.held += 1
        for k in reused:
            self.nodes[k]["hits"] += 1
            self.touch(k)
        if reused:
            last = self.nodes[reused[-1]]
            last["snap_hits"] += 1
            if last["snap"] and last["snap_host"]:
                last["snap_prio"] = self.state_clock + (1 + last["snap_hits"]) * len(reused[-1]) / 1
        return depth * B, [reused[i] for i in restore]

    def placed(self, key, page):
        """A restored block's device page, as the sequence shows it: the index's and the sequence's."""
        assert self.refs[page] == 0
        self.nodes[key]["page"] = page
        self.refs[page] = 2

    def commit(self, seq_pages, tokens, published, computed, use, frontier):
        while (published + 1) * B <= computed:
            key = tuple(tokens[: (published + 1) * B])
            if key in self.nodes:
                node = self.nodes[key]
                if node["page"] is None:  # on the host: the sequence's copy takes its place
                    node["page"] = seq_pages[published]
                    self.refs[seq_pages[published]] += 1
                elif node["page"] != seq_pages[published]:
                    self.refs[node["page"]] += 1
                    self.refs[seq_pages[published]] -= 1
                    seq_pages[published] = node["page"]
            else:
                self.nodes[key] = self.new_node(seq_pages[published])
                self.refs[seq_pages[published]] += 1
            self.touch(key)
            published += 1
        if use == "none" or published * B != computed or published == 0 or self.slots == 0:
            return published, frontier
        key = tuple(tokens[:computed])
        if use == "frontier" and frontier is not None and self.nodes[frontier[0]]["snap"] == frontier[1]:
            self.nodes[frontier[0]]["snap"] = 0
        if self.nodes[key]["snap"]:
            return published, frontier
        idle = max(0, self.lanes - self.held)
        if self.free_slots() <= idle and not self.evict_snapshot():
            return published, frontier
        if self.free_slots() <= idle:
            return published, frontier
        self.serial += 1
        node = self.nodes[key]
        node["snap"], node["snap_host"], node["snap_hits"] = self.serial, False, 0
        return published, (key, self.serial) if use == "frontier" else frontier

    def detach(self):
        """CacheManager.close: every device block to the host, device leaves LRU first, then every device snapshot."""
        while dev := [k for k in self.device()
                      if not any(self.nodes[c]["page"] is not None for c in self.kids(k))]:
            self.demote_block(min(dev, key=lambda k: self.nodes[k]["used"]))
        while snaps := [k for k, n in self.nodes.items() if n["snap"] and not n["snap_host"]]:
            self.demote_snapshot(min(snaps, key=lambda k: self.nodes[k]["used"]))


def check_tiers(cache, model: TieredModel, pages: int, live):
    for p in range(pages):
        assert cache.refcount(p) == model.refs[p], p
    s = cache.stats()
    assert s["free_pages"] == model.free_pages()
    assert s["free_state_slots"] == model.free_slots()
    assert (s["cached_blocks"], s["host_blocks"]) == (len(model.device()), model.host_blocks())
    assert (s["cached_snapshots"], s["host_snapshots"]) == (model.device_snaps(), model.host_snaps())
    assert (s["evicted_blocks"], s["evicted_snapshots"]) == (model.evicted_blocks, model.evicted_snapshots)
    assert {k: s[f"host_{k}" if not k.startswith("host") else k] for k in model.c} == model.c
    # every host page and slot is a block's or a snapshot's, and none is more than the tier has
    assert model.host_blocks() <= model.host_pages and model.host_snaps() <= model.host_slots
    for entry in live:
        assert entry["seq"].pages == entry["pages"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations(), after=operations(), slots=st.sampled_from([0, 2, 3, 4]), pages=st.integers(7, 14),
       host_pages=st.integers(0, 12), host_slots=st.integers(0, 3))
def test_random_requests_over_both_tiers_match_the_model_and_account_for_every_page_and_slot(
        ops, after, slots, pages, host_pages, host_slots):
    """As the one-tier property test, with a host tier of random size (0 included), then the engine closed (its
    index left to the host tier) and a new one over fresh device pools running more requests from it."""
    lanes = 2
    cache, tier = tiered(pages, slots, host_pages, host_slots, lanes=lanes, interval=128)
    model = TieredModel(pages, slots, lanes, host_pages, host_slots if slots else 0)
    drive(cache, model, pages, ops, [], lanes, slots, check_tiers)
    cache.close()
    model.detach()
    assert model.device() == [] and model.device_snaps() == 0
    held = tier.stats()
    assert (held["used_pages"], held["used_slots"]) == (model.host_blocks(), model.host_snaps())
    assert held["pages"] == host_pages and held["slots"] == (host_slots if slots else 0)
    del cache
    again, _ = tiered(pages, slots, host_pages, host_slots, lanes=lanes, interval=128, tier=tier)
    model.refs = [0] * pages
    model.evicted_blocks = model.evicted_snapshots = 0
    model.c = dict.fromkeys(model.c, 0)
    drive(again, model, pages, after, [], lanes, slots, check_tiers)
    s = again.stats()
    # What is left is the index's alone: one reference per device block, every other page free; host pages and
    # slots in use are exactly the host blocks and snapshots.
    assert s["free_pages"] == pages - s["cached_blocks"]
    assert s["free_state_slots"] == slots - s["cached_snapshots"]
    assert tier.stats()["used_pages"] == s["host_blocks"] and tier.stats()["used_slots"] == s["host_snapshots"]
