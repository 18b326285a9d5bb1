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

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

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

int64_t pages_for(int64_t tokens) { return (tokens + kKvPageTokens - 1) / kKvPageTokens; }

// The lane count when every slice of the plan is one new token (a pass a decode graph can run), else 0.
int32_t decode_batch(const StepPlan& plan) {
  for (const LaneSlice& s : plan.slices)
    if (s.end - s.begin != 1) return 0;
  return int32_t(plan.slices.size());
}

}  // namespace

void validate_engine_options(const EngineOptions& o) {
  const auto fail = [](const std::string& m) { throw EngineError("invalid engine option: " + m); };
  if (o.max_concurrency < 1 || o.max_concurrency > 8)
    fail("max_concurrency = " + std::to_string(o.max_concurrency) + " (must be 1..8)");
  if (o.max_context < 1) fail("max_context = " + std::to_string(o.max_context) + " (must be >= 1)");
  if (o.max_queue < 0) fail("max_queue = " + std::to_string(o.max_queue) + " (must be >= 0)");
  if (o.kv_capacity < 0 && o.kv_capacity != kKvCapacityAuto)
    fail("kv_capacity = " + std::to_string(o.kv_capacity) + " (must be >= 0; 0 = max_context * max_concurrency)");
  if (o.cuda_gemm != "auto" && o.cuda_gemm != "twin")
    fail("cuda_gemm = \"" + o.cuda_gemm + "\" (must be auto or twin)");
  if (o.prefill_chunk != kPrefillChunkAuto && (o.prefill_chunk < kKvPageTokens || o.prefill_chunk % kKvPageTokens))
    fail("prefill_chunk = " + std::to_string(o.prefill_chunk) + " (must be a positive multiple of 64, or 0 = auto)");
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

Engine::Engine(const std::string& path, const EngineOptions& options, std::unique_ptr<Backend> backend)
    : options_(options) {
  validate_engine_options(options_);
  ModelOptions mo;
  mo.max_context = options_.max_context;
  mo.kv_capacity = std::max<int64_t>(0, options_.kv_capacity);
  mo.max_sequences = options_.max_concurrency;
  mo.kv_dtype = options_.kv_dtype;
  mo.threads = options_.threads;
  mo.verify_checksums = options_.verify_checksums;
  std::shared_ptr<const Artifact> artifact = Artifact::open(path, options_.verify_checksums);
  device_ = dynamic_cast<DeviceRuntime*>(backend.get());
  if (device_) {
    const ModelConfig config = ModelConfig::from_json(artifact->config(), path);
    const DeviceMemoryUse use = device_->upload_weights(*artifact);
    if (options_.prefill_chunk == kPrefillChunkAuto)
      options_.prefill_chunk =
          choose_prefill_chunk(config, options_.kv_dtype, options_.kv_capacity, options_.max_context,
                               options_.max_concurrency, use.device_total, use.weights, use.free_after_weights);
    memory_plan_ = plan_memory(config, options_.kv_dtype, options_.kv_capacity, options_.max_context,
                               options_.max_concurrency, options_.prefill_chunk + options_.max_concurrency,
                               use.device_total, use.weights, use.free_after_weights);
    mo.kv_capacity = memory_plan_.kv_capacity_tokens;
    device_->set_graphs_enabled(options_.cuda_graphs);
    device_->set_max_sequence_tokens(options_.max_context);
    std::fprintf(stderr, "ninfer: %s\n", describe(memory_plan_).c_str());
  }
  if (options_.prefill_chunk == kPrefillChunkAuto) options_.prefill_chunk = kDefaultPrefillChunk;
  model_ = Model::load(std::move(artifact), mo, std::move(backend));
  config_ = model_->config();
  Model* model = model_.get();
  scheduler_ = std::make_unique<Scheduler>(
      options_.max_concurrency, options_.prefill_chunk,
      KvReserver{[model](SequenceCache& c, int64_t n) { return model->reserve(c, n); },
                 [model](SequenceCache& c) { model->release(c); }});
  refresh_stats();
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() { close(); }

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
  }
  Job job;
  job.reservation = scoring ? n : std::min(n + request.max_new_tokens, options_.max_context);
  const int64_t capacity = model_->kv_capacity_tokens();
  if (pages_for(job.reservation) * kKvPageTokens > capacity)
    throw CapacityError("the request needs " + std::to_string(job.reservation) + " KV tokens (prompt " +
                        std::to_string(n) + " + max_new_tokens " + std::to_string(request.max_new_tokens) +
                        ", capped at max_context " + std::to_string(options_.max_context) +
                        ", in pages of 64) but the KV pool holds " + std::to_string(capacity));
  job.request = std::move(request);
  job.submitted = Clock::now();
  return job;
}

