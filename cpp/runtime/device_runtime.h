// What the engine asks of a backend with its own memory (the CUDA backend), beyond the ops: upload the weights
// and measure what is left (the memory plan), and run decode passes as CUDA graphs. The engine finds it with a
// dynamic_cast, so the CPU backend and the Backend interface stay as they are.
#pragma once

#include <compare>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "artifact/artifact.h"
#include "runtime/sampler.h"

namespace ninfer {

struct DeviceMemoryUse {
  int64_t device_total = 0, weights = 0, free_after_weights = 0;
};

// Totals over the decode passes run as graph launches. A batch size is captured once (again only after a device
// buffer moved); its capture_host_us is the host time of issuing the model's ops into the capture plus
// instantiating (or updating) the executable. replay_host_us is the host time of every later pass of a captured
// batch size: the model writing its step tables, their copy to the device and the graph launch. device_us is the
// graphs' time on the device, over `passes` launches (captured and replayed).
struct GraphPassTimings {
  int64_t captures = 0, replays = 0, passes = 0;
  double capture_host_us = 0, replay_host_us = 0, device_us = 0;
  // The MTP drafting passes' launches (GraphPassShape::drafts > 0): counted apart from passes / device_us, which
  // stay the decode and verify passes'.
  int64_t draft_passes = 0;
  double draft_device_us = 0;
};

// The shape of a pass a CUDA graph can run: `lanes` sequences, each `rows` new tokens that run as decode steps
// (rows 1: a decode pass; rows K + 1: an MTP verify pass, runtime/speculative.h). lanes 0: any other pass.
// drafts > 0: one lane's MTP drafting (Model::mtp_draft): the head's catch-up over `rows` target rows, then
// `drafts` drafts.
struct GraphPassShape {
  int32_t lanes = 0, rows = 1, drafts = 0;
  auto operator<=>(const GraphPassShape&) const = default;
};

// One row of device logits to sample from, with what the CPU Sampler would read for it.
struct DeviceSampleRow {
  int64_t logits_row = 0;                // the row of the [rows, vocab] logits
  const SamplingParams* params = nullptr;
  uint64_t seed = 0;                     // the request's seed (drawn at admission when it gave none)
  uint64_t counter = 0;                  // tokens the request generated so far: the draw's RNG counter
  const TokenHistory* history = nullptr;
  std::span<const uint32_t> mask;        // token_mask_words(vocab) words, or empty: no mask
};

// Device time of one kind of backend op summed over eager passes (the backend's op-timing mode).
struct OpTime {
  std::string op;
  int64_t calls = 0;
  double device_us = 0;
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  // Copies every tensor of `artifact` to the device now (not at first use) and measures the bytes taken.
  virtual DeviceMemoryUse upload_weights(const Artifact& artifact) = 0;
  // Announces the next pass: a shape with lanes > 0 when it is exactly that many sequences of `rows` decode steps
  // each (then it may run as the captured graph of that shape), the default shape for any other pass (eager).
  virtual void begin_pass(GraphPassShape shape) = 0;
  virtual void set_graphs_enabled(bool enabled) = 0;
  // The most tokens one sequence holds (the engine's max_context): bounds the page tables of a decode graph.
  virtual void set_max_sequence_tokens(int64_t tokens) = 0;
  virtual int64_t graph_bytes() const = 0;     // device memory the instantiated graphs took (measured)
  virtual int32_t graphs_captured() const = 0; // pass shapes with a graph
  virtual int64_t graph_replays() const = 0;   // passes run as graph launches
  virtual GraphPassTimings graph_timings() const = 0;
  // The most rows a pass's linear layers run on the decode path (the CUDA backend's GEMV kernels); a pass of more
  // takes the prefill GEMM, several times a decode pass's cost (the scheduler keeps verify passes within it).
  virtual int32_t decode_path_rows() const = 0;
  // Starts the pass queued since begin_pass (a captured decode pass: its graph launch) without waiting for it.
  virtual void launch_pass() = 0;
  // Samples each row's next token from `logits` (device memory, [*, vocab], written by the last pass) as
  // Sampler::sample would (logprobs included); the draw is a counter-based function of (seed, counter).
  virtual void sample(const float* logits, int64_t vocab, std::span<const DeviceSampleRow> rows,
                      std::vector<SampledToken>& out) = 0;
  // Per-op device times since the engine started, when the backend times its ops (a profiling mode, off by
  // default: the CUDA backend made with EngineOptions::cuda_op_times); empty otherwise. Callable from any thread.
  virtual std::vector<OpTime> op_times() const { return {}; }
};

}  // namespace ninfer
