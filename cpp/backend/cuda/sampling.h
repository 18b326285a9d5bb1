// The sampler on the device: one token (with its logprob and top_logprobs) per row of device logits, with the
// CPU Sampler's semantics (runtime/sampler.cpp: mask, repetition then presence/frequency penalties, greedy or
// temperature, top-k, top-p, min-p, the same tie rules), so that decode never copies logits to the host.
//
// How (per row, rows in parallel, every pass split over chunks of the vocabulary except where noted):
//  1. prepare: masked logits -> z (and their log-sum-exp), then the penalties of the row's (token, generated count)
//     pairs, then argmax / max of z and, for rows that cut by rank or mass, sort keys; top_logprobs are then picked
//     by the CPU's key (the float logprob, ties by token id);
//  2. rows with top-k or top-p < 1 order their candidates as the CPU's partial_sort does (larger z first, ties by
//     token id): a top-k of at most 20 by selection (k rounds of block argmax), anything else by one stable radix
//     sort of all such rows; then the kept prefix with the CPU's arithmetic (one block per row);
//  3. draw: Gumbel-max over the kept tokens, argmax of log w + G with G from a Philox4x32-10 stream keyed by the
//     request's seed and counted by (tokens generated so far, token id). Exact for the distribution, needs no
//     running sum, and a seeded request draws the same token whatever else is in the batch. It is not the CPU's
//     mt19937 stream: the same seed gives different (equally distributed) tokens on the two backends.
// Every buffer is grown to the largest batch seen and then reused: a decode step allocates nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "runtime/device_runtime.h"

namespace ninfer::cuda {

class DeviceSampler {
 public:
  DeviceSampler();
  ~DeviceSampler();
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  // Samples every row on `stream` (after what is queued there) and waits for the results.
  void sample(cudaStream_t stream, const float* logits, int64_t vocab, std::span<const DeviceSampleRow> rows,
              std::vector<SampledToken>& out);
  // The distribution each row draws from, [rows, vocab] probabilities (Sampler::distribution's twin, for tests).
  std::vector<float> distribution(cudaStream_t stream, const float* logits, int64_t vocab,
                                  std::span<const DeviceSampleRow> rows);

 private:
  struct Workspace;
  // Queues every kernel of one batch; `probs` (device, [rows, vocab]) also gets the distributions when not null.
  void run(cudaStream_t stream, const float* logits, int64_t vocab, std::span<const DeviceSampleRow> rows,
           float* probs);
  std::unique_ptr<Workspace> ws_;
};

}  // namespace ninfer::cuda