uint64_t Engine::submit(GenerationRequest request) {
  std::unique_lock lock(mu_);
  if (closed_) throw EngineError("the engine is closed");
  Job job = make_job(std::move(request), false);
  if (in_flight_ >= options_.max_concurrency + options_.max_queue)
    throw EngineBusyError("the engine is busy: all " + std::to_string(options_.max_concurrency) + " lanes and " +
                          std::to_string(options_.max_queue) + " queue places are taken; retry later");
  job.id = next_id_++;
  const uint64_t id = job.id;
  scheduler_->enqueue(std::move(job));
  ++in_flight_;
  stats_.queued = scheduler_->num_queued();
  work_cv_.notify_one();
  return id;
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
  if (scheduler_ && scheduler_->remove_queued(id)) {
    --in_flight_;
    stats_.queued = scheduler_->num_queued();
    EngineEvent ev;
    ev.request_id = id;
    ev.finish = FinishReason::Cancelled;
    events_.push_back(std::move(ev));
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
  std::unique_lock lock(mu_);
  const int32_t index = scheduler_ ? scheduler_->lane_of(id) : -1;
  if (index < 0 || !scheduler_->lane(index)->mask.pending) return false;
  const int64_t expected = token_mask_words(config_.vocab_size);
  if (words && static_cast<int64_t>(words->size()) != expected)
    throw EngineError("a token mask has " + std::to_string(words->size()) + " words; this model's vocabulary of " +
                      std::to_string(config_.vocab_size) + " needs " + std::to_string(expected));
  LaneMask& mask = scheduler_->lane(index)->mask;
  mask.pending = false;
  mask.active = words.has_value();
  if (words) mask.words = std::move(*words);
  mask.allows_none = mask.active && token_mask_allowed(mask.words, config_.vocab_size) == 0;
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
    if (scheduler_->lane(i)) end_lane(i, FinishReason::Cancelled);
  for (const Job& job : scheduler_->queue()) {
    if (job.score_result) job.score_result->set_exception(std::make_exception_ptr(EngineError("the engine closed")));
    EngineEvent ev;
    ev.request_id = job.id;
    ev.finish = FinishReason::Cancelled;
    events_.push_back(std::move(ev));
  }
  scheduler_.reset();
  model_.reset();
  in_flight_ = 0;
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
    step();
  }
}

void Engine::publish(EngineEvent event) {
  events_.push_back(std::move(event));
  events_cv_.notify_all();
}

void Engine::refresh_stats() {
  stats_.lanes = scheduler_->num_lanes();
  stats_.busy_lanes = scheduler_->num_busy_lanes();
  stats_.queued = scheduler_->num_queued();
  stats_.kv_capacity_tokens = model_->kv_capacity_tokens();
  stats_.kv_free_tokens = model_->kv_free_tokens();
  stats_.free_state_slots = model_->free_state_slots();
}

// Asks the caller for the mask of every constrained lane that samples this step; sent before the forward, so the
// caller computes them while it runs.
void Engine::request_masks(const StepPlan& plan) {
  for (const LaneSlice& s : plan.slices) {
    Lane& lane = *scheduler_->lane(s.lane);
    if (!lane.job.request.constrained || s.end < static_cast<int64_t>(lane.tokens.size())) continue;
    lane.mask.pending = true;
    mask_requests_.push_back({lane.job.id, std::move(lane.mask.unreported)});
    lane.mask.unreported.clear();
  }
  if (!mask_requests_.empty()) events_cv_.notify_all();
}

