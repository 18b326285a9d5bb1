// ninfer._engine.Model: the model and its caches for tests and tools (prefill / decode / batched forward /
// MTP / scoring). The runtime drives the C++ Model directly; this is the thin Python view of it.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "bindings/array_out.h"
#include "bindings/engine_backend.h"
#include "bindings/testing/testing.h"
#include "model/model.h"

namespace nb = nanobind;

namespace ninfer::bindings {

namespace {

using TokenArray = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using HiddenArray = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using PositionArray = nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
// Media rows in place of tokens [first, first + rows) of a prefill: (first, rows [n, hidden]).
using MediaRows = std::vector<std::pair<int64_t, HiddenArray>>;

// One sequence's pages, state slot and length in the Model's pools.
struct SequenceCache {
  std::vector<int32_t> pages;
  int32_t state_slot = -1;
  int64_t length = 0;
};

// Shared by the Python Model and its sequences, so a sequence outliving its Model still returns its pages. The
// pools are this view's own (the engine keeps its own); declared after the model, they are freed before it.
struct ModelState {
  std::shared_ptr<const Artifact> artifact;
  std::unique_ptr<Model> model;
  std::unique_ptr<CachePools> pools;
  const DeviceRuntime* device = nullptr;  // the model's backend when it is a device (CUDA), for op_times()
  int64_t max_context = 0;
  std::mutex mutex;  // one pass at a time; Python threads may share a Model
  ForwardOutput last;
  std::vector<float> mtp_normed;  // the last mtp_logits call's mtp.norm rows

  // Grows `cache` so it holds `total_tokens` (pages, and a zeroed state slot on first use); false, changing
  // nothing, when the pools are short.
  bool reserve(SequenceCache& cache, int64_t total_tokens) {
    if (total_tokens > max_context)
      throw CapacityError("a sequence of " + std::to_string(total_tokens) + " tokens exceeds max_context " +
                          std::to_string(max_context));
    const bool needs_slot = pools->states() && cache.state_slot < 0;
    const int64_t more = std::max<int64_t>(0, kv_pages_for(total_tokens) - int64_t(cache.pages.size()));
    if (more > pools->pages().free() || (needs_slot && pools->slots().free() == 0)) return false;
    pools->pages().acquire(more, cache.pages);
    if (needs_slot) {
      cache.state_slot = pools->slots().acquire();
      pools->zero_state(cache.state_slot);
    }
    return true;
  }
  void release(SequenceCache& cache) {
    pools->pages().release(cache.pages);
    cache.pages.clear();
    if (pools->states()) pools->slots().release(cache.state_slot);
    cache.state_slot = -1;
    cache.length = 0;
  }
  int64_t kv_free_tokens() const { return pools->pages().free() * kKvPageTokens; }
  int32_t free_state_slots() const { return pools->states() ? pools->slots().free() : 0; }
  ForwardItem item(const int32_t* tokens, int64_t n, const SequenceCache& c, bool all_logits) const {
    ForwardItem item;
    item.tokens = tokens;
    item.n_tokens = n;
    item.start = c.length;
    item.pages = c.pages;
    item.state_slot = c.state_slot;
    item.all_logits = all_logits;
    return item;
  }
};

struct PySequence {
  std::shared_ptr<ModelState> owner;
  SequenceCache cache;
  ~PySequence() {
    if (owner) {
      std::lock_guard lock(owner->mutex);
      owner->release(cache);
    }
  }
};

// Grows the sequence's reservation for `n` more tokens or raises CapacityError with the numbers.
void reserve_or_raise(ModelState& state, SequenceCache& cache, int64_t n) {
  if (!state.reserve(cache, cache.length + n))
    throw CapacityError("the KV pool cannot hold " + std::to_string(cache.length + n) + " tokens for this sequence (" +
                        std::to_string(state.kv_free_tokens()) + " free tokens, " +
                        std::to_string(state.free_state_slots()) + " free state slots)");
}

FloatArray rows_of(const std::vector<float>& values, int64_t first_row, int64_t rows, int64_t width) {
  OwnedFloats out = allocate_floats(size_t(rows * width));
  std::copy_n(values.data() + first_row * width, rows * width, out.data);
  return as_array(out, {rows, width});
}

class PyModel {
 public:
  explicit PyModel(std::shared_ptr<ModelState> s) : s_(std::move(s)) {}

