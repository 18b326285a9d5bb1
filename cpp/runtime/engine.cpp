#include "runtime/engine.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "artifact/artifact.h"
#include "errors.h"
#include "model/model.h"

namespace ninfer {
namespace {

// Plain POSIX reads: iostreams here crashed inside a CUDA process where another libstdc++'s locale facets were
// loaded first (a segfault in istream::operator>> under Engine::stats, seen with cuda-gdb on the H200).
int64_t resident_bytes() {
  const int fd = open("/proc/self/statm", O_RDONLY);
  if (fd < 0) return 0;
  char text[128] = {};
  const ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return 0;
  char* end = nullptr;
  std::strtoll(text, &end, 10);                        // total program size
  const long long resident = std::strtoll(end, nullptr, 10);  // resident set, in pages
  return int64_t(resident) * sysconf(_SC_PAGESIZE);
}

// EngineOptions::device_state_slots resolved: every lane's slot, and with the prefix cache a spare one per lane
// (its conversation's frontier) and four more (prompt snapshots).
int32_t resolve_state_slots(const EngineOptions& o) {
  if (o.device_state_slots > 0) return o.device_state_slots;
  return o.prefix_cache ? 2 * o.max_concurrency + 4 : o.max_concurrency;
}

}  // namespace

void validate_engine_options(const EngineOptions& o) {
  const auto fail = [](const std::string& m) { throw EngineError("invalid engine option: " + m); };
  if (o.max_concurrency < 1 || o.max_concurrency > 8)
    fail("max_concurrency = " + std::to_string(o.max_concurrency) + " (must be 1..8)");
  if (o.max_context < 1) fail("max_context = " + std::to_string(o.max_context) + " (must be >= 1)");
  if (o.max_queue < 0) fail("max_queue = " + std::to_string(o.max_queue) + " (must be >= 0)");
  if (o.decision_lanes < 0 || o.decision_lanes > 8)
    fail("decision_lanes = " + std::to_string(o.decision_lanes) + " (must be 0..8)");
  if (o.decision_rows < 1 || o.decision_rows > 64)
    fail("decision_rows = " + std::to_string(o.decision_rows) + " (must be 1..64)");
  if (o.kv_capacity < 0 && o.kv_capacity != kKvCapacityAuto)
    fail("kv_capacity = " + std::to_string(o.kv_capacity) + " (must be >= 0; 0 = max_context * max_concurrency)");
  if (o.cuda_gemm != "auto" && o.cuda_gemm != "twin" && o.cuda_gemm != "streamed")
    fail("cuda_gemm = \"" + o.cuda_gemm + "\" (must be auto, twin or streamed)");
  if (o.spec != "none" && o.spec != "mtp") fail("spec = \"" + o.spec + "\" (must be none or mtp)");
  if (o.spec == "mtp" && (o.draft_tokens < 1 || o.draft_tokens > kMaxDraftTokens))
    fail("draft_tokens = " + std::to_string(o.draft_tokens) + " (must be 1.." + std::to_string(kMaxDraftTokens) + ")");
  if (o.device_state_slots != 0 && o.device_state_slots < o.max_concurrency)
    fail("device_state_slots = " + std::to_string(o.device_state_slots) + " (must be 0 = auto or at least " +
         "max_concurrency = " + std::to_string(o.max_concurrency) + ": one per lane)");
  if (o.snapshot_interval < 0 || o.snapshot_interval % kKvPageTokens)
    fail("snapshot_interval = " + std::to_string(o.snapshot_interval) + " (must be a multiple of 64, or 0 = auto)");
  if (o.host_kv_mib < 0) fail("host_kv_mib = " + std::to_string(o.host_kv_mib) + " (must be >= 0; 0 = no host KV)");
  if (o.host_state_slots < 0)
    fail("host_state_slots = " + std::to_string(o.host_state_slots) + " (must be >= 0; 0 = no host snapshots)");
  if (!o.prefix_cache && (o.host_kv_mib > 0 || o.host_state_slots > 0))
    fail("host_kv_mib / host_state_slots need the prefix cache (prefix_cache is off)");
  if (o.prefill_chunk != kPrefillChunkAuto && (o.prefill_chunk < kKvPageTokens || o.prefill_chunk % kKvPageTokens))
    fail("prefill_chunk = " + std::to_string(o.prefill_chunk) + " (must be a positive multiple of 64, or 0 = auto)");
  if (o.decoding_prefill_chunk != kPrefillChunkAuto &&
      (o.decoding_prefill_chunk < kKvPageTokens || o.decoding_prefill_chunk % kKvPageTokens))
    fail("decoding_prefill_chunk = " + std::to_string(o.decoding_prefill_chunk) +
         " (must be a positive multiple of 64, or 0 = auto)");
  if (o.prefill_chunk != kPrefillChunkAuto && o.decoding_prefill_chunk > o.prefill_chunk)
    fail("decoding_prefill_chunk = " + std::to_string(o.decoding_prefill_chunk) + " is above prefill_chunk = " +
         std::to_string(o.prefill_chunk));
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "none";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "?";
}

const char* event_kind_name(EventKind k) {
  switch (k) {
    case EventKind::Output: return "output";
    case EventKind::Progress: return "progress";
  }
  return "?";
}

Engine::Engine(const std::string& path, const EngineOptions& options, std::unique_ptr<Backend> backend,
               std::shared_ptr<HostTier> host_tier)
    : options_(options), host_tier_(std::move(host_tier)) {
  validate_engine_options(options_);
  options_.device_state_slots = resolve_state_slots(options_);
  ModelOptions mo;
  // Every lane, decision lanes included, gets a context's worth of the KV pool by default, and a decision lane
  // kDecisionRowPages more per question row: a job over a context near max_context still forks all its rows at
  // once (one pass for all its questions) instead of rounds of the one or two rows a context's slack would leave.
  // Decision jobs take their pages from the same pool (they count against the admission budget), with a share
  // chat cannot take.
  const int32_t lanes = options_.max_concurrency + options_.decision_lanes;
  const int64_t decision_row_tokens =
      int64_t(options_.decision_lanes) * options_.decision_rows * kDecisionRowPages * kKvPageTokens;
  const int64_t default_kv_tokens = options_.max_context * lanes + decision_row_tokens;
  int64_t kv_tokens = options_.kv_capacity > 0 ? options_.kv_capacity : default_kv_tokens;
  const int64_t planned_kv_tokens = options_.kv_capacity == 0 ? default_kv_tokens : options_.kv_capacity;
  // State slots: the chat lanes' and the prefix cache's snapshots (device_state_slots), per decision lane one for
  // its context and one per question row, and with speculative decoding K + 1 per chat lane for its verify rows
  // (decision lanes never draft).
  const bool speculative = options_.spec == "mtp";
  const int32_t draft_tokens = speculative ? options_.draft_tokens : 0;
  const int32_t step_slots = speculative ? draft_tokens + 1 : 0;
  const int32_t state_slots = options_.device_state_slots + options_.decision_lanes * (1 + options_.decision_rows) +
                              options_.max_concurrency * step_slots;
  mo.threads = options_.threads;
  mo.verify_checksums = options_.verify_checksums;
  mo.vision = options_.vision;
  std::shared_ptr<const Artifact> artifact = Artifact::open(path, options_.verify_checksums);
  device_ = dynamic_cast<DeviceRuntime*>(backend.get());
  if (device_) {
    const ModelConfig config = ModelConfig::from_json(artifact->config(), path);
    const DeviceMemoryUse use = device_->upload_weights(*artifact);
    if (options_.prefill_chunk == kPrefillChunkAuto)
      options_.prefill_chunk =
          choose_prefill_chunk(config, options_.kv_dtype, planned_kv_tokens, default_kv_tokens, options_.max_context,
                               lanes, state_slots, use.device_total, use.weights, use.free_after_weights);
    memory_plan_ = plan_memory(config, options_.kv_dtype, planned_kv_tokens, default_kv_tokens, options_.max_context,
                               lanes, state_slots, options_.prefill_chunk + lanes, use.device_total, use.weights,
                               use.free_after_weights);
    kv_tokens = memory_plan_.kv_capacity_tokens;
    device_->set_graphs_enabled(options_.cuda_graphs);
    device_->set_max_sequence_tokens(options_.max_context);
    std::fprintf(stderr, "ninfer: %s\n", describe(memory_plan_).c_str());
  }
  if (options_.prefill_chunk == kPrefillChunkAuto) options_.prefill_chunk = kDefaultPrefillChunk;
  if (options_.decoding_prefill_chunk == kPrefillChunkAuto)
    options_.decoding_prefill_chunk =
        device_ ? std::min(options_.prefill_chunk, kDecodingPrefillChunk) : options_.prefill_chunk;
  // (an auto prefill_chunk may have come out below a given decoding chunk)
  options_.decoding_prefill_chunk = std::min(options_.decoding_prefill_chunk, options_.prefill_chunk);
  if (options_.snapshot_interval == 0) options_.snapshot_interval = std::max<int64_t>(4096, 2 * options_.prefill_chunk);
  CacheManagerOptions cache_options;
  cache_options.prefix_cache = options_.prefix_cache;
  cache_options.model_key = prefix_model_key(artifact->manifest_text(), options_.kv_dtype);
  cache_options.lanes = lanes;  // decision lanes' contexts too (their rows' slots are reserved at admission)
  cache_options.snapshots.interval = options_.snapshot_interval;
  cache_options.step_slots = step_slots;
  model_ = Model::load(std::move(artifact), mo, std::move(backend));
  config_ = model_->config();
  if (speculative && !model_->has_mtp())
    throw EngineError("invalid engine option: spec = \"mtp\" but " + path + " has no MTP head");
  CacheCapacity capacity;
  capacity.device_pages = kv_pages_for(kv_tokens);
  capacity.device_state_slots = state_slots;
  pools_ = std::make_unique<CachePools>(model_->cache_layout(), capacity, options_.kv_dtype, model_->memory());
  if (host_tier_ && (host_tier_->kv_bytes() != options_.host_kv_mib << 20 ||
                     host_tier_->state_slots() != options_.host_state_slots))
    throw EngineError("invalid engine option: the host tier given holds " + std::to_string(host_tier_->kv_bytes() >> 20) +
                      " MiB and " + std::to_string(host_tier_->state_slots()) + " state slots, the options ask for " +
                      std::to_string(options_.host_kv_mib) + " and " + std::to_string(options_.host_state_slots));
  if (!host_tier_ && options_.prefix_cache && (options_.host_kv_mib > 0 || options_.host_state_slots > 0))
    host_tier_ = std::make_shared<HostTier>(options_.host_kv_mib << 20, options_.host_state_slots);
  if (host_tier_ && options_.prefix_cache) {
    cache_options.host = host_tier_.get();
    cache_options.host_memory = &model_->memory();
    cache_options.page_bytes = size_t(pools_->kv().page_bytes());
    cache_options.state_bytes = pools_->state_bytes();
  }
  cache_ = std::make_unique<CacheManager>(pools_->pages(), pools_->states() ? &pools_->slots() : nullptr, *pools_,
                                          cache_options);
  if (cache_options.host) {
    pools_->set_host(host_tier_->storage());
    const HostTierStats h = host_tier_->stats();
    std::fprintf(stderr, "ninfer: host tier %lld MiB: %lld KV pages (%lld tokens), %d state slots of %.1f MiB%s\n",
                 (long long)(h.bytes >> 20), (long long)h.pages, (long long)(h.pages * kKvPageTokens), h.slots,
                 double(h.slot_bytes) / double(1 << 20), h.used_pages + h.used_slots ? " (resuming what it held)" : "");
  }
  if (speculative) drafter_ = std::make_unique<Drafter>(*model_, *pools_);
  // The decision lanes' share of the pool: a context and its rows' pages each, less whatever leaves one context's
  // room for chat.
  const int64_t context_pages = kv_pages_for(options_.max_context);
  decision_share_pages_ = std::clamp<int64_t>(
      options_.decision_lanes * context_pages + decision_row_tokens / kKvPageTokens, 0,
      capacity.device_pages - context_pages);
  scheduler_ = std::make_unique<Scheduler>(options_.max_concurrency, options_.decision_lanes, options_.prefill_chunk,
                                           decision_share_pages_, *cache_, draft_tokens,
                                           device_ ? device_->decode_path_rows() : 0,
                                           options_.decoding_prefill_chunk);
  executor_ = std::make_unique<StepExecutor>(*model_, *pools_, device_, options_.device_sampling, drafter_.get());
  outputs_ = std::make_unique<OutputProcessor>(
      *scheduler_, [this](EngineEvent ev) { publish(std::move(ev)); }, [this](JobOutput output) {
        --(output == JobOutput::Decide ? decisions_in_flight_ : in_flight_);
        refresh_stats();  // before the final event: whoever sees it sees the lane and its cache free
      });
  refresh_stats();
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() { close(); }

int64_t Engine::vision_weight_bytes() const {
  return model_ && model_->vision() ? model_->vision()->weight_bytes() : 0;
}

Job Engine::make_job(GenerationRequest request, bool scoring) {
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  if (n == 0) throw EngineError("the prompt is empty");
  if (scoring && n < 2) throw EngineError("scoring needs at least 2 tokens, got " + std::to_string(n));
  for (int64_t i = 0; i < n; ++i)
    if (request.prompt[i] < 0 || request.prompt[i] >= config_.vocab_size)
      throw EngineError("token id " + std::to_string(request.prompt[i]) + " at position " + std::to_string(i) +
                        " is outside the vocabulary [0, " + std::to_string(config_.vocab_size) + ")");
  if (n > options_.max_context)
    throw CapacityError("the prompt has " + std::to_string(n) + " tokens; max_context is " +
                        std::to_string(options_.max_context));
  if (!scoring) {
    if (request.max_new_tokens < 1)
      throw EngineError("invalid max_new_tokens = " + std::to_string(request.max_new_tokens) + " (must be >= 1)");
    sampling_params_validate(request.sampling);
    for (int32_t t : request.stop_token_ids)
      if (t < 0 || t >= config_.vocab_size)
        throw EngineError("stop token id " + std::to_string(t) + " is outside the vocabulary");
    if (request.choices < 1) throw EngineError("invalid choices = " + std::to_string(request.choices) + " (must be >= 1)");
    if (request.choices > options_.max_concurrency)
      throw CapacityError("n = " + std::to_string(request.choices) + " choices need a lane each; this engine has " +
                          std::to_string(options_.max_concurrency) + " (max_concurrency)");
  } else if (request.choices != 1) {
    throw EngineError("scoring takes one choice");
  }
  if (request.media)
    check_prompt_media(*request.media, request.prompt, model_->vision() ? &model_->vision()->config() : nullptr);
  Job job;
  job.output = scoring ? JobOutput::PromptLogprobs : JobOutput::Generate;
  job.reservation = scoring ? n : std::min(n + request.max_new_tokens, options_.max_context);
  // Each choice after the first shares the full pages of the prompt but its last token (Scheduler::start_forks).
  job.fork_pages = kv_pages_for(job.reservation) - (n - 1) / kKvPageTokens;
  check_fits(kv_pages_for(job.reservation) + (request.choices - 1) * job.fork_pages,
             std::to_string(job.reservation) + " KV tokens (prompt " + std::to_string(n) + " + max_new_tokens " +
                 std::to_string(request.max_new_tokens) + ", capped at max_context " +
                 std::to_string(options_.max_context) + ", in pages of 64)" +
                 (request.choices > 1 ? " for each of " + std::to_string(request.choices) +
                                            " choices, the prompt's full pages shared"
                                      : std::string()));
  job.request = std::move(request);
  job.submitted = Clock::now();
  return job;
}

void Engine::check_fits(int64_t pages, const std::string& what) const {
  const int64_t capacity = pools_->pages().total() * kKvPageTokens;
  if (pages * kKvPageTokens > capacity)
    throw CapacityError("the request needs " + what + " but the KV pool holds " + std::to_string(capacity));
}

Job Engine::make_decision_job(DecisionRequest request) {
  if (options_.decision_lanes == 0) throw EngineError("decisions are off (decision_lanes = 0)");
  if (request.questions.empty()) throw EngineError("a decision needs at least one question");
  GenerationRequest context;
  context.prompt = request.context;
  Job job = make_job(std::move(context), true);  // checks the context's tokens and length
  const int64_t n = static_cast<int64_t>(request.context.size());
  int64_t longest = 0;
  for (size_t q = 0; q < request.questions.size(); ++q) {
    const DecisionQuestion& question = request.questions[q];
    const std::string which = "question " + std::to_string(q);
    if (question.suffix.empty() || question.candidates.empty())
      throw EngineError(which + " needs a suffix and at least one candidate token");
    for (const std::vector<int32_t>* ids : {&question.suffix, &question.candidates})
      for (int32_t t : *ids)
        if (t < 0 || t >= config_.vocab_size)
          throw EngineError(which + ": token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                            std::to_string(config_.vocab_size) + ")");
    const int64_t total = n + static_cast<int64_t>(question.suffix.size());
    if (total > options_.max_context)
      throw CapacityError(which + " has " + std::to_string(total) + " tokens with the context; max_context is " +
                          std::to_string(options_.max_context));
    longest = std::max(longest, static_cast<int64_t>(question.suffix.size()));
  }
  job.output = JobOutput::Decide;
  // As many rows as asked for, fewer when they would not fit one decision lane's share of the pool.
  const int64_t row_pages = kv_pages_for(n + longest) - n / kKvPageTokens;
  const int64_t lane_share = decision_share_pages_ / options_.decision_lanes;
  job.decision_rows = std::min<int32_t>(options_.decision_rows, static_cast<int32_t>(request.questions.size()));
  while (job.decision_rows > 1 && kv_pages_for(n) + job.decision_rows * row_pages > lane_share) --job.decision_rows;
  job.decision_pages = job.decision_rows * row_pages;
  check_fits(kv_pages_for(n) + job.decision_pages,
             std::to_string(n) + " context tokens and " + std::to_string(job.decision_rows) + " rows of up to " +
                 std::to_string(longest) + " question tokens (in pages of 64)");
  job.decision = std::move(request);
  return job;
}

// Queues a made job within its kind's bound (lanes + queue places): EngineBusyError past it. Called locked.
// A job of n choices counts n (it takes n lanes) and n ids.
uint64_t Engine::enqueue(Job job, int64_t& in_flight, int32_t lanes, const char* what) {
  const int32_t choices = job.request.choices;
  if (in_flight + choices > lanes + options_.max_queue)
    throw EngineBusyError("the engine is busy: all " + std::to_string(lanes) + " " + what + " and " +
                          std::to_string(options_.max_queue) + " queue places are taken" +
                          (choices > 1 ? " (or fewer than the " + std::to_string(choices) + " the choices need)"
                                       : std::string()) +
                          "; retry later");
  job.id = next_id_;
  next_id_ += uint64_t(choices);
  const uint64_t id = job.id;
  scheduler_->enqueue(std::move(job));
  in_flight += choices;
  stats_.queued = scheduler_->num_queued();
  work_cv_.notify_one();
  return id;
}

uint64_t Engine::submit_decision(DecisionRequest request) {
  std::unique_lock lock(mu_);
  if (closed_) throw EngineError("the engine is closed");
  return enqueue(make_decision_job(std::move(request)), decisions_in_flight_, options_.decision_lanes,
                 "decision lanes");
}

uint64_t Engine::submit(GenerationRequest request) {
  // Hashing the media's pixels takes a while: before the lock, which the scheduler thread takes every step.
  std::vector<uint64_t> salts;
  if (request.media && config_.vision)
    salts = media_block_salts(*request.media, int64_t(request.prompt.size()), config_.vision->merge_unit());
  std::unique_lock lock(mu_);
  if (closed_) throw EngineError("the engine is closed");
  Job job = make_job(std::move(request), false);
  job.block_salts = std::move(salts);
  return enqueue(std::move(job), in_flight_, options_.max_concurrency, "lanes");
}

std::vector<float> Engine::score(std::vector<int32_t> tokens) {
  std::future<std::vector<float>> result;
  {
    std::unique_lock lock(mu_);
    if (closed_) throw EngineError("the engine is closed");
    GenerationRequest request;
    request.prompt = std::move(tokens);
    Job job = make_job(std::move(request), true);
    if (in_flight_ >= options_.max_concurrency + options_.max_queue)
      throw EngineBusyError("the engine is busy: all lanes and queue places are taken; retry later");
    job.id = next_id_++;
    job.score_result = std::make_shared<std::promise<std::vector<float>>>();
    result = job.score_result->get_future();
    scheduler_->enqueue(std::move(job));
    ++in_flight_;
    work_cv_.notify_one();
  }
  return result.get();
}

bool Engine::cancel(uint64_t id) {
  std::unique_lock lock(mu_);
  // A queued job of n choices leaves the queue whole, whichever of its ids is cancelled.
  if (std::optional<Job> job = scheduler_ ? scheduler_->remove_queued(id) : std::nullopt) {
    (job->output == JobOutput::Decide ? decisions_in_flight_ : in_flight_) -= job->request.choices;
    stats_.queued = scheduler_->num_queued();
    for (int32_t k = 0; k < job->request.choices; ++k) {
      EngineEvent ev;
      ev.request_id = job->id + uint64_t(k);
      ev.finish = FinishReason::Cancelled;
      events_.push_back(std::move(ev));
    }
    events_cv_.notify_all();
    return true;
  }
  if (!scheduler_ || scheduler_->lane_of(id) < 0) return false;
  cancel_requests_.insert(id);
  work_cv_.notify_one();
  masks_cv_.notify_all();  // a step waiting for this request's mask stops waiting
  return true;
}

EngineNews Engine::next_events(double timeout_s) {
  std::unique_lock lock(mu_);
  events_cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, timeout_s)),
                      [&] { return !events_.empty() || !mask_requests_.empty() || closed_; });
  EngineNews news;
  news.events.assign(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  news.mask_requests.swap(mask_requests_);
  return news;
}

