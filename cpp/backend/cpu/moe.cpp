// Mixture of experts on the CPU backend: routing (softmax, top-k, renormalise) and the routed experts, run
// expert by expert over the rows routed to each so every expert's weights are streamed once per call.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/linear.h"

namespace ninfer::cpu {

void CpuBackend::moe_route(const float* logits, int64_t rows, int32_t experts, int32_t top_k, int32_t* ids,
                           float* weights) {
  std::vector<float>& probs = moe_probs_;
  std::vector<int32_t>& order = moe_order_;
  probs.resize(size_t(experts));
  order.resize(size_t(experts));
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits + r * experts;
    const float max_logit = *std::max_element(l, l + experts);
    float sum = 0.0f;
    for (int32_t e = 0; e < experts; ++e) sum += probs[size_t(e)] = std::exp(l[e] - max_logit);
    for (float& p : probs) p /= sum;
    std::iota(order.begin(), order.end(), 0);
    // Highest probability first; ties go to the lower expert id.
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
      return probs[size_t(a)] > probs[size_t(b)] || (probs[size_t(a)] == probs[size_t(b)] && a < b);
    });
    float top_sum = 0.0f;
    for (int32_t j = 0; j < top_k; ++j) top_sum += probs[size_t(order[size_t(j)])];
    for (int32_t j = 0; j < top_k; ++j) {
      ids[r * top_k + j] = order[size_t(j)];
      weights[r * top_k + j] = probs[size_t(order[size_t(j)])] / top_sum;
    }
  }
}

void CpuBackend::moe_experts(const float* x, int64_t rows, int64_t hidden, const int32_t* ids, const float* weights,
                             int32_t top_k, const TensorView& gate, const TensorView& up, const TensorView& down,
                             const SharedExpertTerm& shared, float* out) {
  const int64_t experts = gate.matrices(), inter = gate.rows();
  std::fill_n(out, rows * hidden, 0.0f);
  for (int64_t e = 0; e < experts; ++e) {
    moe_rows_.clear();
    moe_w_.clear();
    for (int64_t r = 0; r < rows; ++r)
      for (int32_t j = 0; j < top_k; ++j)
        if (ids[r * top_k + j] == e) {
          moe_rows_.push_back(r);
          moe_w_.push_back(weights[r * top_k + j]);
        }
    const int64_t n = int64_t(moe_rows_.size());
    if (n == 0) continue;
    if (moe_x_.size() < size_t(n * hidden)) moe_x_.resize(size_t(n * hidden));
    if (moe_gate_.size() < size_t(n * inter)) {
      moe_gate_.resize(size_t(n * inter));
      moe_up_.resize(size_t(n * inter));
    }
    if (moe_out_.size() < size_t(n * hidden)) moe_out_.resize(size_t(n * hidden));
    gather_rows(x, hidden, moe_rows_.data(), n, moe_x_.data());
    cpu::linear(moe_x_.data(), n, gate.matrix(e), moe_gate_.data());
    cpu::linear(moe_x_.data(), n, up.matrix(e), moe_up_.data());
    swiglu(moe_gate_.data(), moe_up_.data(), n * inter, moe_gate_.data());
    cpu::linear(moe_gate_.data(), n, down.matrix(e), moe_out_.data());
    for (int64_t i = 0; i < n; ++i) {
      float* o = out + moe_rows_[size_t(i)] * hidden;
      const float* y = moe_out_.data() + i * hidden;
      const float w = moe_w_[size_t(i)];
      for (int64_t c = 0; c < hidden; ++c) o[c] += w * y[c];
    }
  }
  if (!shared.out) return;
  for (int64_t r = 0; r < rows; ++r) {
    const float gate_r = 1.0f / (1.0f + std::exp(-shared.logit[r]));  // sigmoid
    const float* s = shared.out + r * hidden;
    float* o = out + r * hidden;
    for (int64_t c = 0; c < hidden; ++c) o[c] += gate_r * s[c];
  }
}

}  // namespace ninfer::cpu
