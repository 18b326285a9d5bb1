// ninfer._engine.SimulatedCache: the runtime's CacheManager over simulated pools (bookkeeping only; the contents'
// copies are recorded, not made), so tests check exact page ids, slot numbers, reference counts and copies.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <tuple>

#include "bindings/bindings.h"
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
  std::vector<ContentsOp> ops;
};

class SimulatedCache {
 public:
  SimulatedCache(int64_t pages, int32_t state_slots)
      : pages_(pages), slots_(state_slots), manager_(pages_, state_slots > 0 ? &slots_ : nullptr, contents_) {}

  std::optional<std::tuple<SequenceCache, int64_t>> admit(int64_t reserve_tokens) {
    std::optional<CacheAdmission> a = manager_.admit(reserve_tokens);
    if (!a) return std::nullopt;
    return std::make_tuple(std::move(a->cache), a->computed);
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
    return d;
  }
  int32_t refcount(int32_t page) const { return pages_.refcount(page); }
  std::vector<ContentsOp> take_ops() { return std::exchange(contents_.ops, {}); }

 private:
  PageTable pages_;
  SlotTable slots_;
  RecordedContents contents_;
  CacheManager manager_;
};

}  // namespace

void bind_cache(nb::module_& m) {
  nb::class_<SequenceCache>(m, "SequenceCache", "One sequence's KV pages and GDN state slot.")
      .def_ro("pages", &SequenceCache::pages)
      .def_ro("state_slot", &SequenceCache::state_slot);

  nb::class_<SimulatedCache>(m, "SimulatedCache", "The cache manager over simulated pools, for tests.")
      .def(nb::init<int64_t, int32_t>(), nb::arg("pages"), nb::arg("state_slots"))
      .def("admit", &SimulatedCache::admit, nb::arg("reserve_tokens"), "(cache, computed) or None")
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