bool Engine::provide_mask(uint64_t id, std::optional<std::vector<uint32_t>> words) {
  std::vector<std::optional<std::vector<uint32_t>>> rows;
  rows.push_back(std::move(words));
  return provide_masks(id, std::move(rows));
}

bool Engine::provide_masks(uint64_t id, std::vector<std::optional<std::vector<uint32_t>>> rows) {
  std::unique_lock lock(mu_);
  const int32_t index = scheduler_ ? scheduler_->lane_of(id) : -1;
  if (index < 0 || !scheduler_->lane(index)->mask.pending) return false;
  LaneMask& mask = scheduler_->lane(index)->mask;
  const int64_t expected = token_mask_words(config_.vocab_size);
  if (rows.empty() || rows.size() > mask.row_limit)
    throw EngineError("a mask request of " + std::to_string(mask.row_limit) + " rows was answered with " +
                      std::to_string(rows.size()) + " masks");
  for (const auto& words : rows)
    if (words && static_cast<int64_t>(words->size()) != expected)
      throw EngineError("a token mask has " + std::to_string(words->size()) + " words; this model's vocabulary of " +
                        std::to_string(config_.vocab_size) + " needs " + std::to_string(expected));
  mask.pending = false;
  mask.rows.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const bool none = rows[i] && token_mask_allowed(*rows[i], config_.vocab_size) == 0;
    if (none && i > 0) {  // that row cannot be drawn: the round stops before it
      mask.rows.resize(i);
      break;
    }
    if (i == 0) mask.allows_none = none;
    if (rows[i])
      mask.rows[i] = std::move(*rows[i]);
    else
      mask.rows[i].clear();
  }
  masks_cv_.notify_all();
  return true;
}

