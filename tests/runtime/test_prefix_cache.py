"""The prefix cache inside the cache manager, over simulated pools: which prefix an admission reuses (block
boundaries, snapshots, the last prompt token always computed), publication, eviction order under a tiny budget, and
random request sequences (hypothesis) against a plain Python model of the index that predicts every hit, every
eviction, every reference count and every free page and slot. Then 10,000 requests with nothing leaked."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer import _engine, errors

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
        cache = _engine.SimulatedCache(pages=32, state_slots=4)
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
    cache = _engine.SimulatedCache(pages=32, state_slots=0)
    prompt = [int(t) for t in rng.integers(0, 1000, 300)]
    run(cache, prompt)
    assert cache.stats()["cached_snapshots"] == 0
    assert [run(cache, prompt[:n]) for n in (64, 65, 129, 300)] == [0, 64, 128, 256]
    assert cache.next_snapshot(0, 300) == -1  # no snapshot positions for the chunks to end on


def test_interval_and_frontier_snapshots():
    rng = np.random.default_rng()
    cache = _engine.SimulatedCache(pages=64, state_slots=8, lanes=1, snapshot_interval=128)
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
    cache = _engine.SimulatedCache(pages=16, state_slots=0)
    prompt = list(range(130))
    seq, _ = cache.admit(131, prompt, salts=[7])
    cache.commit(seq, prompt, 128, "none", salts=[7])
    cache.release(seq)
    assert cache.admit(131, prompt)[1] == 0  # same tokens, other media
    seq, computed = cache.admit(131, prompt, salts=[7, 0])
    assert computed == 128
    cache.release(seq)


def test_scoring_publishes_but_does_not_reuse():
    cache = _engine.SimulatedCache(pages=16, state_slots=0)
    prompt = list(range(200))
    seq, computed = cache.admit(200, prompt, reuse=False)
    cache.commit(seq, prompt, 200, "none")
    cache.release(seq)
    assert computed == 0 and cache.admit(200, prompt, reuse=False)[1] == 0 and cache.stats()["lookups"] == 0


def test_eviction_takes_the_least_recently_used_unheld_leaf_first():
    cache = _engine.SimulatedCache(pages=6, state_slots=0)
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
    cache = _engine.SimulatedCache(pages=4, state_slots=0)
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
    cache = _engine.SimulatedCache(pages=8, state_slots=0, lanes=2)
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
    cache = _engine.SimulatedCache(pages=4, state_slots=0)
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

    def admit(self, prompt, reserve):
        path = []
        for i in range((len(prompt) - 1) // B):
            key = tuple(prompt[: (i + 1) * B])
            if key not in self.nodes:
                break
            path.append(key)
        depth = max((d for d in range(len(path) + 1) if d == 0 or self.nodes[path[d - 1]]["snap"]), default=0)
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
        return depth * B

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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations(), slots=st.integers(2, 6), pages=st.integers(8, 24))
def test_random_requests_match_the_model_and_account_for_every_page_and_slot(ops, slots, pages):
    lanes = 2
    cache = _engine.SimulatedCache(pages=pages, state_slots=slots, lanes=lanes, snapshot_interval=128)
    model = Model(pages, slots, lanes)
    live: list[dict] = []
    for kind, stem, cut, tail, extra, pick in ops:
        if kind == "admit" and len(live) < min(lanes, slots):
            prompt = STEMS[stem][:cut] + tail
            reserve = min(len(prompt) + extra, pages * B)
            if reserve < len(prompt):
                continue
            expected = model.admit(prompt, reserve)
            got = cache.admit(reserve, prompt)
            assert (got is None) == (expected is None)
            if got is not None:
                seq, computed = got
                assert computed == expected
                assert len(seq.pages) == -(-reserve // B)
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
            # The engine's chunking: to the next snapshot position or the end of the prompt, then one at a time.
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
    check(cache, model, pages, [])
    # What is left is the index's alone: one reference per cached block, every other page free.
    assert cache.stats()["free_pages"] == pages - cache.stats()["cached_blocks"]
    assert cache.stats()["free_state_slots"] == slots - cache.stats()["cached_snapshots"]


def test_ten_thousand_requests_leak_nothing_and_count_exactly():
    rng = np.random.default_rng()
    pages, slots, lanes = 48, 10, 4
    cache = _engine.SimulatedCache(pages=pages, state_slots=slots, lanes=lanes, snapshot_interval=128)
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