bool Engine::awaiting_masks(const StepPlan& plan) const {
  for (const LaneSlice& s : plan.slices) {
    const auto& lane = scheduler_->lane(s.lane);
    if (lane && lane->mask.pending && !cancel_requests_.contains(lane->job.id)) return true;
  }
  return false;
}

void Engine::apply_cancellations() {
  for (uint64_t id : cancel_requests_) {
    const int32_t index = scheduler_->lane_of(id);
    if (index >= 0) end_lane(index, FinishReason::Cancelled);
  }
  cancel_requests_.clear();
}

// Ends lane `index`: frees it and its KV first, so that whoever sees the final event sees them free.
void Engine::end_lane(int32_t index, FinishReason reason, const std::string& error_type,
                      const std::string& error_message) {
  Lane& lane = *scheduler_->lane(index);
  const Clock::time_point now = Clock::now();
  EngineEvent ev;
  ev.request_id = lane.job.id;
  ev.finish = reason;
  ev.error_type = error_type;
  ev.error_message = error_message;
  const int64_t prompt = static_cast<int64_t>(lane.job.request.prompt.size());
  ev.usage = {prompt, 0, lane.generated};
  ev.timings.queue_s = seconds(lane.admitted - lane.job.submitted);
  ev.timings.total_s = seconds(now - lane.job.submitted);
  if (lane.generated > 0) {
    ev.timings.ttft_s = seconds(lane.first_token - lane.job.submitted);
    ev.timings.prefill_tokens_per_s = prompt / std::max(1e-9, seconds(lane.first_token - lane.admitted));
    if (lane.generated > 1)
      ev.timings.decode_tokens_per_s = (lane.generated - 1) / std::max(1e-9, seconds(now - lane.first_token));
  }
  if (lane.is_scoring()) {
    if (reason == FinishReason::Length)
      lane.job.score_result->set_value(std::move(lane.score_logprobs));
    else
      lane.job.score_result->set_exception(std::make_exception_ptr(EngineError(
          reason == FinishReason::Error ? error_message : std::string("scoring was cancelled"))));
  }
  const bool publish_event = !lane.is_scoring();
  scheduler_->finish(index);
  --in_flight_;
  ++stats_.requests_finished;
  refresh_stats();
  if (publish_event) publish(std::move(ev));
}

// Takes the forward's output for one slice: scoring lanes collect logprobs, generating lanes that have computed
// every known token sample the next one (`sampled`: already sampled on the device; else from host logits).
void Engine::absorb(const LaneSlice& slice, const ForwardOutput& out, int64_t row, const SampledToken* sampled) {
  Lane& lane = *scheduler_->lane(slice.lane);
  const int64_t vocab = out.vocab;
  stats_.tokens_prefilled += slice.end - slice.begin;
  if (lane.is_scoring()) {
    const int64_t n = static_cast<int64_t>(lane.tokens.size());
    for (int64_t p = slice.begin; p < slice.end && p + 1 < n; ++p) {
      const std::vector<float> lp =
          log_softmax(std::span<const float>(out.logits.data() + (row + p - slice.begin) * vocab, vocab));
      lane.score_logprobs.push_back(lp[lane.tokens[p + 1]]);
    }
    if (slice.end == n) end_lane(slice.lane, FinishReason::Length);
    return;
  }
  report_progress(lane, slice);
  if (slice.end < static_cast<int64_t>(lane.tokens.size())) return;  // more prompt to prefill

  if (!lane.mask.error.empty()) {
    end_lane(slice.lane, FinishReason::Error, "EngineError", lane.mask.error);
    return;
  }
  if (lane.mask.allows_none) {
    end_lane(slice.lane, FinishReason::Error, "EngineError", "the request's token mask allows no token");
    return;
  }
  SampledToken s;
  if (sampled) {
    s = *sampled;
  } else {
    const int64_t last_row = row + (slice.all_logits ? slice.end - slice.begin - 1 : 0);
    std::span<const float> logits(out.logits.data() + last_row * vocab, vocab);
    std::vector<float> masked;
    if (lane.mask.active) {
      masked.assign(logits.begin(), logits.end());
      apply_token_mask(masked, lane.mask.words);
      logits = masked;  // logprobs too are those of the constrained distribution
    }
    s = lane.sampler->sample(logits, lane.history);
  }
  if (lane.job.request.constrained) lane.mask.unreported.push_back(s.token);
  if (lane.generated++ == 0) lane.first_token = Clock::now();
  ++stats_.tokens_generated;
  lane.history.add_generated(s.token);
  const GenerationRequest& req = lane.job.request;
  const bool stop = std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), s.token) != req.stop_token_ids.end();
  if (!stop) {
    lane.tokens.push_back(s.token);
    EngineEvent ev;
    ev.request_id = lane.job.id;
    ev.tokens = {s.token};
    if (req.sampling.logprobs || req.sampling.top_logprobs > 0) ev.logprobs = {s.logprob};
    if (req.sampling.top_logprobs > 0) ev.top_logprobs = {s.top};
    publish(std::move(ev));
  }
  if (stop)
    end_lane(slice.lane, FinishReason::Stop);
  else if (lane.generated >= req.max_new_tokens || static_cast<int64_t>(lane.tokens.size()) >= lane.job.reservation)
    end_lane(slice.lane, FinishReason::Length);
}