bool Engine::fail_mask(uint64_t id, const std::string& message) {
  std::unique_lock lock(mu_);
  const int32_t index = scheduler_ ? scheduler_->lane_of(id) : -1;
  if (index < 0 || !scheduler_->lane(index)->mask.pending) return false;
  LaneMask& mask = scheduler_->lane(index)->mask;
  mask.pending = false;
  mask.error = message.empty() ? std::string("the token mask could not be computed") : message;
  masks_cv_.notify_all();
  return true;
}

EngineStats Engine::stats() const {
  std::unique_lock lock(mu_);
  EngineStats s = stats_;
  s.resident_bytes = resident_bytes();
  if (cache_) {  // counted here, not every step: it walks the cached blocks
    const auto [pages, slots] = cache_->reclaimable();
    s.kv_free_tokens = pages * kKvPageTokens;
    s.free_state_slots = slots;
  }
  return s;
}

void Engine::close() {
  {
    std::unique_lock lock(mu_);
    if (closed_) return;
    stopping_ = true;
    work_cv_.notify_all();
    masks_cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  std::unique_lock lock(mu_);
  for (int32_t i = 0; i < scheduler_->num_lanes(); ++i)
    if (scheduler_->lane(i)) outputs_->end_lane(i, FinishReason::Cancelled);
  for (const Job* job : scheduler_->queued()) {
    if (job->score_result) job->score_result->set_exception(std::make_exception_ptr(EngineError("the engine closed")));
    for (int32_t k = 0; k < job->request.choices; ++k) {
      EngineEvent ev;
      ev.request_id = job->id + uint64_t(k);
      ev.finish = FinishReason::Cancelled;
      events_.push_back(std::move(ev));
    }
  }
  // The pools live in the backend's memory: they go before the model that owns the backend.
  outputs_.reset();
  executor_.reset();
  drafter_.reset();
  scheduler_.reset();
  cache_.reset();  // (with a host tier: the prefix cache moves there, as far as it has room)
  pools_.reset();
  model_.reset();
  in_flight_ = decisions_in_flight_ = 0;
  closed_ = true;
  events_cv_.notify_all();
}

void Engine::run() {
  while (true) {
    {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, [&] {
        return stopping_ || !cancel_requests_.empty() || !scheduler_->idle() || scheduler_->num_queued() > 0;
      });
      if (stopping_) return;
    }
    run_step();
  }
}