  static PyModel open(const std::string& path, int64_t max_context, int64_t kv_capacity, int32_t max_sequences,
                      const std::string& kv_dtype, int32_t threads, int32_t gdn_chunk, bool verify_checksums,
                      const std::string& backend, bool vision, bool op_times) {
    if (max_context <= 0) throw EngineError("max_context must be positive, got " + std::to_string(max_context));
    if (max_sequences <= 0)
      throw EngineError("max_sequences must be positive, got " + std::to_string(max_sequences));
    if (kv_capacity < 0) throw EngineError("kv_capacity must not be negative");
    const KvDtype dtype = parse_kv_dtype(kv_dtype);
    ModelOptions o;
    o.threads = threads;
    o.gdn_chunk = gdn_chunk;
    o.verify_checksums = verify_checksums;
    o.vision = vision;
    auto state = std::make_shared<ModelState>();
    {
      nb::gil_scoped_release release;
      state->artifact = Artifact::open(path, verify_checksums);
      std::unique_ptr<Backend> be = make_backend_named(backend, threads, op_times);
      state->device = dynamic_cast<const DeviceRuntime*>(be.get());
      state->model = Model::load(state->artifact, o, std::move(be));
      CacheCapacity capacity;
      capacity.device_pages = kv_pages_for(kv_capacity > 0 ? kv_capacity : max_context * max_sequences);
      capacity.device_state_slots = max_sequences;
      state->pools =
          std::make_unique<CachePools>(state->model->cache_layout(), capacity, dtype, state->model->memory());
      state->max_context = max_context;
    }
    return PyModel(state);
  }

  // The device time per backend op so far (opened with op_times: CUDA events around each op), else empty.
  nb::dict op_times() const { return op_times_dict(s_->device); }

  nb::object config() const {
    nb::object json = nb::module_::import_("json");
    std::string_view text = s_->artifact->manifest_text();
    return json.attr("loads")(nb::str(text.data(), text.size()))["config"];
  }

  PySequence* new_sequence() { return new PySequence{s_, {}}; }

  FloatArray prefill(PySequence& seq, TokenArray tokens, bool all_logits, const MediaRows& media,
                     std::optional<PositionArray> mrope_positions) {
    const int64_t n = int64_t(tokens.shape(0)), h = s_->model->config().hidden_size;
    if (n == 0) throw EngineError("prefill needs at least one token");
    Item item{tokens.data(), n, &seq, all_logits};
    for (const auto& [first, rows] : media) {
      if (int64_t(rows.shape(1)) != h) throw EngineError("media rows must be [n, " + std::to_string(h) + "]");
      item.embeddings.push_back({first, int64_t(rows.shape(0)), rows.data()});
    }
    if (mrope_positions) {
      if (int64_t(mrope_positions->shape(0)) != n || mrope_positions->shape(1) != 3)
        throw EngineError("mrope_positions must be [" + std::to_string(n) + ", 3]");
      item.mrope_positions = mrope_positions->data();
    }
    run({item});
    return rows_of(s_->last.logits, 0, int64_t(s_->last.logits.size()) / s_->last.vocab, s_->last.vocab);
  }

  FloatArray decode(PySequence& seq, int32_t token, int64_t position_offset) {
    Item item{&token, 1, &seq, false};
    item.position_offset = position_offset;
    run({item});
    return rows_of(s_->last.logits, 0, 1, s_->last.vocab);
  }

  // Speculative decoding's verify pass (ForwardItem::step_slots): `tokens` each run as a decode step from the row
  // before into a state slot of its own; the sequence then keeps the state after row `keep` and its first keep + 1
  // tokens, as the engine keeps the last accepted row. Logits [n, vocab].
  FloatArray verify(PySequence& seq, TokenArray tokens, int64_t keep) {
    const int64_t n = int64_t(tokens.shape(0));
    if (n == 0 || keep < 0 || keep >= n) throw EngineError("verify needs tokens and 0 <= keep < their count");
    if (seq.owner != s_) throw EngineError("a sequence of another Model");
    {
      nb::gil_scoped_release release;
      std::lock_guard lock(s_->mutex);
      ModelState& state = *s_;
      if (seq.cache.state_slot < 0 || !state.pools->states())
        throw EngineError("verify needs a prefilled sequence of a model with linear attention");
      if (state.pools->slots().free() < n) throw EngineError("verify needs " + std::to_string(n) + " free state slots");
      const SequenceCache before = seq.cache;
      std::vector<int32_t> slots;
      for (int64_t i = 0; i < n; ++i) slots.push_back(state.pools->slots().acquire());
      try {
        reserve_or_raise(state, seq.cache, n);
        ForwardItem item = state.item(tokens.data(), n, seq.cache, true);
        item.step_slots = slots;
        state.model->forward({&item, 1}, *state.pools, state.last);
      } catch (...) {
        for (int32_t slot : slots) state.pools->slots().release(slot);
        shrink_to(state, seq.cache, before);
        throw;
      }
      std::swap(seq.cache.state_slot, slots[size_t(keep)]);
      for (int32_t slot : slots) state.pools->slots().release(slot);
      seq.cache.length += keep + 1;
    }
    return rows_of(s_->last.logits, 0, n, s_->last.vocab);
  }

