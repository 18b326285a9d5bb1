#include "runtime/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "errors.h"

namespace ninfer {
namespace {

void require(bool ok, const char* field, const std::string& rule, double value) {
  if (!ok) throw EngineError("invalid sampling value: " + std::string(field) + " = " + std::to_string(value) +
                             " (" + rule + ")");
}

// The kept tokens of a distribution, most likely first, with unnormalised probabilities.
struct Candidates {
  std::vector<int32_t> tokens;
  std::vector<double> weights;
};

std::vector<float> penalised(std::span<const float> logits, const SamplingParams& p, const TokenHistory& history) {
  std::vector<float> z(logits.begin(), logits.end());
  if (p.repetition_penalty != 1.0f)
    for (const auto& [token, count] : history.seen) {
      float& v = z[token];
      v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
    }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
    for (const auto& [token, count] : history.generated)
      z[token] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
  return z;
}

int32_t argmax(const std::vector<float>& z) {
  return static_cast<int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
}

// NOTE: filter order follows HF transformers' logits processors: temperature, top-k, top-p, min-p.
Candidates filtered(std::span<const float> logits, const SamplingParams& p, const TokenHistory& history) {
  std::vector<float> z = penalised(logits, p, history);
  if (p.temperature == 0.0f) return {{argmax(z)}, {1.0}};

  const int64_t vocab = static_cast<int64_t>(z.size());
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  const auto more_likely = [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); };
  int64_t k = p.top_k > 0 ? std::min<int64_t>(p.top_k, vocab) : vocab;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), more_likely);
  order.resize(k);
  // Tokens a mask removed (-inf) are never candidates, even when rounding in the draw would reach them.
  while (order.size() > 1 && z[order.back()] == -std::numeric_limits<float>::infinity()) order.pop_back();
  k = static_cast<int64_t>(order.size());

  const double zmax = z[order[0]];
  const double inv_t = 1.0 / p.temperature;
  Candidates c;
  c.tokens = std::move(order);
  c.weights.resize(k);
  double total = 0;
  for (int64_t i = 0; i < k; ++i) total += c.weights[i] = std::exp((z[c.tokens[i]] - zmax) * inv_t);

  int64_t keep = k;
  if (p.top_p < 1.0f) {
    double cumulative = 0;
    for (keep = 0; keep < k;) {
      cumulative += c.weights[keep++] / total;
      if (cumulative >= p.top_p) break;
    }
  }
  if (p.min_p > 0.0f) {
    // weights[0] is the largest, exp(0) = 1: the threshold is min_p itself.
    int64_t above = 1;
    while (above < keep && c.weights[above] >= p.min_p) ++above;
    keep = above;
  }
  c.tokens.resize(keep);
  c.weights.resize(keep);
  return c;
}

}  // namespace

void sampling_params_validate(const SamplingParams& p) {
  require(std::isfinite(p.temperature) && p.temperature >= 0 && p.temperature <= 100, "temperature",
          "must be in [0, 100]", p.temperature);
  require(p.top_k >= 0, "top_k", "must be >= 0, 0 disables it", p.top_k);
  require(std::isfinite(p.top_p) && p.top_p > 0 && p.top_p <= 1, "top_p", "must be in (0, 1]", p.top_p);
  require(std::isfinite(p.min_p) && p.min_p >= 0 && p.min_p <= 1, "min_p", "must be in [0, 1]", p.min_p);
  require(std::isfinite(p.presence_penalty) && std::fabs(p.presence_penalty) <= 2, "presence_penalty",
          "must be in [-2, 2]", p.presence_penalty);
  require(std::isfinite(p.frequency_penalty) && std::fabs(p.frequency_penalty) <= 2, "frequency_penalty",
          "must be in [-2, 2]", p.frequency_penalty);
  require(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0 && p.repetition_penalty <= 10,
          "repetition_penalty", "must be in (0, 10]", p.repetition_penalty);
  require(p.top_logprobs >= 0 && p.top_logprobs <= 20, "top_logprobs", "must be in [0, 20]", p.top_logprobs);
}

void TokenHistory::add_prompt(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) ++seen[t];
}

void TokenHistory::add_generated(int32_t token) {
  ++seen[token];
  ++generated[token];
}

int64_t apply_token_mask(std::span<float> logits, std::span<const uint32_t> mask) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  const int64_t covered = std::min<int64_t>(vocab, static_cast<int64_t>(mask.size()) * 32);
  int64_t allowed = 0;
  for (int64_t t = 0; t < covered; ++t) {
    if ((mask[t >> 5] >> (t & 31)) & 1u)
      ++allowed;
    else
      logits[t] = -std::numeric_limits<float>::infinity();
  }
  std::fill(logits.begin() + covered, logits.end(), -std::numeric_limits<float>::infinity());
  return allowed;
}

int64_t token_mask_allowed(std::span<const uint32_t> mask, int64_t vocab) {
  const int64_t covered = std::min<int64_t>(vocab, static_cast<int64_t>(mask.size()) * 32);
  int64_t allowed = 0;
  for (int64_t w = 0; w * 32 < covered; ++w) {
    const int64_t bits = std::min<int64_t>(32, covered - w * 32);
    allowed += std::popcount(bits == 32 ? mask[w] : mask[w] & ((1u << bits) - 1u));
  }
  return allowed;
}

std::vector<float> log_softmax(std::span<const float> logits) {
  const float zmax = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - zmax);
  const double log_sum = std::log(sum) + zmax;
  std::vector<float> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<float>(logits[i] - log_sum);
  return out;
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params), seed_(params.has_seed ? params.seed : std::random_device{}()), rng_(seed_) {}

std::vector<float> Sampler::distribution(std::span<const float> logits, const TokenHistory& history) const {
  const Candidates c = filtered(logits, params_, history);
  const double total = std::accumulate(c.weights.begin(), c.weights.end(), 0.0);
  std::vector<float> probs(logits.size(), 0.0f);
  for (size_t i = 0; i < c.tokens.size(); ++i) probs[c.tokens[i]] = static_cast<float>(c.weights[i] / total);
  return probs;
}

SampledToken Sampler::sample(std::span<const float> logits, const TokenHistory& history) {
  const Candidates c = filtered(logits, params_, history);
  SampledToken out;
  out.token = c.tokens[0];
  if (c.tokens.size() > 1) {
    const double total = std::accumulate(c.weights.begin(), c.weights.end(), 0.0);
    double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
    size_t i = 0;
    while (i + 1 < c.tokens.size() && u >= c.weights[i]) u -= c.weights[i++];
    out.token = c.tokens[i];
  }
  if (params_.logprobs || params_.top_logprobs > 0) {
    const std::vector<float> lp = log_softmax(logits);
    out.logprob = lp[out.token];
    const int64_t n = std::min<int64_t>(params_.top_logprobs, static_cast<int64_t>(lp.size()));
    std::vector<int32_t> order(lp.size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n, order.end(),
                      [&](int32_t a, int32_t b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
    for (int64_t i = 0; i < n; ++i) out.top.emplace_back(order[i], lp[order[i]]);
  }
  return out;
}

}  // namespace ninfer