void Engine::publish(EngineEvent event) {
  events_.push_back(std::move(event));
  events_cv_.notify_all();
}

void Engine::refresh_stats() {
  stats_.lanes = scheduler_->num_chat_lanes();
  stats_.busy_lanes = scheduler_->num_busy_chat_lanes();
  stats_.decision_lanes = scheduler_->num_lanes() - scheduler_->num_chat_lanes();
  stats_.busy_decision_lanes = scheduler_->num_busy_lanes() - stats_.busy_lanes;
  stats_.queued = scheduler_->num_queued();
  const CacheStats c = cache_->stats();
  stats_.kv_capacity_tokens = c.total_pages * kKvPageTokens;
  stats_.kv_free_tokens = c.free_pages * kKvPageTokens;
  stats_.free_state_slots = c.free_state_slots;
  stats_.total_state_slots = c.total_state_slots;
  stats_.cached_blocks = c.cached_blocks;
  stats_.cached_snapshots = c.cached_snapshots;
  stats_.prefix_lookups = c.lookups;
  stats_.prefix_hits = c.hits;
  stats_.prefix_cached_tokens = c.cached_tokens;
  stats_.prefix_restores = c.restores;
  stats_.prefix_evicted_blocks = c.evicted_blocks;
  stats_.prefix_evicted_snapshots = c.evicted_snapshots;
  stats_.host_blocks = c.host_blocks;
  stats_.host_snapshots = c.host_snapshots;
  stats_.host_pages = c.host_pages;
  stats_.host_slots = c.host_slots;
  stats_.host_stored_blocks = c.host_stored_blocks;
  stats_.host_stored_snapshots = c.host_stored_snapshots;
  stats_.host_evicted_blocks = c.host_evicted_blocks;
  stats_.host_evicted_snapshots = c.host_evicted_snapshots;
  stats_.host_restored_blocks = c.host_restored_blocks;
  stats_.host_restored_snapshots = c.host_restored_snapshots;
  stats_.requests_finished = outputs_->counters().requests_finished;
  stats_.tokens_generated = outputs_->counters().tokens_generated;
  stats_.tokens_prefilled = outputs_->counters().tokens_prefilled;
  stats_.draft_tokens = outputs_->counters().draft_tokens;
  stats_.draft_tokens_accepted = outputs_->counters().draft_tokens_accepted;
}

