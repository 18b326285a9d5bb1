// ninfer._engine.SimulatedCache: the runtime's CacheManager over simulated pools (bookkeeping only; the contents'
// copies are recorded, not made), so tests check exact page ids, slot numbers, reference counts and copies.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <limits>
#include <tuple>

#include "bindings/testing/testing.h"
#include "errors.h"
#include "runtime/cache_manager.h"

namespace nb = nanobind;

namespace ninfer::bindings {
namespace {

using ContentsOp = std::tuple<std::string, int32_t, int32_t>;

class RecordedContents final : public CacheContents {
 public:
  void zero_state(int32_t slot) override { ops.emplace_back("zero_state", slot, slot); }
  void copy_state(int32_t from, int32_t to) override { ops.emplace_back("copy_state", from, to); }
  void copy_page(int32_t from, int32_t to) override { ops.emplace_back("copy_page", from, to); }
  void store_page(int32_t page, int32_t host_page) override { ops.emplace_back("store_page", page, host_page); }
  void load_page(int32_t host_page, int32_t page) override { ops.emplace_back("load_page", host_page, page); }
  void store_state(int32_t slot, int32_t host_slot) override { ops.emplace_back("store_state", slot, host_slot); }
  void load_state(int32_t host_slot, int32_t slot) override { ops.emplace_back("load_state", host_slot, slot); }
  void fence_host_copies() override {}
  void wait_host_copies() override {}
  std::vector<ContentsOp> ops;
};

// A simulated page and state slot take one byte: a HostTier(kv_bytes = n, ...) holds n pages.
CacheManagerOptions simulated_options(bool prefix_cache, int32_t lanes, int64_t snapshot_interval, HostTier* host,
                                      bool state) {
  CacheManagerOptions o;
  o.host = host;
  o.page_bytes = 1;
  o.state_bytes = state ? 1 : 0;
  o.prefix_cache = prefix_cache;
  o.model_key = prefix_model_key("simulated", KvDtype::BF16);
  o.lanes = lanes;
  o.snapshots.interval = snapshot_interval;
  return o;
}

SnapshotUse parse_snapshot_use(const std::string& use) {
  if (use == "none") return SnapshotUse::None;
  if (use == "keep") return SnapshotUse::Keep;
  if (use == "frontier") return SnapshotUse::Frontier;
  throw EngineError("unknown snapshot use \"" + use + "\" (none | keep | frontier)");
}

class SimulatedCache {
 public:
  SimulatedCache(int64_t pages, int32_t state_slots, bool prefix_cache, int32_t lanes, int64_t snapshot_interval,
                 std::shared_ptr<HostTier> host)
      : host_(std::move(host)), pages_(pages), slots_(state_slots),
        manager_(pages_, state_slots > 0 ? &slots_ : nullptr, contents_,
                 simulated_options(prefix_cache, lanes, snapshot_interval, host_.get(), state_slots > 0)) {}
  void close() { manager_.close(); }

  std::optional<std::tuple<SequenceCache, int64_t>> admit(int64_t reserve_tokens, const std::vector<int32_t>& prompt,
                                                          const std::vector<uint64_t>& salts, bool reuse) {
    std::optional<CacheAdmission> a = manager_.admit(reserve_tokens, prompt, salts, reuse);
    if (!a) return std::nullopt;
    return std::make_tuple(std::move(a->cache), a->computed);
  }
  void commit(SequenceCache& cache, const std::vector<int32_t>& tokens, int64_t computed, const std::string& use,
              const std::vector<uint64_t>& salts) {
    if (computed > int64_t(tokens.size())) throw EngineError("commit beyond the tokens given");
    manager_.commit(cache, tokens, computed, parse_snapshot_use(use), salts);
  }
  std::string snapshot_use(int64_t position, int64_t prompt_tokens) const {
    switch (manager_.snapshot_use(position, prompt_tokens)) {
      case SnapshotUse::Keep: return "keep";
      case SnapshotUse::Frontier: return "frontier";
      case SnapshotUse::None: break;
    }
    return "none";
  }
  int64_t next_snapshot(int64_t begin, int64_t prompt_tokens) const {
    const int64_t next = manager_.next_snapshot(begin, prompt_tokens);
    return next == std::numeric_limits<int64_t>::max() ? -1 : next;
  }
  void release(SequenceCache& cache) { manager_.release(cache); }
  std::optional<SequenceCache> fork(const SequenceCache& parent, int64_t tokens, int64_t reserve_tokens) {
    return manager_.fork(parent, tokens, reserve_tokens);
  }
  int32_t snapshot(const SequenceCache& cache) { return manager_.snapshot(cache); }
  void restore(int32_t snapshot, const SequenceCache& cache) { manager_.restore(snapshot, cache); }
  void drop_snapshot(int32_t snapshot) { manager_.drop_snapshot(snapshot); }
  nb::dict stats() const {
    const CacheStats s = manager_.stats();
    nb::dict d;
    d["total_pages"] = s.total_pages;
    d["free_pages"] = s.free_pages;
    d["shared_pages"] = s.shared_pages;
    d["total_state_slots"] = s.total_state_slots;
    d["free_state_slots"] = s.free_state_slots;
    d["snapshots"] = s.snapshots;
    d["cached_blocks"] = s.cached_blocks;
    d["cached_snapshots"] = s.cached_snapshots;
    d["lookups"] = s.lookups;
    d["hits"] = s.hits;
    d["cached_tokens"] = s.cached_tokens;
    d["restores"] = s.restores;
    d["evicted_blocks"] = s.evicted_blocks;
    d["evicted_snapshots"] = s.evicted_snapshots;
    d["host_blocks"] = s.host_blocks;
    d["host_snapshots"] = s.host_snapshots;
    d["host_pages"] = s.host_pages;
    d["host_slots"] = s.host_slots;
    d["host_stored_blocks"] = s.host_stored_blocks;
    d["host_stored_snapshots"] = s.host_stored_snapshots;
    d["host_evicted_blocks"] = s.host_evicted_blocks;
    d["host_evicted_snapshots"] = s.host_evicted_snapshots;
    d["host_restored_blocks"] = s.host_restored_blocks;
    d["host_restored_snapshots"] = s.host_restored_snapshots;
    return d;
  }
  int32_t refcount(int32_t page) const { return pages_.refcount(page); }
  std::vector<ContentsOp> take_ops() { return std::exchange(contents_.ops, {}); }

