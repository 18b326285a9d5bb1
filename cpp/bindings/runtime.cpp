// The runtime's Python face: `_engine.Engine` and the plain structs it takes and returns. Only `def` lines; every
// call that can wait releases the GIL.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings/bindings.h"
#include "bindings/engine_backend.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace nb = nanobind;

namespace ninfer::bindings {
namespace {

using Release = nb::call_guard<nb::gil_scoped_release>;
using MaskArray = nb::ndarray<const uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// Copies the caller's mask (with the GIL held: the array is Python's), then hands it over without the GIL.
bool provide_mask(Engine& engine, uint64_t id, std::optional<MaskArray> mask) {
  std::optional<std::vector<uint32_t>> words;
  if (mask) words.emplace(mask->data(), mask->data() + mask->shape(0));
  nb::gil_scoped_release release;
  return engine.provide_mask(id, std::move(words));
}

using MaskRows = nb::ndarray<const uint32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// A speculative round's masks (MaskRequest::drafts): row i of `masks` for verify row i where constrained[i], that row
// unconstrained where not; len(constrained) rows in all.
bool provide_masks(Engine& engine, uint64_t id, MaskRows masks, const std::vector<bool>& constrained) {
  if (constrained.size() > masks.shape(0))
    throw EngineError("provide_masks: " + std::to_string(constrained.size()) + " rows but " +
                      std::to_string(masks.shape(0)) + " masks");
  std::vector<std::optional<std::vector<uint32_t>>> rows(constrained.size());
  const size_t words = masks.shape(1);
  for (size_t i = 0; i < rows.size(); ++i)
    if (constrained[i]) rows[i].emplace(masks.data() + i * words, masks.data() + (i + 1) * words);
  nb::gil_scoped_release release;
  return engine.provide_masks(id, std::move(rows));
}

using PatchArray = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using PositionArray = nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using MediaItemArgs = std::tuple<PatchArray, std::tuple<int32_t, int32_t, int32_t>, std::vector<int64_t>>;

void set_request_media(GenerationRequest& r, const std::vector<MediaItemArgs>& items, PositionArray positions,
                       int64_t rope_delta) {
  if (positions.shape(1) != 3) throw EngineError("mrope_positions must be [prompt tokens, 3]");
  auto media = std::make_shared<PromptMedia>();
  for (const auto& [patches, grid, starts] : items) {
    MediaInput in;
    in.grid = {std::get<0>(grid), std::get<1>(grid), std::get<2>(grid)};
    in.patches.assign(patches.data(), patches.data() + patches.shape(0) * patches.shape(1));
    in.group_starts = starts;
    media->items.push_back(std::move(in));
  }
  media->mrope_positions.assign(positions.data(), positions.data() + positions.shape(0) * 3);
  media->rope_delta = rope_delta;
  r.media = std::move(media);
}

void bind_structs(nb::module_& m) {
  // llama.cpp's names for the stages (its `samplers` request field).
  nb::enum_<SamplerStage>(m, "SamplerStage")
      .value("penalties", SamplerStage::Penalties)
      .value("dry", SamplerStage::Dry)
      .value("top_n_sigma", SamplerStage::TopNSigma)
      .value("top_k", SamplerStage::TopK)
      .value("typ_p", SamplerStage::TypicalP)
      .value("top_p", SamplerStage::TopP)
      .value("min_p", SamplerStage::MinP)
      .value("xtc", SamplerStage::Xtc)
      .value("temperature", SamplerStage::Temperature);
  m.def("sampler_default_order", &sampler_default_order);
  m.def("sampling_params_validate", &sampling_params_validate);

  nb::class_<SamplingParams>(m, "SamplingParams")
      .def(nb::init<>())
      .def_rw("temperature", &SamplingParams::temperature)
      .def_rw("top_k", &SamplingParams::top_k)
      .def_rw("top_p", &SamplingParams::top_p)
      .def_rw("min_p", &SamplingParams::min_p)
      .def_rw("presence_penalty", &SamplingParams::presence_penalty)
      .def_rw("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_rw("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_rw("penalty_last_n", &SamplingParams::penalty_last_n)
      .def_rw("typical_p", &SamplingParams::typical_p)
      .def_rw("top_n_sigma", &SamplingParams::top_n_sigma)
      .def_rw("dynatemp_range", &SamplingParams::dynatemp_range)
      .def_rw("dynatemp_exponent", &SamplingParams::dynatemp_exponent)
      .def_rw("xtc_probability", &SamplingParams::xtc_probability)
      .def_rw("xtc_threshold", &SamplingParams::xtc_threshold)
      .def_rw("dry_multiplier", &SamplingParams::dry_multiplier)
      .def_rw("dry_base", &SamplingParams::dry_base)
      .def_rw("dry_allowed_length", &SamplingParams::dry_allowed_length)
      .def_rw("dry_penalty_last_n", &SamplingParams::dry_penalty_last_n)
      .def_rw("dry_breakers", &SamplingParams::dry_breakers)
      .def_rw("order", &SamplingParams::order)
      .def_rw("has_seed", &SamplingParams::has_seed)
      .def_rw("seed", &SamplingParams::seed)
      .def_rw("logprobs", &SamplingParams::logprobs)
      .def_rw("top_logprobs", &SamplingParams::top_logprobs);

  nb::class_<GenerationRequest>(m, "GenerationRequest")
      .def(nb::init<>())
      .def_rw("prompt", &GenerationRequest::prompt)
      .def_rw("sampling", &GenerationRequest::sampling)
      .def_rw("max_new_tokens", &GenerationRequest::max_new_tokens)
      .def_rw("stop_token_ids", &GenerationRequest::stop_token_ids)
      .def_rw("constrained", &GenerationRequest::constrained)
      .def_rw("masks_drafts", &GenerationRequest::masks_drafts)
      .def_rw("report_progress", &GenerationRequest::report_progress)
      .def_rw("choices", &GenerationRequest::choices)
      .def("set_media", &set_request_media, nb::arg("items"), nb::arg("mrope_positions"), nb::arg("rope_delta"),
           "Images / videos of the prompt: items [(patches [n, patch values] f32, (t, h, w), [first placeholder "
           "index of each temporal group])], the prompt's M-RoPE positions [tokens, 3] and its rope delta.");

  nb::class_<DecisionQuestion>(m, "DecisionQuestion")
      .def(nb::init<>())
      .def_rw("suffix", &DecisionQuestion::suffix)
      .def_rw("candidates", &DecisionQuestion::candidates);

  nb::class_<DecisionRequest>(m, "DecisionRequest")
      .def(nb::init<>())
      .def_rw("context", &DecisionRequest::context)
      .def_rw("questions", &DecisionRequest::questions);

  nb::class_<EngineOptions>(m, "EngineOptions")
      .def(nb::init<>())
      .def_rw("max_context", &EngineOptions::max_context)
      .def_rw("kv_capacity", &EngineOptions::kv_capacity)
      .def_rw("max_concurrency", &EngineOptions::max_concurrency)
      .def_rw("max_queue", &EngineOptions::max_queue)
      .def_rw("decision_lanes", &EngineOptions::decision_lanes)
      .def_rw("decision_rows", &EngineOptions::decision_rows)
      .def_rw("prefill_chunk", &EngineOptions::prefill_chunk)
      .def_rw("decoding_prefill_chunk", &EngineOptions::decoding_prefill_chunk)
      .def_prop_rw("kv_dtype", [](const EngineOptions& o) { return std::string(kv_dtype_name(o.kv_dtype)); },
                   [](EngineOptions& o, const std::string& name) { o.kv_dtype = parse_kv_dtype(name); })
      .def_rw("threads", &EngineOptions::threads)
      .def_rw("verify_checksums", &EngineOptions::verify_checksums)
      .def_rw("backend", &EngineOptions::backend)
      .def_rw("cuda_graphs", &EngineOptions::cuda_graphs)
      .def_rw("device_sampling", &EngineOptions::device_sampling)
      .def_rw("cuda_gemm", &EngineOptions::cuda_gemm)
      .def_rw("cuda_op_times", &EngineOptions::cuda_op_times)
      .def_rw("spec", &EngineOptions::spec)
      .def_rw("draft_tokens", &EngineOptions::draft_tokens)
            .def_rw("vision", &EngineOptions::vision)
      .def_rw("prefix_cache", &EngineOptions::prefix_cache)
      .def_rw("device_state_slots", &EngineOptions::device_state_slots)
      .def_rw("snapshot_interval", &EngineOptions::snapshot_interval)
      .def_rw("host_kv_mib", &EngineOptions::host_kv_mib)
      .def_rw("host_state_slots", &EngineOptions::host_state_slots);

  nb::class_<Usage>(m, "Usage")
      .def_ro("prompt_tokens", &Usage::prompt_tokens)
      .def_ro("cached_tokens", &Usage::cached_tokens)
      .def_ro("generated_tokens", &Usage::generated_tokens);

  nb::class_<Timings>(m, "Timings")
      .def_ro("queue_s", &Timings::queue_s)
      .def_ro("ttft_s", &Timings::ttft_s)
      .def_ro("prefill_tokens_per_s", &Timings::prefill_tokens_per_s)
      .def_ro("decode_tokens_per_s", &Timings::decode_tokens_per_s)
      .def_ro("total_s", &Timings::total_s)
      .def_ro("draft_n", &Timings::draft_n)
      .def_ro("draft_n_accepted", &Timings::draft_n_accepted);

  nb::class_<PrefillProgress>(m, "PrefillProgress")
      .def_ro("total", &PrefillProgress::total)
      .def_ro("cached", &PrefillProgress::cached)
      .def_ro("processed", &PrefillProgress::processed)
      .def_ro("elapsed_s", &PrefillProgress::elapsed_s);

  nb::class_<EngineEvent>(m, "EngineEvent")
      .def_ro("request_id", &EngineEvent::request_id)
      .def_prop_ro("kind", [](const EngineEvent& e) { return std::string(event_kind_name(e.kind)); })
      .def_ro("progress", &EngineEvent::progress)
      .def_ro("tokens", &EngineEvent::tokens)
      .def_ro("logprobs", &EngineEvent::logprobs)
      .def_ro("top_logprobs", &EngineEvent::top_logprobs)
      .def_prop_ro("finish", [](const EngineEvent& e) { return std::string(finish_reason_name(e.finish)); })
      .def_ro("error_type", &EngineEvent::error_type)
      .def_ro("error_message", &EngineEvent::error_message)
      .def_ro("decision_logprobs", &EngineEvent::decision_logprobs)
      .def_ro("usage", &EngineEvent::usage)
      .def_ro("timings", &EngineEvent::timings);

  nb::class_<MaskRequest>(m, "MaskRequest")
      .def_ro("request_id", &MaskRequest::request_id)
      .def_ro("new_tokens", &MaskRequest::new_tokens)
      .def_ro("drafts", &MaskRequest::drafts);

  nb::class_<EngineNews>(m, "EngineNews")
      .def_ro("events", &EngineNews::events)
      .def_ro("mask_requests", &EngineNews::mask_requests);

  nb::class_<EngineStats>(m, "EngineStats")
      .def_ro("lanes", &EngineStats::lanes)
      .def_ro("busy_lanes", &EngineStats::busy_lanes)
      .def_ro("decision_lanes", &EngineStats::decision_lanes)
      .def_ro("busy_decision_lanes", &EngineStats::busy_decision_lanes)
      .def_ro("queued", &EngineStats::queued)
      .def_ro("kv_capacity_tokens", &EngineStats::kv_capacity_tokens)
      .def_ro("kv_free_tokens", &EngineStats::kv_free_tokens)
      .def_ro("free_state_slots", &EngineStats::free_state_slots)
      .def_ro("total_state_slots", &EngineStats::total_state_slots)
      .def_ro("cached_blocks", &EngineStats::cached_blocks)
      .def_ro("cached_snapshots", &EngineStats::cached_snapshots)
      .def_ro("prefix_lookups", &EngineStats::prefix_lookups)
      .def_ro("prefix_hits", &EngineStats::prefix_hits)
      .def_ro("prefix_cached_tokens", &EngineStats::prefix_cached_tokens)
      .def_ro("prefix_restores", &EngineStats::prefix_restores)
      .def_ro("prefix_evicted_blocks", &EngineStats::prefix_evicted_blocks)
      .def_ro("prefix_evicted_snapshots", &EngineStats::prefix_evicted_snapshots)
      .def_ro("host_blocks", &EngineStats::host_blocks)
      .def_ro("host_snapshots", &EngineStats::host_snapshots)
      .def_ro("host_pages", &EngineStats::host_pages)
      .def_ro("host_slots", &EngineStats::host_slots)
      .def_ro("host_stored_blocks", &EngineStats::host_stored_blocks)
      .def_ro("host_stored_snapshots", &EngineStats::host_stored_snapshots)
      .def_ro("host_evicted_blocks", &EngineStats::host_evicted_blocks)
      .def_ro("host_evicted_snapshots", &EngineStats::host_evicted_snapshots)
      .def_ro("host_restored_blocks", &EngineStats::host_restored_blocks)
      .def_ro("host_restored_snapshots", &EngineStats::host_restored_snapshots)
      .def_ro("requests_finished", &EngineStats::requests_finished)
      .def_ro("tokens_generated", &EngineStats::tokens_generated)
      .def_ro("tokens_prefilled", &EngineStats::tokens_prefilled)
      .def_ro("draft_tokens", &EngineStats::draft_tokens)
      .def_ro("draft_tokens_accepted", &EngineStats::draft_tokens_accepted)
      .def_ro("forward_passes", &EngineStats::forward_passes)
      .def_ro("resident_bytes", &EngineStats::resident_bytes);
}

}  // namespace

// The engine's backend from options.backend (cpu | cuda | auto = cuda when a device is usable, else cpu);
// options.backend is set to the one chosen. Null means the CPU backend, which the model makes with its threads.
std::unique_ptr<Backend> engine_backend(EngineOptions& options) {
  validate_engine_options(options);  // before a backend is made from them (cuda_gemm picks its prefill GEMM)
  if (options.backend == "auto") {
    try {
      std::unique_ptr<Backend> cuda = make_engine_cuda_backend(options);
      options.backend = "cuda";
      return cuda;
    } catch (const EngineError&) {
      options.backend = "cpu";
    }
  }
  if (options.backend == "cpu") return nullptr;
  if (options.backend == "cuda") return make_engine_cuda_backend(options);
  return make_backend_named(options.backend, options.threads);
}

nb::dict memory_plan(const Engine& e) {
  const MemoryPlan& p = e.memory_plan();
  nb::dict d;
  d["backend"] = e.options().backend;
  d["device_total"] = p.device_total;
  d["weights"] = p.weights;
  d["kv_pool"] = p.kv_pool;
  d["kv_capacity_tokens"] = p.kv_capacity_tokens;
  d["kv_bytes_per_token"] = p.kv_page_bytes / kKvPageTokens;
  d["gdn_states"] = p.gdn_states;
  d["workspace"] = p.workspace;
  d["headroom"] = p.headroom;
  d["vision_weights"] = e.vision_weight_bytes();
  d["prefill_chunk"] = e.options().prefill_chunk;  // resolved: never 0 (auto) here
  d["decoding_prefill_chunk"] = e.options().decoding_prefill_chunk;  // resolved
  d["prefix_cache"] = e.options().prefix_cache;
  d["state_slots"] = e.config().linear_attention ? e.options().device_state_slots : 0;  // resolved
  d["snapshot_interval"] = e.options().snapshot_interval;                              // resolved
  const HostTierStats host = e.host_tier() ? e.host_tier()->stats() : HostTierStats{};
  d["host_tier_bytes"] = host.bytes;
  d["host_kv_pages"] = host.pages;
  d["host_kv_page_bytes"] = host.page_bytes;
  d["host_kv_tokens"] = host.pages * kKvPageTokens;
  d["host_state_slots"] = host.slots;
  d["host_state_slot_bytes"] = host.slot_bytes;
  d["graph_bytes"] = e.device() ? e.device()->graph_bytes() : 0;
  d["graphs_captured"] = e.device() ? e.device()->graphs_captured() : 0;
  d["graph_replays"] = e.device() ? e.device()->graph_replays() : 0;
  const GraphPassTimings t = e.device() ? e.device()->graph_timings() : GraphPassTimings{};
  d["graph_captures"] = t.captures;
  d["graph_capture_host_us"] = t.capture_host_us;
  d["graph_replay_host_us"] = t.replay_host_us;
  d["graph_passes_timed"] = t.passes;
  d["graph_device_us"] = t.device_us;
  d["graph_draft_passes"] = t.draft_passes;
  d["graph_draft_device_us"] = t.draft_device_us;
  d["op_times"] = op_times_dict(e.device());  // empty unless the backend times its ops (EngineOptions::cuda_op_times)
  // Graphs are captured as batch sizes first run, so their memory is what the captures so far measured.
  d["summary"] = e.device() ? describe(p) + ", CUDA graphs " + std::to_string(e.device()->graph_bytes() >> 20) +
                                  " MiB measured (batch sizes captured so far: " +
                                  std::to_string(e.device()->graphs_captured()) + ")"
                            : std::string("cpu backend: host memory");
  if (e.vision_weight_bytes())
    d["summary"] = nb::cast<std::string>(d["summary"]) + ", vision tower " +
                   std::to_string((e.vision_weight_bytes() + (1 << 20) - 1) >> 20) + " MiB (mapped from the artifact)";
  const EngineOptions& o = e.options();
  d["summary"] = nb::cast<std::string>(d["summary"]) + "; prefix cache " +
                 (!o.prefix_cache ? std::string("off")
                  : e.config().linear_attention
                      ? "on (" + std::to_string(o.device_state_slots) + " state slots: " +
                            std::to_string(o.max_concurrency) + " for lanes, the rest snapshots; interior snapshot every " +
                            std::to_string(o.snapshot_interval) + " tokens)"
                      : std::string("on (KV blocks)"));
  if (e.host_tier())
    d["summary"] = nb::cast<std::string>(d["summary"]) + "; host tier " + std::to_string(host.bytes >> 20) + " MiB (" +
                   std::to_string(host.pages) + " KV pages = " + std::to_string(host.pages * kKvPageTokens) +
                   " tokens, " + std::to_string(host.slots) + " state slots)";
  return d;
}

void bind_runtime(nb::module_& m) {
  bind_structs(m);
  nb::class_<HostTier>(m, "HostTier",
                       "The prefix cache's host tier: kept by the caller, it carries a model's cache from one engine to "
                       "the next.")
      .def(nb::init<int64_t, int32_t>(), nb::arg("kv_bytes"), nb::arg("state_slots"))
      .def_prop_ro("kv_bytes", &HostTier::kv_bytes)
      .def_prop_ro("state_slots", &HostTier::state_slots)
      .def("stats", [](const HostTier& t) {
        const HostTierStats s = t.stats();
        nb::dict d;
        d["pages"] = s.pages;
        d["used_pages"] = s.used_pages;
        d["page_bytes"] = s.page_bytes;
        d["slots"] = s.slots;
        d["used_slots"] = s.used_slots;
        d["slot_bytes"] = s.slot_bytes;
        d["bytes"] = s.bytes;
        d["parked"] = s.parked;
        return d;
      });
  nb::class_<Engine>(m, "Engine")
      .def("__init__",
           [](Engine* self, const std::string& path, EngineOptions options, std::shared_ptr<HostTier> host_tier) {
             std::unique_ptr<Backend> backend = engine_backend(options);
             new (self) Engine(path, options, std::move(backend), std::move(host_tier));
           },
           nb::arg("path"), nb::arg("options"), nb::arg("host_tier").none() = nb::none(), Release())
      .def_prop_ro("host_tier", [](const Engine& e) { return e.host_tier(); },  // shared: it outlives the engine
                   "The prefix cache's host tier (None without one).")
      .def("memory_plan", &memory_plan, "Device memory plan and CUDA-graph figures (bytes), with a summary line.")
      .def("submit", &Engine::submit, Release())
      .def("cancel", &Engine::cancel, Release())
      .def("next_events", &Engine::next_events, nb::arg("timeout_s"), Release())
      .def("provide_mask", &provide_mask, nb::arg("request_id"), nb::arg("mask").none())
      .def("provide_masks", &provide_masks, nb::arg("request_id"), nb::arg("masks"), nb::arg("constrained"))
      .def("fail_mask", &Engine::fail_mask, nb::arg("request_id"), nb::arg("message"), Release())
      .def("score", &Engine::score, Release())
      .def("submit_decision", &Engine::submit_decision, Release())
      .def("stats", &Engine::stats, Release())
      .def("close", &Engine::close, Release())
      .def_prop_ro("vocab_size", [](const Engine& e) { return e.config().vocab_size; })
      .def_prop_ro("eos_token_ids", [](const Engine& e) { return e.config().eos_token_ids; })
      .def_prop_ro("arch", [](const Engine& e) { return e.config().arch; })
      .def_prop_ro("max_context", [](const Engine& e) { return e.options().max_context; })
      .def_prop_ro("max_concurrency", [](const Engine& e) { return e.options().max_concurrency; });
}

}  // namespace ninfer::bindings