// Asks the caller for the mask of every constrained lane that samples this step, before the forward, so the caller
// computes them while it runs: the verify slices' (`verify`) with their drafts, so once drafting is done; the
// others' at once.
void Engine::request_masks(const StepPlan& plan, std::span<const SliceInput> inputs, bool verify) {
  for (size_t i = 0; i < plan.slices.size(); ++i) {
    const PlannedSlice& s = plan.slices[i];
    Lane& lane = *scheduler_->lane(s.lane);
    if (!lane.job.request.constrained || s.output != SliceOutput::Sample || (s.kind == SliceKind::Verify) != verify)
      continue;
    lane.mask.pending = true;
    MaskRequest request{lane.job.id, std::move(lane.mask.unreported), {}};
    if (s.kind == SliceKind::Verify)  // (verify_tokens: the last token, then the drafts)
      request.drafts.assign(inputs[i].drafts->verify_tokens.begin() + 1, inputs[i].drafts->verify_tokens.end());
    lane.mask.row_limit = request.drafts.size() + 1;
    mask_requests_.push_back(std::move(request));
    lane.mask.unreported.clear();
  }
  if (!mask_requests_.empty()) events_cv_.notify_all();
}

bool Engine::awaiting_masks(const StepPlan& plan) const {
  for (const PlannedSlice& s : plan.slices) {
    const auto& lane = scheduler_->lane(s.lane);
    if (lane && lane->mask.pending && !cancel_requests_.contains(lane->job.id)) return true;
  }
  return false;
}