 private:
  std::shared_ptr<HostTier> host_;  // outlives manager_
  PageTable pages_;
  SlotTable slots_;
  RecordedContents contents_;
  CacheManager manager_;
};

}  // namespace

void bind_cache(nb::module_& m) {
  nb::class_<SequenceCache>(m, "SequenceCache", "One sequence's KV pages and GDN state slot.")
      .def_ro("pages", &SequenceCache::pages)
      .def_ro("state_slot", &SequenceCache::state_slot)
      .def_prop_ro("published_blocks", [](const SequenceCache& c) { return c.published.blocks; });

  nb::class_<SimulatedCache>(m, "SimulatedCache", "The cache manager over simulated pools, for tests.")
      .def(nb::init<int64_t, int32_t, bool, int32_t, int64_t, std::shared_ptr<HostTier>>(), nb::arg("pages"),
           nb::arg("state_slots"), nb::arg("prefix_cache") = true, nb::arg("lanes") = 1,
           nb::arg("snapshot_interval") = 4096, nb::arg("host_tier").none() = nb::none(),
           "host_tier: a HostTier(kv_bytes = host pages, state_slots) (simulated pages and slots take one byte)")
      .def("close", &SimulatedCache::close, "Hands the prefix cache to the host tier (CacheManager::close).")
      .def("admit", &SimulatedCache::admit, nb::arg("reserve_tokens"), nb::arg("prompt") = std::vector<int32_t>{},
           nb::arg("salts") = std::vector<uint64_t>{}, nb::arg("reuse") = true, "(cache, computed) or None")
      .def("commit", &SimulatedCache::commit, nb::arg("cache"), nb::arg("tokens"), nb::arg("computed"),
           nb::arg("use") = "none", nb::arg("salts") = std::vector<uint64_t>{},
           "use: none | keep | frontier (CacheManager::commit)")
      .def("snapshot_use", &SimulatedCache::snapshot_use, nb::arg("position"), nb::arg("prompt_tokens"))
      .def("next_snapshot", &SimulatedCache::next_snapshot, nb::arg("begin"), nb::arg("prompt_tokens"),
           "the next prompt position a chunk must end on for a snapshot, or -1")
      .def("release", &SimulatedCache::release, nb::arg("cache"))
      .def("fork", &SimulatedCache::fork, nb::arg("parent"), nb::arg("tokens"), nb::arg("reserve_tokens"))
      .def("snapshot", &SimulatedCache::snapshot, nb::arg("cache"))
      .def("restore", &SimulatedCache::restore, nb::arg("snapshot"), nb::arg("cache"))
      .def("drop_snapshot", &SimulatedCache::drop_snapshot, nb::arg("snapshot"))
      .def("stats", &SimulatedCache::stats)
      .def("refcount", &SimulatedCache::refcount, nb::arg("page"))
      .def("take_ops", &SimulatedCache::take_ops, "The contents' copies since the last call: (op, from, to).");
}

}  // namespace ninfer::bindings