  // The vision tower's outputs [tokens, hidden] for patches [n, patch values] of the (t, h, w) grids.
  FloatArray encode_vision(HiddenArray patches, const std::vector<std::tuple<int32_t, int32_t, int32_t>>& grids) {
    std::vector<VisionGrid> g;
    for (const auto& [t, h, w] : grids) g.push_back({t, h, w});
    std::vector<float> out;
    {
      nb::gil_scoped_release release;
      std::lock_guard lock(s_->mutex);
      s_->model->encode_vision({patches.data(), size_t(patches.shape(0) * patches.shape(1))}, g, out);
    }
    const int64_t width = s_->model->config().hidden_size;
    return rows_of(out, 0, int64_t(out.size()) / width, width);
  }

  std::vector<FloatArray> forward_batch(const std::vector<std::pair<PySequence*, TokenArray>>& items, bool all_logits) {
    std::vector<Item> batch;
    for (const auto& [seq, tokens] : items) batch.push_back({tokens.data(), int64_t(tokens.shape(0)), seq, all_logits});
    run(batch);
    std::vector<FloatArray> out;
    const ForwardOutput& o = s_->last;
    const int64_t total = int64_t(o.logits.size()) / o.vocab;
    for (size_t i = 0; i < batch.size(); ++i) {
      const int64_t end = i + 1 < batch.size() ? o.row_offset[i + 1] : total;
      out.push_back(rows_of(o.logits, o.row_offset[i], end - o.row_offset[i], o.vocab));
    }
    return out;
  }

  FloatArray hidden() const {
    const ForwardOutput& o = s_->last;
    return rows_of(o.hidden, 0, o.hidden_size ? int64_t(o.hidden.size()) / o.hidden_size : 0, o.hidden_size);
  }

  // The MTP calls' item over `seq`: next_tokens at positions start.., their hidden rows checked [n, hidden_size].
  ForwardItem mtp_item(const char* what, PySequence& seq, const HiddenArray& hidden, const TokenArray& next_tokens,
                       int64_t start, bool all_logits) const {
    const int64_t n = int64_t(next_tokens.shape(0)), h = s_->model->config().hidden_size;
    if (int64_t(hidden.shape(0)) != n || int64_t(hidden.shape(1)) != h)
      throw EngineError(std::string(what) + ": hidden must be [" + std::to_string(n) + ", " + std::to_string(h) + "]");
    ForwardItem item = s_->item(next_tokens.data(), n, seq.cache, all_logits);
    item.start = start;
    return item;
  }

  FloatArray mtp_logits(PySequence& seq, HiddenArray hidden, TokenArray next_tokens, int64_t start) {
    const int64_t n = int64_t(next_tokens.shape(0));
    std::vector<float> logits;
    {
      nb::gil_scoped_release release;
      std::lock_guard lock(s_->mutex);
      const ForwardItem item = mtp_item("mtp_logits", seq, hidden, next_tokens, start, true);
      s_->model->mtp_forward(hidden.data(), item, *s_->pools, logits, &s_->mtp_normed);
    }
    return rows_of(logits, 0, n, s_->model->config().vocab_size);
  }

  FloatArray mtp_hidden() const {
    const int64_t h = s_->model->config().hidden_size;
    return rows_of(s_->mtp_normed, 0, int64_t(s_->mtp_normed.size()) / h, h);
  }

  std::vector<int32_t> mtp_drafts(PySequence& seq, HiddenArray hidden, TokenArray next_tokens, int64_t start,
                                  int32_t drafts) {
    std::vector<int32_t> tokens;
    nb::gil_scoped_release release;
    std::lock_guard lock(s_->mutex);
    const ForwardItem item = mtp_item("mtp_drafts", seq, hidden, next_tokens, start, false);
    s_->model->mtp_draft(hidden.data(), item, *s_->pools, drafts, tokens);
    return tokens;
  }