void Engine::apply_cancellations() {
  for (uint64_t id : cancel_requests_) {
    const int32_t index = scheduler_->lane_of(id);
    if (index >= 0) outputs_->end_lane(index, FinishReason::Cancelled);
  }
  cancel_requests_.clear();
}

// What the executor needs of each slice's lane for the pass (the sampling part comes once masks are known).
std::vector<SliceInput> Engine::gather_inputs(const StepPlan& plan) {
  std::vector<SliceInput> inputs;
  for (const PlannedSlice& s : plan.slices) {
    Lane& lane = *scheduler_->lane(s.lane);
    SliceInput in;
    in.item.tokens = lane.tokens.data() + s.begin;
    in.item.n_tokens = s.end - s.begin;
    in.item.start = lane.computed;
    in.item.pages = lane.cache.pages;
    in.item.state_slot = lane.cache.state_slot;
    in.item.all_logits = s.output == SliceOutput::PromptLogprobs;
    if (s.row >= 0) {  // a decision row: the question's suffix, after the context, in the row's fork
      const DecisionRow& row = *lane.rows[size_t(s.row)];
      const DecisionQuestion& q = lane.job.decision.questions[size_t(row.question)];
      const int64_t context = static_cast<int64_t>(lane.tokens.size());
      in.item.tokens = q.suffix.data() + (s.begin - context);
      in.item.start = row.computed;
      in.item.pages = row.cache.pages;
      in.item.state_slot = row.cache.state_slot;
      in.item.all_logits = false;
      if (s.output == SliceOutput::CandidateLogprobs) in.item.candidates = q.candidates;
    }
    in.tokens = lane.tokens.data();
    in.total_tokens = static_cast<int64_t>(lane.tokens.size());
    in.host_sampler = needs_host_sampler(lane.job.request.sampling);
    if (lane.speculative) {
      in.drafts = &lane.drafts;
      if (s.kind == SliceKind::Verify) {  // the drafter fills in the tokens
        in.item.n_tokens = s.drafts + 1;
        in.item.all_logits = true;
        if (!lane.cache.step_slots.empty())  // (none for a model without linear attention: no state to keep)
          in.item.step_slots = std::span(lane.cache.step_slots).first(size_t(s.drafts + 1));
      } else {
        in.item.all_hidden = true;
      }
    }
    inputs.push_back(in);
  }
  return inputs;
}

