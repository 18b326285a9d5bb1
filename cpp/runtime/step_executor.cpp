#include "runtime/step_executor.h"

#include <algorithm>
#include <deque>

#include "errors.h"

namespace ninfer {
namespace {

// The pass's shape when every slice of the plan is one decode token, or every one a verify slice of the same draft
// count (a pass a decode graph can run); else the default shape (eager).
GraphPassShape graph_shape(const StepPlan& plan) {
  if (plan.slices.empty()) return {};
  const PlannedSlice& first = plan.slices.front();
  const int32_t rows = first.kind == SliceKind::Verify ? first.drafts + 1 : 1;
  for (const PlannedSlice& s : plan.slices) {
    const bool decode_step = s.kind == SliceKind::Decode && rows == 1;
    const bool same_verify = s.kind == SliceKind::Verify && s.drafts + 1 == rows;
    if (!decode_step && !same_verify) return {};
  }
  return {int32_t(plan.slices.size()), rows};
}

// Runs `work`, turning an exception into the result's error (the lanes of the step end with it).
template <class Work>
void catching(StepResult& result, Work&& work) {
  try {
    work();
  } catch (const EngineError& e) {
    result.error_type = "EngineError";
    result.error_message = e.what();
  } catch (const std::exception& e) {
    result.error_type = "NinferError";
    result.error_message = e.what();
  }
}

}  // namespace

StepExecutor::StepExecutor(Model& model, CachePools& pools, DeviceRuntime* device, bool device_sampling,
                           Drafter* drafter)
    : model_(model), pools_(pools), device_(device), device_sampling_(device_sampling), drafter_(drafter) {}

StepResult StepExecutor::run_pass(const StepPlan& plan, std::span<const SliceInput> inputs) {
  std::vector<ForwardItem> items;
  for (const SliceInput& in : inputs) items.push_back(in.item);
  StepResult result;
  // A device backend samples on the device unless a slice needs every row's logits on the host (scoring) or its
  // lane uses a sampler stage only the host sampler has.
  bool host_logits = false;
  for (size_t i = 0; i < plan.slices.size(); ++i)
    host_logits = host_logits || plan.slices[i].output == SliceOutput::PromptLogprobs || inputs[i].host_sampler;
  out_.keep_on_device = device_ && device_sampling_ && !host_logits;
  // A verify slice's hidden rows go to the MTP head, which reads them from the host (Drafter::prepare).
  out_.hidden_to_host = std::any_of(plan.slices.begin(), plan.slices.end(),
                                    [](const PlannedSlice& s) { return s.kind == SliceKind::Verify; });
  catching(result, [&] {
    if (!device_) {
      model_.forward(items, pools_, out_);
      return;
    }
    device_->begin_pass(graph_shape(plan));
    try {
      model_.forward(items, pools_, out_);
    } catch (...) {
      // Leave the broken pass now, not at the next one: a decode graph's capture left open on the stream would
      // swallow the device work queued in between (admitting a lane zeroes its state slot there: the lane would
      // start from another sequence's recurrent state).
      device_->begin_pass({});
      throw;
    }
    if (out_.device_logits) device_->launch_pass();  // it runs while the caller computes masks
  });
  return result;
}

StepResult StepExecutor::draft(const StepPlan& plan, std::span<SliceInput> inputs) {
  StepResult result;
  if (!drafter_) return result;
  catching(result, [&] {
    for (size_t i = 0; i < plan.slices.size(); ++i) {
      SliceInput& in = inputs[i];
      if (!in.drafts) continue;
      const PlannedSlice& s = plan.slices[i];
      const int32_t drafts = s.kind == SliceKind::Verify ? s.drafts : 0;
      // A round's drafting (its few catch-up rows, then the drafts) is a pass a CUDA graph of its shape can run,
      // as the verify pass after it is; its drafts' copy back launches it. A prompt's catch-up runs eagerly.
      const int64_t rows = in.drafts->pending_rows(model_.config().hidden_size);
      const bool graph = device_ && drafts > 0 && rows >= 1 && rows <= device_->decode_path_rows();
      if (graph) device_->begin_pass({1, int32_t(rows), drafts});
      try {
        drafter_->prepare(*in.drafts, std::span(in.tokens, size_t(s.end)), in.item.pages, drafts);
      } catch (...) {
        if (graph) device_->begin_pass({});  // leave a capture in progress now (as run_pass does)
        throw;
      }
      if (s.kind == SliceKind::Verify) in.item.tokens = in.drafts->verify_tokens.data();
    }
  });
  return result;
}

void StepExecutor::collect(const StepPlan& plan, std::span<const SliceInput> inputs, StepResult& result) {
  result.slices.assign(plan.slices.size(), {});
  catching(result, [&] {
    if (out_.device_logits)
      sample_on_device(plan, inputs, result);
    else
      collect_on_host(plan, inputs, result);
    collect_candidates(plan, inputs, result);
  });
}

// The candidate logits come back to the host whatever the backend (a few per question): each readout is their
// log-softmax, the full vocabulary's normaliser cancelling out.
void StepExecutor::collect_candidates(const StepPlan& plan, std::span<const SliceInput> inputs, StepResult& result) {
  for (size_t i = 0; i < plan.slices.size(); ++i) {
    if (plan.slices[i].output != SliceOutput::CandidateLogprobs) continue;
    const float* logits = out_.candidate_logits.data() + out_.candidate_offset[i];
    result.slices[i].candidate_logprobs = log_softmax(std::span<const float>(logits, inputs[i].item.candidates.size()));
  }
}

// A verify slice's rows are all drawn at once, row j with the history and counter it would have after drafts
// 0..j-1 (accept_drawn); the host only compares tokens (no logits come back).
void StepExecutor::sample_on_device(const StepPlan& plan, std::span<const SliceInput> inputs, StepResult& result) {
  std::vector<DeviceSampleRow> rows;
  std::vector<size_t> slice_of_row;
  std::deque<TokenHistory> draft_histories;  // (a deque: rows point at its entries as more are added)
  for (size_t i = 0; i < plan.slices.size(); ++i) {
    const SliceInput& in = inputs[i];
    if (in.drafts) keep_hidden(i, plan.slices[i], result.slices[i]);
    if (!in.sample) continue;
    const int32_t drafts = plan.slices[i].kind == SliceKind::Verify ? in.verified : 0;
    for (int32_t j = 0; j <= drafts; ++j) {
      DeviceSampleRow row;
      row.logits_row = out_.row_offset[i] + j;  // sampling slices have one output row (the last token's) or, verify
      row.params = in.params;                   // slices, one per verified token
      row.seed = in.sampler->seed();
      row.counter = in.counter + uint64_t(j);
      row.history = in.history;
      if (j > 0) {
        draft_histories.push_back(j == 1 ? *in.history : draft_histories.back());
        draft_histories.back().add_generated(in.drafts->verify_tokens[size_t(j)]);
        row.history = &draft_histories.back();
      }
      row.mask = in.mask(size_t(j));  // the caller's mask after drafts 0..j-1
      rows.push_back(row);
      slice_of_row.push_back(i);
    }
  }
  if (rows.empty()) return;
  std::vector<SampledToken> tokens;
  device_->sample(out_.device_logits, out_.vocab, rows, tokens);
  for (size_t r = 0; r < rows.size();) {
    const size_t i = slice_of_row[r];
    const PlannedSlice& s = plan.slices[i];
    if (s.kind != SliceKind::Verify) {
      result.slices[i].token = std::move(tokens[r++]);
      continue;
    }
    const std::span<const SampledToken> drawn(tokens.data() + r, size_t(inputs[i].verified + 1));
    const std::span<const int32_t> drafts = inputs[i].round_drafts().first(size_t(inputs[i].verified));
    const int32_t accepted = accept_drawn(drawn, drafts, result.slices[i].verified);
    result.slices[i].drafts_checked =
        drafts_checked(inputs[i].verified, inputs[i].round_drafts(), inputs[i].mask(drawn.size() - 1));
    result.slices[i].hidden.resize(size_t((accepted + 1) * out_.hidden_size));  // the rows the lane keeps
    r += drawn.size();
  }
}

void StepExecutor::collect_on_host(const StepPlan& plan, std::span<const SliceInput> inputs, StepResult& result) {
  const int64_t vocab = out_.vocab;
  for (size_t i = 0; i < plan.slices.size(); ++i) {
    const PlannedSlice& s = plan.slices[i];
    const SliceInput& in = inputs[i];
    if (!in.item.candidates.empty()) continue;  // no logits rows: collect_candidates reads it
    const float* rows = out_.logits.data() + out_.row_offset[i] * vocab;
    if (in.drafts) keep_hidden(i, s, result.slices[i]);
    if (s.kind == SliceKind::Verify && in.sample) {
      const std::span<const int32_t> drafts = in.round_drafts().first(size_t(in.verified));
      const int32_t accepted = verify_drafts(std::span(rows, size_t((in.verified + 1) * vocab)), vocab, drafts,
                                             in.masks, *in.sampler, *in.history, result.slices[i].verified);
      result.slices[i].drafts_checked = drafts_checked(in.verified, in.round_drafts(), in.mask(size_t(in.verified)));
      // The lane keeps the rows up to the last accepted one.
      result.slices[i].hidden.resize(size_t((accepted + 1) * out_.hidden_size));
    } else if (s.output == SliceOutput::PromptLogprobs && in.tokens) {
      for (int64_t p = s.begin; p < s.end && p + 1 < in.total_tokens; ++p) {
        const std::vector<float> lp = log_softmax(std::span<const float>(rows + (p - s.begin) * vocab, vocab));
        result.slices[i].prompt_logprobs.push_back(lp[in.tokens[p + 1]]);
      }
    } else if (in.sample) {
      const std::span<const float> logits(rows + (in.item.all_logits ? s.end - s.begin - 1 : 0) * vocab, vocab);
      std::vector<float> masked;
      result.slices[i].token = in.sampler->sample(masked_logits(logits, in.mask(0), masked), *in.history);
    }
  }
}

// A speculative lane's target hidden rows, for the MTP head: a prefill slice's every row, a verify slice's every
// row (the caller cuts them to the accepted ones).
void StepExecutor::keep_hidden(size_t slice, const PlannedSlice& s, SliceResult& result) const {
  const int64_t h = out_.hidden_size, rows = s.kind == SliceKind::Verify ? s.drafts + 1 : s.end - s.begin;
  const float* first = s.kind == SliceKind::Verify ? out_.hidden.data() + out_.row_offset[slice] * h
                                                   : out_.all_hidden.data() + out_.all_hidden_offset[slice] * h;
  result.hidden.assign(first, first + rows * h);
}

}  // namespace ninfer