// A Progress event when the slice was a prefill chunk of a lane that asked for them: published before the token
// its last chunk samples, so a consumer sees every chunk's progress first.
void Engine::report_progress(const Lane& lane, const LaneSlice& slice) {
  const int64_t prompt = static_cast<int64_t>(lane.job.request.prompt.size());
  if (!lane.job.request.report_progress || slice.begin >= prompt) return;
  EngineEvent ev;
  ev.request_id = lane.job.id;
  ev.kind = EventKind::Progress;
  ev.progress.total = prompt;
  ev.progress.cached = 0;  // no prefix reuse yet (Usage::cached_tokens is 0 too)
  ev.progress.processed = std::min(slice.end, prompt);
  ev.progress.elapsed_s = seconds(Clock::now() - lane.admitted);
  publish(std::move(ev));
}

// Whether the slice's lane samples a token from this step's output (what absorb does without ending the lane).
bool Engine::samples_now(const LaneSlice& slice) const {
  const Lane& lane = *scheduler_->lane(slice.lane);
  return !lane.is_scoring() && slice.end == static_cast<int64_t>(lane.tokens.size()) && lane.mask.error.empty() &&
         !lane.mask.allows_none;
}

// Samples every lane that samples now from the logits the pass left on the device; sampled[i] is slice i's token
// (nullopt for the others). Runs unlocked: it waits for the pass, and only this thread touches lanes.
void Engine::sample_on_device(const StepPlan& plan, const ForwardOutput& out,
                              std::vector<std::optional<SampledToken>>& sampled) {
  std::vector<DeviceSampleRow> rows;
  std::vector<size_t> slice_of_row;
  for (size_t i = 0; i < plan.slices.size(); ++i) {
    const LaneSlice& s = plan.slices[i];
    if (!scheduler_->lane(s.lane) || !samples_now(s)) continue;
    const Lane& lane = *scheduler_->lane(s.lane);
    DeviceSampleRow row;
    row.logits_row = out.row_offset[i];  // generation slices have one output row, the last token's
    row.params = &lane.job.request.sampling;
    row.seed = lane.sampler->seed();
    row.counter = static_cast<uint64_t>(lane.generated);
    row.history = &lane.history;
    if (lane.mask.active) row.mask = lane.mask.words;
    rows.push_back(row);
    slice_of_row.push_back(i);
  }
  sampled.assign(plan.slices.size(), std::nullopt);
  if (rows.empty()) return;
  std::vector<SampledToken> tokens;
  device_->sample(out.device_logits, out.vocab, rows, tokens);
  for (size_t r = 0; r < rows.size(); ++r) sampled[slice_of_row[r]] = std::move(tokens[r]);
}

void Engine::fail_step(const std::vector<LaneSlice>& slices, const std::exception& error, const char* type) {
  for (const LaneSlice& s : slices)
    if (scheduler_->lane(s.lane)) end_lane(s.lane, FinishReason::Error, type, error.what());
}