// Fills the sampling part of each Sample slice whose lane still runs and whose mask lets it sample, and forgets the
// tokens of lanes that ended.
void Engine::add_sampling(const StepPlan& plan, std::vector<SliceInput>& inputs) {
  for (size_t i = 0; i < plan.slices.size(); ++i) {
    const PlannedSlice& s = plan.slices[i];
    SliceInput& in = inputs[i];
    std::optional<Lane>& lane = scheduler_->lane(s.lane);
    if (!lane) in.tokens = nullptr;  // it ended while the masks were awaited
    in.sample = lane && s.output == SliceOutput::Sample && !lane->mask.ends_request();
    if (!in.sample) continue;
    in.params = &lane->job.request.sampling;
    in.sampler = &*lane->sampler;
    in.history = &lane->history;
    in.counter = static_cast<uint64_t>(lane->generated);
    in.verified = s.drafts;
    if (lane->job.request.constrained) {
      in.masks = lane->mask.rows;
      in.verified = std::min<int32_t>(s.drafts, int32_t(in.masks.size()) - 1);
    }
  }
}

// On a device backend, decode lanes (one new token each) and prefill chunks run as separate passes, taking turns
// when both wait: a decode batch then runs as its captured graph, and its rows always take the decode GEMV, so a
// lane's tokens do not depend on whether a prefill chunk happened to share its step (the prefill GEMM rounds
// activations differently). Decodes wait at most one chunk. The CPU backend's linear is batch-invariant: it
// keeps one mixed pass.
StepPlan Engine::take_turn(StepPlan plan) {
  const auto first_prefill = std::find_if(plan.slices.begin(), plan.slices.end(),
                                          [](const PlannedSlice& s) { return s.kind != SliceKind::Decode; });
  if (first_prefill == plan.slices.begin() || first_prefill == plan.slices.end()) return plan;
  if (prefill_turn_)
    plan.slices.erase(plan.slices.begin(), first_prefill);
  else
    plan.slices.erase(first_prefill, plan.slices.end());
  prefill_turn_ = !prefill_turn_;
  return plan;
}

