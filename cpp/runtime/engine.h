// The engine's thread-safe API and the thread that runs the steps: callers on any thread submit requests, cancel
// them, and drain events from one queue. The engine thread alone runs the step: the scheduler's plan, the step
// executor's pass over the cache pools, the output processor's events.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "cache/cache_pools.h"
#include "cache/kv_dtype.h"
#include "runtime/cache_manager.h"
#include "runtime/device_runtime.h"
#include "runtime/host_tier.h"
#include "runtime/memory_plan.h"
#include "runtime/output_processor.h"
#include "runtime/request.h"
#include "runtime/scheduler.h"
#include "runtime/step_executor.h"

namespace ninfer {

class Model;

struct EngineOptions {
  int64_t max_context = 4096;    // longest sequence, prompt + generation
  // Tokens in the shared KV pool; 0 = max_context * max_concurrency plus the decision lanes' (a context each and
  // kDecisionRowPages per question row); kKvCapacityAuto = the most that fits, at most that (device backends; else
  // as 0).
  int64_t kv_capacity = 0;
  int32_t max_concurrency = 1;   // lanes, 1..8
  int32_t max_queue = 16;        // requests that may wait for a lane; one more is refused with EngineBusyError
  // Lanes that run decision jobs only, 0..8, with their own queue of max_queue places: decisions neither wait
  // behind chat traffic nor take its lanes. 0: decisions are refused.
  int32_t decision_lanes = 1;
  // Questions of one decision job in flight at once (its rows: forks of its context, each with a state slot and
  // pages reserved at admission), 1..64: the rows of a round are one forward pass; more questions run as
  // successive rounds.
  int32_t decision_rows = 16;
  // Tokens per prefill chunk (and the per-step prefill budget), a multiple of 64, or kPrefillChunkAuto: 512 on
  // the CPU backend; on a device backend the largest chunk up to 8192 the memory plan allows
  // (choose_prefill_chunk). Decoding lanes wait at most one chunk's pass, so the chunk trades a long prompt's
  // time to first token (fewer, more efficient passes) against other lanes' worst inter-token gap.
  int64_t prefill_chunk = kPrefillChunkAuto;
  // The prefill chunk (and per-step prefill budget) while some lane is decoding, a multiple of 64 up to
  // prefill_chunk, or kPrefillChunkAuto: prefill_chunk on the CPU backend, at most kDecodingPrefillChunk on a device
  // backend. A long prompt that arrives while other lanes decode then runs in these smaller passes (its decoding
  // neighbours wait one such pass per token, not one of prefill_chunk); alone, it runs in prefill_chunk's.
  int64_t decoding_prefill_chunk = kPrefillChunkAuto;
  KvDtype kv_dtype = KvDtype::BF16;
  int32_t threads = 0;           // 0 = all cores
  bool verify_checksums = true;
  std::string backend = "cpu";   // the backend the engine was given (cpu | cuda), for reports
  bool cuda_graphs = true;       // decode passes as CUDA graphs (device backends)
  bool device_sampling = true;   // device backends sample on the device (false: host logits, the CPU Sampler)
  // The CUDA backend's prefill GEMM: "auto" (the fastest path the weight allows) or "twin" (the f32 twin for every
  // weight: f32 activations, results independent of how rows are batched, as the decode GEMV's are).
  std::string cuda_gemm = "auto";  // auto | twin (f32 everywhere) | streamed (auto, the streamed GEMM at any rows)
  // Exact-prefix reuse (runtime/prefix_cache.h): whole 64-token blocks of KV stay cached after their request and
  // later prompts that start with them reuse them, with a Gated DeltaNet state snapshot where the model has one.
  bool prefix_cache = true;
  // Gated DeltaNet state slots: one per lane, the rest hold prefix-cache snapshots. 0 = auto: with the prefix
  // cache 2 * max_concurrency + 4, without it max_concurrency. Models without linear attention keep none.
  int32_t device_state_slots = 0;
  // Tokens between interior state snapshots of a long prompt (a multiple of 64; a prefill chunk ends at each), so a
  // branch or an edited message reuses the part before it. 0 = auto: max(4096, 2 * prefill_chunk).
  int64_t snapshot_interval = 0;
  // The prefix cache's host tier (runtime/host_tier.h), 0 and 0 = none: MiB of host memory for KV blocks and state
  // snapshots the device evicts (page-locked on the CUDA backend), and where admission restores them from. It
  // outlives the engine when the caller keeps it (Engine::host_tier): a model loaded again resumes from it.
  int64_t host_kv_mib = 0;
  int32_t host_state_slots = 0;
  // The CUDA backend times every op of its eager passes with CUDA events (a profiling mode: DeviceRuntime::op_times).
  bool cuda_op_times = false;
  // Speculative decoding: "none", or "mtp" (the model's MTP head drafts `draft_tokens`, 1..5, per round; the CPU
  // backend only for now). Lossless: see runtime/speculative.h and docs/speculative-decoding.md.
  std::string spec = "none";
  int32_t draft_tokens = 3;
  bool vision = false;           // load the vision tower (images and video in prompts)
};
inline constexpr int64_t kKvCapacityAuto = -1;
// KV pages per decision row in the default pool and the decision lanes' share: a question's suffix of up to three
// pages past its context's partly filled page (a longer suffix leaves room for fewer rows, which then run as rounds).
inline constexpr int64_t kDecisionRowPages = 4;

// EngineError ("invalid engine option: ...") naming the first option out of range. The Engine checks its options;
// whoever makes a backend from them first (the bindings) checks them before that.
void validate_engine_options(const EngineOptions& options);

struct EngineStats {
  int32_t lanes = 0, busy_lanes = 0;  // chat (and scoring) lanes
  int32_t decision_lanes = 0, busy_decision_lanes = 0;
  int64_t queued = 0;
  // Free: what a new request can take now, unused or holding only prefix-cache contents (evicted on demand).
  int64_t kv_capacity_tokens = 0, kv_free_tokens = 0;
  int32_t free_state_slots = 0, total_state_slots = 0;
  // The prefix cache: what it holds now and what it did (counters since the engine opened).
  int64_t cached_blocks = 0, cached_snapshots = 0;
  int64_t prefix_lookups = 0, prefix_hits = 0, prefix_cached_tokens = 0, prefix_restores = 0;
  int64_t prefix_evicted_blocks = 0, prefix_evicted_snapshots = 0;
  // The host tier (CacheStats' host_* fields; all 0 without one).
  int64_t host_blocks = 0, host_snapshots = 0, host_pages = 0, host_slots = 0;
  int64_t host_stored_blocks = 0, host_stored_snapshots = 0, host_evicted_blocks = 0, host_evicted_snapshots = 0;
  int64_t host_restored_blocks = 0, host_restored_snapshots = 0;
  int64_t requests_finished = 0, tokens_generated = 0, tokens_prefilled = 0;
  int64_t draft_tokens = 0, draft_tokens_accepted = 0;  // speculative decoding, over all requests
  int64_t forward_passes = 0;  // passes of the model run (a step's slices, all lanes and decision rows, are one)
  int64_t resident_bytes = 0;  // the process's resident memory
};

class Engine {
 public:
  // Runs on `backend` (the CPU backend with options.threads when null). A backend with its own memory
  // (DeviceRuntime) gets the weights at once and a memory plan; OutOfMemoryError when they do not fit. `host_tier`:
  // the host tier a previous engine of this model left (its size rules), else one is made when the options ask.
  Engine(const std::string& path, const EngineOptions& options, std::unique_ptr<Backend> backend = nullptr,
         std::shared_ptr<HostTier> host_tier = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues; throws EngineBusyError (queue full), CapacityError (can never fit) or EngineError. A
  // request of n choices (GenerationRequest::choices) takes n lanes and n queue places, and ids id .. id + n - 1.
  uint64_t submit(GenerationRequest request);
  // Cancels a queued or running request: its lane and KV are free when its `cancelled` event arrives.
  // False when the id is unknown or already finished.
  bool cancel(uint64_t id);
  // Blocks up to `timeout_s` for at least one event or mask request, then returns all that are ready (maybe none).
  EngineNews next_events(double timeout_s);
  // Answers a constrained request's pending MaskRequest: `words` (token_mask_words(vocab) of them) restrict this
  // step's token; nullopt leaves it unconstrained. The request samples only once answered, so the caller computes
  // masks while the step's forward runs. False when `id` has no pending mask request (finished, cancelled).
  bool provide_mask(uint64_t id, std::optional<std::vector<uint32_t>> words);
  // provide_mask for a speculative round (MaskRequest::drafts): one entry per row from the round's first, 1 ..
  // drafts + 1 of them, entry i the mask after the drafts before row i (nullopt: that row unconstrained). The round
  // verifies only rows.size() - 1 drafts; a row past the first that allows no token is cut off with those after it
  // (the next round's first row then ends the request, as the plain step would).
  bool provide_masks(uint64_t id, std::vector<std::optional<std::vector<uint32_t>>> rows);
  // Answers a pending MaskRequest with a failure: the request ends with an EngineError carrying `message`.
  bool fail_mask(uint64_t id, const std::string& message);
  // Logprob of tokens[i] given tokens[0..i) for i = 1 .. n - 1 (n - 1 values). Queues like a request.
  std::vector<float> score(std::vector<int32_t> tokens);
  // Queues a decision job on the decision lanes; its final event (finish Stop) carries each question's
  // log-softmax over its candidates. Throws like submit (EngineBusyError when the decision queue is full,
  // CapacityError when a question cannot fit, EngineError for a bad request or no decision lanes).
  uint64_t submit_decision(DecisionRequest request);
  EngineStats stats() const;
  const ModelConfig& config() const { return config_; }
  const EngineOptions& options() const { return options_; }
  // The device memory plan (all zero on the CPU backend) and the decode graphs' measured figures.
  const MemoryPlan& memory_plan() const { return memory_plan_; }
  const DeviceRuntime* device() const { return device_; }
  // The prefix cache's host tier (null without one); close() leaves the prefix cache in it.
  const std::shared_ptr<HostTier>& host_tier() const { return host_tier_; }
  // Bytes of the vision tower's weights (EngineOptions::vision; 0 without): read from the mapped artifact.
  int64_t vision_weight_bytes() const;
  // Stops the thread, ends every request with `cancelled`, frees the model. Idempotent.
  void close();

 private:
  void run();
  void run_step();
  StepPlan take_turn(StepPlan plan);
  void apply_cancellations();
  void request_masks(const StepPlan& plan, std::span<const SliceInput> inputs, bool verify);
  bool awaiting_masks(const StepPlan& plan) const;
  std::vector<SliceInput> gather_inputs(const StepPlan& plan);
  StepResult add_media(const StepPlan& plan, std::vector<SliceInput>& inputs);
  void add_sampling(const StepPlan& plan, std::vector<SliceInput>& inputs);
  void publish(EngineEvent event);
  void refresh_stats();
  Job make_job(GenerationRequest request, bool scoring);
  Job make_decision_job(DecisionRequest request);
  uint64_t enqueue(Job job, int64_t& in_flight, int32_t lanes, const char* what);
  void check_fits(int64_t pages, const std::string& what) const;

  EngineOptions options_;
  ModelConfig config_;
  std::unique_ptr<Model> model_;
  DeviceRuntime* device_ = nullptr;  // the model's backend, when it has its own memory
  MemoryPlan memory_plan_;
  std::shared_ptr<HostTier> host_tier_;  // outlives pools_ and cache_
  std::unique_ptr<CachePools> pools_;
  std::unique_ptr<CacheManager> cache_;
  std::unique_ptr<Drafter> drafter_;       // spec "mtp" only
  std::unique_ptr<Scheduler> scheduler_;  // touched only under mu_ (admission, cancel) or by the thread
  std::unique_ptr<StepExecutor> executor_;
  std::unique_ptr<OutputProcessor> outputs_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_, events_cv_, masks_cv_;
  std::deque<EngineEvent> events_;
  std::vector<MaskRequest> mask_requests_;
  std::unordered_set<uint64_t> cancel_requests_;  // running ids to end at the next step boundary
  int64_t decision_share_pages_ = 0;  // KV pages chat admission leaves to the decision lanes
  int64_t in_flight_ = 0, decisions_in_flight_ = 0;  // queued + running (chat and scoring; decisions)
  uint64_t next_id_ = 1;
  bool stopping_ = false, closed_ = false;
  bool prefill_turn_ = false;  // device backends: whose turn it is when decodes and prefills both wait
  EngineStats stats_;
  std::thread thread_;
  // Per slice of the step being gathered: the media rows and M-RoPE positions its ForwardItem points at.
  std::vector<std::vector<EmbeddingRows>> slice_media_rows_;
  std::vector<std::vector<int64_t>> slice_positions_;
};

}  // namespace ninfer