  // Per-token log-probabilities of tokens[1:] given their prefixes, in a temporary sequence, 64 rows of logits at
  // a time (a long text never holds [n, vocab] logits); log-softmax in f64.
  nb::ndarray<nb::numpy, double> score(TokenArray tokens) {
    const int64_t n = int64_t(tokens.shape(0));
    double* result = new double[size_t(std::max<int64_t>(n - 1, 1))];
    nb::capsule owner(result, [](void* p) noexcept { delete[] static_cast<double*>(p); });
    {
      nb::gil_scoped_release release;
      std::lock_guard lock(s_->mutex);
      ModelState& state = *s_;
      SequenceCache cache;
      struct Releaser {
        ModelState& s;
        SequenceCache& c;
        ~Releaser() { s.release(c); }
      } releaser{state, cache};
      if (n > 1) reserve_or_raise(state, cache, n - 1);
      ForwardOutput out;
      for (int64_t begin = 0; begin < n - 1; begin += kKvPageTokens) {
        const int64_t len = std::min<int64_t>(kKvPageTokens, n - 1 - begin);
        const ForwardItem item = state.item(tokens.data() + begin, len, cache, true);
        state.model->forward({&item, 1}, *state.pools, out);
        cache.length += len;
        for (int64_t t = 0; t < len; ++t)
          result[begin + t] =
              log_softmax_at(out.logits.data() + t * out.vocab, out.vocab, tokens.data()[begin + t + 1]);
      }
    }
    size_t shape[1] = {size_t(std::max<int64_t>(n - 1, 0))};
    return nb::ndarray<nb::numpy, double>(result, 1, shape, owner);
  }

  void release(PySequence& seq) {
    std::lock_guard lock(s_->mutex);
    s_->release(seq.cache);
  }

  int64_t kv_free_tokens() const { return s_->kv_free_tokens(); }
  int64_t kv_capacity_tokens() const { return s_->pools->pages().total() * kKvPageTokens; }
  int32_t free_state_slots() const { return s_->free_state_slots(); }
  bool has_mtp() const { return s_->model->has_mtp(); }

 private:
  struct Item {
    const int32_t* tokens;
    int64_t n;
    PySequence* seq;
    bool all_logits;
    std::vector<EmbeddingRows> embeddings = {};
    const int64_t* mrope_positions = nullptr;
    int64_t position_offset = 0;
  };

  static double log_softmax_at(const float* logits, int64_t vocab, int32_t token) {
    if (token < 0 || token >= vocab) return NAN;  // forward() already refused such a token as input
    double max_logit = logits[0];
    for (int64_t i = 1; i < vocab; ++i) max_logit = std::max(max_logit, double(logits[i]));
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - max_logit);
    return double(logits[token]) - max_logit - std::log(sum);
  }

  // Reserve for every item (nothing changes unless all fit), then one forward pass.
  void run(const std::vector<Item>& items) {
    for (const Item& it : items)
      if (it.seq->owner != s_) throw EngineError("a sequence of another Model");
    nb::gil_scoped_release release;
    std::lock_guard lock(s_->mutex);
    ModelState& state = *s_;
    // A refused batch (pool short, bad token id) leaves every sequence as it was: reservations made for it are
    // given back.
    std::vector<SequenceCache> before;
    for (const Item& it : items) before.push_back(it.seq->cache);
    try {
      for (const Item& it : items) reserve_or_raise(state, it.seq->cache, it.n);
      std::vector<ForwardItem> batch;
      for (const Item& it : items) {
        ForwardItem f = state.item(it.tokens, it.n, it.seq->cache, it.all_logits);
        f.embeddings = it.embeddings;
        f.mrope_positions = it.mrope_positions;
        f.position_offset = it.position_offset;
        batch.push_back(f);
      }
      state.model->forward(batch, *state.pools, state.last);
    } catch (...) {
      for (size_t i = 0; i < items.size(); ++i) shrink_to(state, items[i].seq->cache, before[i]);
      throw;
    }
    for (const Item& it : items) it.seq->cache.length += it.n;
  }

  // Gives back pages a failed batch reserved beyond what `before` held.
  static void shrink_to(ModelState& state, SequenceCache& cache, const SequenceCache& before) {
    if (cache.pages.size() == before.pages.size() && cache.state_slot == before.state_slot) return;
    SequenceCache extra;
    extra.pages.assign(cache.pages.begin() + before.pages.size(), cache.pages.end());
    if (before.state_slot < 0) extra.state_slot = cache.state_slot;
    state.release(extra);
    cache.pages.resize(before.pages.size());
    cache.state_slot = before.state_slot;
  }