// One step: plan (locked), the pass (unlocked), the masks it waits for, the outputs (unlocked), then the output
// processor (locked). The executor runs unlocked so that submit, cancel and next_events stay responsive; only this
// thread touches lanes' caches and tokens, and no lane is freed until the lock is retaken.
// Runs the vision tower for lanes whose prompt has media and that start their prefill now, and points each such
// slice at its media rows and M-RoPE positions. Outside mu_: the tower may take long, and only this thread touches
// the lanes. A failure (the tower's memory) ends the step's lanes with the error, as a failed pass does.
StepResult Engine::add_media(const StepPlan& plan, std::vector<SliceInput>& inputs) {
  StepResult result;
  try {
    slice_media_rows_.resize(std::max(slice_media_rows_.size(), plan.slices.size()));
    slice_positions_.resize(std::max(slice_positions_.size(), plan.slices.size()));
    for (size_t i = 0; i < plan.slices.size(); ++i) {
      const PlannedSlice& s = plan.slices[i];
      Lane& lane = *scheduler_->lane(s.lane);
      const auto& media = lane.job.request.media;
      if (!media) continue;
      if (!lane.media)
        lane.media = std::make_shared<EncodedMedia>(*model_, media, int64_t(lane.job.request.prompt.size()), s.begin);
      lane.media->fill(inputs[i].item, s.begin, s.end, slice_media_rows_[i], slice_positions_[i]);
    }
  } catch (const EngineError& e) {
    result.error_type = "EngineError";
    result.error_message = e.what();
  } catch (const std::exception& e) {
    result.error_type = "NinferError";
    result.error_message = std::string("vision tower: ") + e.what();
  }
  return result;
}

void Engine::run_step() {
  StepPlan plan;
  std::vector<SliceInput> inputs;
  {
    std::unique_lock lock(mu_);
    apply_cancellations();
    scheduler_->admit();
    refresh_stats();
    plan = scheduler_->plan();
    if (plan.slices.empty()) return;
    if (device_) plan = take_turn(std::move(plan));
    inputs = gather_inputs(plan);
    request_masks(plan, inputs, false);
  }
  StepResult result = add_media(plan, inputs);
  if (!result.failed()) result = executor_->draft(plan, inputs);
  if (!result.failed()) {
    std::unique_lock lock(mu_);
    request_masks(plan, inputs, true);
  }
  const bool runs = !result.failed();
  if (runs) result = executor_->run_pass(plan, inputs);
  std::unique_lock lock(mu_);
  if (runs) ++stats_.forward_passes;
  if (!result.failed()) {
    masks_cv_.wait(lock, [&] { return stopping_ || !awaiting_masks(plan); });
    if (stopping_) return;  // close() ends every lane
    apply_cancellations();  // a lane cancelled while its mask was awaited ends without sampling
    add_sampling(plan, inputs);
    lock.unlock();
    executor_->collect(plan, inputs, result);
    lock.lock();
    if (stopping_) return;
  }
  outputs_->absorb(plan, result);
  refresh_stats();
}

}  // namespace ninfer