// On a device backend, decode lanes (one new token each) and prefill chunks run as separate passes, taking turns
// when both wait: a decode batch then runs as its captured graph, and its rows always take the decode GEMV, so a
// lane's tokens do not depend on whether a prefill chunk happened to share its step (the prefill GEMM rounds
// activations differently). Decodes wait at most one chunk. The CPU backend's linear is batch-invariant: it
// keeps one mixed pass.
StepPlan Engine::take_turn(StepPlan plan) {
  const auto first_prefill = std::find_if(plan.slices.begin(), plan.slices.end(),
                                          [](const LaneSlice& s) { return s.end - s.begin != 1 || s.all_logits; });
  if (first_prefill == plan.slices.begin() || first_prefill == plan.slices.end()) return plan;
  if (prefill_turn_)
    plan.slices.erase(plan.slices.begin(), first_prefill);
  else
    plan.slices.erase(first_prefill, plan.slices.end());
  prefill_turn_ = !prefill_turn_;
  return plan;
}

void Engine::step() {
  StepPlan plan;
  std::vector<ForwardItem> items;
  ForwardOutput out;
  {
    std::unique_lock lock(mu_);
    apply_cancellations();
    scheduler_->admit();
    refresh_stats();
    plan = scheduler_->plan();
    if (plan.slices.empty()) return;
    if (device_) plan = take_turn(std::move(plan));
    for (const LaneSlice& s : plan.slices) {
      Lane& lane = *scheduler_->lane(s.lane);
      items.push_back({lane.tokens.data() + s.begin, s.end - s.begin, &lane.cache, s.all_logits});
    }
    request_masks(plan);
    // A device backend samples on the device unless a lane needs host logits (scoring: every row's logprobs; a
    // sampler stage only the host sampler has).
    out.keep_on_device = device_ && options_.device_sampling &&
                         std::none_of(plan.slices.begin(), plan.slices.end(), [&](const LaneSlice& s) {
                           const Lane& lane = *scheduler_->lane(s.lane);
                           return s.all_logits || lane.is_scoring() || needs_host_sampler(lane.job.request.sampling);
                         });
  }
  // The model runs unlocked: submit, cancel and next_events stay responsive. Only this thread touches lanes'
  // caches and tokens, and no lane is freed until the lock is retaken.
  const char* error_type = nullptr;
  std::string error_message;
  const auto run_unlocked = [&](auto&& work) {
    try {
      work();
    } catch (const EngineError& e) {
      error_type = "EngineError";
      error_message = e.what();
    } catch (const std::exception& e) {
      error_type = "NinferError";
      error_message = e.what();
    }
  };
  run_unlocked([&] {
    if (!device_) {
      model_->forward(items, out);
      return;
    }
    device_->begin_pass(decode_batch(plan));
    try {
      model_->forward(items, out);
    } catch (...) {
      // Leave the broken pass now, not at the next one: a decode graph's capture left open on the stream would
      // swallow the device work queued in between (admitting a lane zeroes its state slot there: the lane would
      // start from another sequence's recurrent state).
      device_->begin_pass(0);
      throw;
    }
    if (out.device_logits) device_->launch_pass();  // it runs while the caller computes masks
  });
  std::unique_lock lock(mu_);
  const auto failed = [&] {
    if (error_type) fail_step(plan.slices, std::runtime_error(error_message), error_type);
    return error_type != nullptr;
  };
  if (failed()) return;
  masks_cv_.wait(lock, [&] { return stopping_ || !awaiting_masks(plan); });
  if (stopping_) return;  // close() ends every lane
  apply_cancellations();  // a lane cancelled while its mask was awaited ends without sampling
  std::vector<std::optional<SampledToken>> sampled(plan.slices.size());
  if (out.device_logits) {
    lock.unlock();
    run_unlocked([&] { sample_on_device(plan, out, sampled); });
    lock.lock();
    if (stopping_ || failed()) return;
  }
  for (size_t i = 0; i < plan.slices.size(); ++i)
    if (scheduler_->lane(plan.slices[i].lane))
      absorb(plan.slices[i], out, out.row_offset[i], sampled[i] ? &*sampled[i] : nullptr);
  refresh_stats();
}

}  // namespace ninfer