  std::shared_ptr<ModelState> s_;
};

}  // namespace

void bind_model(nb::module_& m) {
  nb::class_<PySequence>(m, "Sequence", "One sequence's caches (KV pages and GDN state slot) in a Model.")
      .def_prop_ro("length", [](const PySequence& s) { return s.cache.length; })
      .def_prop_ro("pages", [](const PySequence& s) { return s.cache.pages.size(); })
      .def_prop_ro("state_slot", [](const PySequence& s) { return s.cache.state_slot; });

  nb::class_<PyModel>(m, "Model", "The CPU model of an artifact with its KV pool and GDN state slots.")
      .def_static("open", &PyModel::open, nb::arg("path"), nb::arg("max_context") = 4096,
                  nb::arg("kv_capacity") = 0, nb::arg("max_sequences") = 1, nb::arg("kv_dtype") = "bf16",
                  nb::arg("threads") = 0, nb::arg("gdn_chunk") = 64, nb::arg("verify_checksums") = true,
                  nb::arg("backend") = "cpu", nb::arg("vision") = false, nb::arg("op_times") = false)
      .def_prop_ro("config", &PyModel::config, "The manifest's model config as a dict.")
      .def("op_times", &PyModel::op_times,
           "Device microseconds and calls per backend op so far, {op: {calls, device_us}} (open(op_times=True) "
           "on the cuda backend; empty otherwise).")
      .def_prop_ro("has_mtp", &PyModel::has_mtp)
      .def("new_sequence", &PyModel::new_sequence, nb::rv_policy::take_ownership)
      .def("prefill", &PyModel::prefill, nb::arg("seq"), nb::arg("tokens"), nb::arg("all_logits") = false,
           nb::arg("media") = MediaRows{}, nb::arg("mrope_positions") = nb::none(),
           "Appends tokens; f32 logits [rows, vocab] (every token's, or the last one's). media: [(first token, "
           "rows [n, hidden])] replacing those tokens' embeddings; mrope_positions: [n, 3] (t, h, w).")
      .def("decode", &PyModel::decode, nb::arg("seq"), nb::arg("token"), nb::arg("position_offset") = 0,
           "Appends one token (at M-RoPE position length + position_offset); logits [1, vocab].")
      .def("verify", &PyModel::verify, nb::arg("seq"), nb::arg("tokens"), nb::arg("keep"),
           "Speculative decoding's verify pass over tokens (each row a decode step into its own state slot); keeps "
           "the first keep + 1 and the state after them. Logits [n, vocab].")
      .def("encode_vision", &PyModel::encode_vision, nb::arg("patches"), nb::arg("grids"),
           "The vision tower's rows [tokens, hidden] for patches [n, patch values] of [(t, h, w), ...] grids.")
      .def("forward_batch", &PyModel::forward_batch, nb::arg("items"), nb::arg("all_logits") = false,
           "One pass over [(seq, tokens), ...]; a list of logits arrays in item order.")
      .def_prop_ro("hidden", &PyModel::hidden, nb::rv_policy::move,
                   "Final-normed hidden rows [rows, hidden] of the last pass.")
      .def("mtp_logits", &PyModel::mtp_logits, nb::arg("seq"), nb::arg("hidden"), nb::arg("next_tokens"),
           nb::arg("start"), "MTP draft logits [n, vocab] from hidden rows at positions start.. and next tokens.")
      .def_prop_ro("mtp_hidden", &PyModel::mtp_hidden, nb::rv_policy::move,
                   "mtp.norm output rows [n, hidden] of the last mtp_logits call (a next draft step's hidden).")
      .def("mtp_drafts", &PyModel::mtp_drafts, nb::arg("seq"), nb::arg("hidden"), nb::arg("next_tokens"),
           nb::arg("start"), nb::arg("drafts"),
           "The MTP head's greedy drafts after mtp_logits' rows (Model::mtp_draft: argmax and hidden on the backend).")
      .def("score", &PyModel::score, nb::arg("tokens"), "log p(tokens[i+1] | tokens[:i+1]) for each i, f64.")
      .def("release", &PyModel::release, nb::arg("seq"))
      .def("kv_free_tokens", &PyModel::kv_free_tokens)
      .def_prop_ro("kv_capacity_tokens", &PyModel::kv_capacity_tokens)
      .def_prop_ro("free_state_slots", &PyModel::free_state_slots);
}

}  // namespace ninfer::bindings
