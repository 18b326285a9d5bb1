#include "runtime/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <unordered_set>

#include "errors.h"

namespace ninfer {
namespace {

void require(bool ok, const char* field, const std::string& rule, double value) {
  if (!ok) throw EngineError("invalid sampling value: " + std::string(field) + " = " + std::to_string(value) +
                             " (" + rule + ")");
}

// The candidates a chain's stages narrow and reweight: tokens with their (adjusted) logits. `identity` while every
// vocabulary token is there in id order (token i at index i), `sorted` while most likely first.
struct Candidates {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  bool identity = true;
  bool sorted = false;

  size_t size() const { return tokens.size(); }
  void keep(size_t n) {
    if (n < tokens.size()) identity = false;
    tokens.resize(n);
    logits.resize(n);
  }
};

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Adds delta[token] to the logit of each candidate token the map names.
void add_to_logits(Candidates& c, const std::unordered_map<int32_t, float>& delta) {
  if (c.identity) {
    for (const auto& [token, d] : delta) c.logits[token] += d;
    return;
  }
  for (size_t i = 0; i < c.size(); ++i)
    if (const auto it = delta.find(c.tokens[i]); it != delta.end()) c.logits[i] += it->second;
}

// Keeps the `n` most likely candidates, most likely first (ties: the lower token id first, a total order, so the
// result is the same whether the whole set is sorted or only its top n). Top-k over a 248k vocabulary sorts 40,
// and in the identity layout (an index is its token id) it sorts the token ids in place: no index array.
void keep_most_likely(Candidates& c, size_t n) {
  n = std::min(n, c.size());
  if (c.sorted) {
    c.keep(n);
    return;
  }
  const bool identity = c.identity;
  std::vector<int32_t> order;
  if (identity) {
    order.swap(c.tokens);
  } else {
    order.resize(c.size());
    std::iota(order.begin(), order.end(), 0);
  }
  const auto token_of = [&](int32_t i) { return identity ? i : c.tokens[static_cast<size_t>(i)]; };
  const auto more_likely = [&](int32_t a, int32_t b) {
    const float la = c.logits[static_cast<size_t>(a)], lb = c.logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && token_of(a) < token_of(b));
  };
  if (n == order.size())
    std::sort(order.begin(), order.end(), more_likely);
  else
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(), more_likely);
  Candidates out;
  out.identity = false;
  out.sorted = true;
  out.tokens.reserve(n);
  out.logits.reserve(n);
  for (size_t k = 0; k < n; ++k) {
    out.tokens.push_back(token_of(order[k]));
    out.logits.push_back(c.logits[static_cast<size_t>(order[k])]);
  }
  c = std::move(out);
}

void sort_candidates(Candidates& c) { keep_most_likely(c, c.size()); }

// Drops tokens a mask removed (-inf): they are never candidates, even when rounding in the draw would reach them.
void drop_impossible(Candidates& c) {
  sort_candidates(c);
  size_t n = c.size();
  while (n > 1 && c.logits[n - 1] == kNegInf) --n;
  c.keep(n);
}

// softmax of the candidates' logits, in their order.
std::vector<double> probabilities(const Candidates& c) {
  const float zmax = *std::max_element(c.logits.begin(), c.logits.end());
  std::vector<double> p(c.size());
  double total = 0;
  for (size_t i = 0; i < c.size(); ++i) total += p[i] = std::exp(static_cast<double>(c.logits[i]) - zmax);
  for (double& v : p) v /= total;
  return p;
}

// Token counts over the window the penalties read: the whole history, or its last `last_n` tokens.
struct PenaltyCounts {
  std::unordered_map<int32_t, int32_t> seen, generated;
};

PenaltyCounts window_counts(const TokenHistory& h, int32_t last_n) {
  PenaltyCounts counts;
  const size_t n = h.sequence.size();
  const size_t from = n - std::min<size_t>(n, static_cast<size_t>(last_n));
  for (size_t i = from; i < n; ++i) {
    ++counts.seen[h.sequence[i]];
    if (i >= h.prompt_length) ++counts.generated[h.sequence[i]];
  }
  return counts;
}

void apply_penalties(Candidates& c, const SamplingParams& p, const TokenHistory& history) {
  PenaltyCounts windowed;
  if (p.penalty_last_n >= 0) windowed = window_counts(history, p.penalty_last_n);
  const auto& seen = p.penalty_last_n >= 0 ? windowed.seen : history.seen;
  const auto& generated = p.penalty_last_n >= 0 ? windowed.generated : history.generated;
  std::unordered_map<int32_t, float> delta;
  if (p.repetition_penalty != 1.0f) {
    // The CTRL penalty scales a logit: as a difference it depends on the logit, read from the identity layout or
    // looked up (candidates may be any subset by now).
    std::unordered_map<int32_t, size_t> index;
    if (!c.identity)
      for (size_t i = 0; i < c.size(); ++i) index.emplace(c.tokens[i], i);
    for (const auto& [token, count] : seen) {
      size_t i = static_cast<size_t>(token);
      if (!c.identity) {
        const auto it = index.find(token);
        if (it == index.end()) continue;
        i = it->second;
      }
      float& v = c.logits[i];
      v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
    for (const auto& [token, count] : generated)
      delta[token] = -(p.presence_penalty + p.frequency_penalty * static_cast<float>(count));
  add_to_logits(c, delta);
}

// DRY ("don't repeat yourself", as llama.cpp and koboldcpp define it): a token that would extend a repeat of
// length L >= allowed_length of an earlier stretch of the context loses multiplier * base^(L - allowed_length).
// Repeats do not reach back across a breaker token, and a breaker itself is never penalised. The match lengths come
// from a Z-algorithm pass over the reversed window (linear); the tests' reference compares every pair directly.
void apply_dry(Candidates& c, const SamplingParams& p, const TokenHistory& history) {
  if (p.dry_multiplier == 0.0f || p.dry_penalty_last_n == 0) return;
  const std::vector<int32_t>& seq = history.sequence;
  const size_t window = p.dry_penalty_last_n < 0 ? seq.size()
                                                 : std::min(seq.size(), static_cast<size_t>(p.dry_penalty_last_n));
  const int64_t allowed = p.dry_allowed_length;
  if (static_cast<int64_t>(window) <= allowed) return;
  // back(i): the token i places before the last one.
  const auto back = [&](size_t i) { return seq[seq.size() - 1 - i]; };
  const std::unordered_set<int32_t> breakers(p.dry_breakers.begin(), p.dry_breakers.end());
  // A repeat ends at the most recent breaker: matches are at most that many tokens long.
  int64_t limit = static_cast<int64_t>(window);
  for (size_t i = 0; i < window; ++i)
    if (breakers.count(back(i))) {
      limit = static_cast<int64_t>(i);
      break;
    }
  if (limit < allowed) return;
  // z[k]: how many tokens before the end match the tokens before position (end - k), i.e. the length of the
  // repeat that the token at back(k - 1) once followed.
  std::vector<int64_t> z(window, 0);
  for (size_t k = 1, left = 0, right = 0; k < window; ++k) {
    int64_t n = 0;
    if (k < right) n = std::min<int64_t>(static_cast<int64_t>(right - k), z[k - left]);
    while (k + n < window && back(n) == back(k + n)) ++n;
    z[k] = n;
    if (k + n > right) left = k, right = k + n;
  }
  std::unordered_map<int32_t, int64_t> longest;  // next token -> the longest repeat it would extend
  for (size_t k = 1; k < window; ++k) {
    const int64_t length = std::min(z[k], limit);
    if (length < allowed) continue;
    int64_t& best = longest[back(k - 1)];
    best = std::max(best, length);
  }
  // The exponent is capped where base^exponent would overflow a float.
  const int64_t max_exponent = p.dry_base > 1.000001f ? static_cast<int64_t>(88.7228391 / std::log(p.dry_base)) : 0;
  std::unordered_map<int32_t, float> delta;
  for (const auto& [token, length] : longest) {
    if (breakers.count(token)) continue;
    int64_t exponent = length - allowed;
    if (max_exponent > 0) exponent = std::min(exponent, max_exponent);
    delta[token] = -p.dry_multiplier * static_cast<float>(std::pow(static_cast<double>(p.dry_base), exponent));
  }
  add_to_logits(c, delta);
}

// Keeps the logits within n standard deviations (over the candidates) of the largest.
void apply_top_n_sigma(Candidates& c, float n) {
  if (n <= 0.0f || c.size() <= 1) return;
  double sum = 0, squares = 0;
  for (float v : c.logits) sum += v;
  const double mean = sum / static_cast<double>(c.size());
  for (float v : c.logits) squares += (v - mean) * (v - mean);
  const double sigma = std::sqrt(squares / static_cast<double>(c.size()));
  const double floor = *std::max_element(c.logits.begin(), c.logits.end()) - n * sigma;
  sort_candidates(c);
  size_t keep = 1;
  while (keep < c.size() && c.logits[keep] >= floor) ++keep;
  c.keep(keep);
}

void apply_top_k(Candidates& c, int32_t k) {
  if (k <= 0 || static_cast<size_t>(k) >= c.size()) return;
  keep_most_likely(c, static_cast<size_t>(k));
}

// Locally typical sampling: tokens whose surprise (-log p) is closest to the entropy, until their mass exceeds p.
void apply_typical_p(Candidates& c, float typical_p) {
  if (typical_p >= 1.0f || c.size() <= 1) return;
  const std::vector<double> p = probabilities(c);
  double entropy = 0;
  for (double v : p)
    if (v > 0) entropy -= v * std::log(v);
  std::vector<double> distance(c.size());
  for (size_t i = 0; i < c.size(); ++i)
    distance[i] = p[i] > 0 ? std::fabs(-std::log(p[i]) - entropy) : std::numeric_limits<double>::infinity();
  std::vector<size_t> order(c.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return distance[a] < distance[b]; });
  size_t keep = order.size();
  double mass = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    mass += p[order[i]];
    if (mass > typical_p) {
      keep = i + 1;
      break;
    }
  }
  Candidates out;
  out.identity = false;
  for (size_t i = 0; i < keep; ++i) {
    out.tokens.push_back(c.tokens[order[i]]);
    out.logits.push_back(c.logits[order[i]]);
  }
  c = std::move(out);
}

void apply_top_p(Candidates& c, float top_p) {
  if (top_p >= 1.0f) return;
  sort_candidates(c);
  const std::vector<double> p = probabilities(c);
  double cumulative = 0;
  size_t keep = 0;
  while (keep < c.size()) {
    cumulative += p[keep++];
    if (cumulative >= top_p) break;
  }
  c.keep(keep);
}

void apply_min_p(Candidates& c, float min_p) {
  if (min_p <= 0.0f) return;
  sort_candidates(c);
  // p / p_max = exp(logit - logit_max): the first logit is the largest.
  const double floor = c.logits[0] + std::log(static_cast<double>(min_p));
  size_t keep = 1;
  while (keep < c.size() && c.logits[keep] >= floor) ++keep;
  c.keep(keep);
}

// Exclude Top Choices: when it fires, removes every token with p >= threshold except the least likely of them.
void apply_xtc(Candidates& c, const SamplingParams& p, bool fires) {
  if (!fires || p.xtc_probability <= 0.0f || p.xtc_threshold > 0.5f || c.size() < 2) return;
  sort_candidates(c);
  const std::vector<double> probs = probabilities(c);
  size_t above = 0;
  while (above < c.size() && probs[above] >= p.xtc_threshold) ++above;
  if (above < 2) return;
  const size_t cut = above - 1;
  c.tokens.erase(c.tokens.begin(), c.tokens.begin() + static_cast<std::ptrdiff_t>(cut));
  c.logits.erase(c.logits.begin(), c.logits.begin() + static_cast<std::ptrdiff_t>(cut));
}

// Temperature; with a dynatemp range, chosen by the candidates' normalised entropy:
// t' = (t - range) + 2 range (H / log n)^exponent, floored at 0.
void apply_temperature(Candidates& c, const SamplingParams& p) {
  double t = p.temperature;
  if (p.dynatemp_range > 0.0f && c.size() > 1) {
    const std::vector<double> probs = probabilities(c);
    double entropy = 0;
    for (double v : probs)
      if (v > 0) entropy -= v * std::log(v);
    const double low = std::max(0.0, t - p.dynatemp_range), high = t + p.dynatemp_range;
    t = low + (high - low) * std::pow(entropy / std::log(static_cast<double>(c.size())), p.dynatemp_exponent);
  }
  if (t <= 0) {  // keep the most likely token alone
    sort_candidates(c);
    c.keep(1);
    return;
  }
  const double inv_t = 1.0 / t;
  for (float& v : c.logits) v = static_cast<float>(v * inv_t);
}

int32_t argmax(const Candidates& c) {
  size_t best = 0;
  for (size_t i = 1; i < c.size(); ++i)
    if (c.logits[i] > c.logits[best] || (c.logits[i] == c.logits[best] && c.tokens[i] < c.tokens[best])) best = i;
  return c.tokens[best];
}

// The chain's candidates with their (unnormalised) weights exp(logit - max); greedy leaves the argmax of the
// penalised logits alone.
struct Weighted {
  std::vector<int32_t> tokens;
  std::vector<double> weights;
};

Weighted filtered(std::span<const float> logits, const SamplingParams& p, const TokenHistory& history,
                  bool xtc_fires) {
  Candidates c;
  c.logits.assign(logits.begin(), logits.end());
  c.tokens.resize(logits.size());
  std::iota(c.tokens.begin(), c.tokens.end(), 0);
  const std::vector<SamplerStage>& order = p.order.empty() ? sampler_default_order() : p.order;
  const bool greedy = p.temperature == 0.0f;
  for (SamplerStage stage : order) {
    // Greedy takes the argmax once the logits are penalised: the filters cannot change it.
    if (greedy && stage != SamplerStage::Penalties && stage != SamplerStage::Dry) continue;
    switch (stage) {
      case SamplerStage::Penalties: apply_penalties(c, p, history); break;
      case SamplerStage::Dry: apply_dry(c, p, history); break;
      case SamplerStage::TopNSigma: apply_top_n_sigma(c, p.top_n_sigma); break;
      case SamplerStage::TopK: apply_top_k(c, p.top_k); break;
      case SamplerStage::TypicalP: apply_typical_p(c, p.typical_p); break;
      case SamplerStage::TopP: apply_top_p(c, p.top_p); break;
      case SamplerStage::MinP: apply_min_p(c, p.min_p); break;
      case SamplerStage::Xtc: apply_xtc(c, p, xtc_fires); break;
      case SamplerStage::Temperature: apply_temperature(c, p); break;
    }
    if (!c.identity && c.size() > 1) drop_impossible(c);
  }
  if (greedy) return {{argmax(c)}, {1.0}};
  drop_impossible(c);
  Weighted w;
  w.tokens = std::move(c.tokens);
  const float zmax = c.logits[0];
  for (float v : c.logits) w.weights.push_back(std::exp(static_cast<double>(v) - zmax));
  return w;
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
  require(p.penalty_last_n >= -1, "repeat_last_n", "must be >= -1, -1 counts every token", p.penalty_last_n);
  require(std::isfinite(p.typical_p) && p.typical_p > 0 && p.typical_p <= 1, "typical_p", "must be in (0, 1]",
          p.typical_p);
  require(std::isfinite(p.top_n_sigma) && p.top_n_sigma <= 100, "top_n_sigma", "must be <= 100, <= 0 disables it",
          p.top_n_sigma);
  require(std::isfinite(p.dynatemp_range) && p.dynatemp_range >= 0 && p.dynatemp_range <= 100, "dynatemp_range",
          "must be in [0, 100]", p.dynatemp_range);
  require(std::isfinite(p.dynatemp_exponent) && p.dynatemp_exponent >= 0 && p.dynatemp_exponent <= 100,
          "dynatemp_exponent", "must be in [0, 100]", p.dynatemp_exponent);
  require(std::isfinite(p.xtc_probability) && p.xtc_probability >= 0 && p.xtc_probability <= 1, "xtc_probability",
          "must be in [0, 1]", p.xtc_probability);
  require(std::isfinite(p.xtc_threshold) && p.xtc_threshold >= 0 && p.xtc_threshold <= 1, "xtc_threshold",
          "must be in [0, 1], above 0.5 disables it", p.xtc_threshold);
  require(std::isfinite(p.dry_multiplier) && p.dry_multiplier >= 0 && p.dry_multiplier <= 100, "dry_multiplier",
          "must be in [0, 100]", p.dry_multiplier);
  require(std::isfinite(p.dry_base) && p.dry_base >= 1 && p.dry_base <= 100, "dry_base", "must be in [1, 100]",
          p.dry_base);
  require(p.dry_allowed_length >= 0, "dry_allowed_length", "must be >= 0", p.dry_allowed_length);
  require(p.dry_penalty_last_n >= -1, "dry_penalty_last_n", "must be >= -1, -1 looks at every token",
          p.dry_penalty_last_n);
}

const std::vector<SamplerStage>& sampler_default_order() {
  using S = SamplerStage;
  static const std::vector<SamplerStage> order = {S::Penalties, S::Dry,  S::TopNSigma, S::TopK,    S::Temperature,
                                                  S::TopP,      S::MinP, S::TypicalP,  S::Xtc};
  return order;
}

bool needs_host_sampler(const SamplingParams& p) {
  return !p.order.empty() || p.penalty_last_n >= 0 || p.typical_p < 1.0f || p.top_n_sigma > 0.0f ||
         p.dynatemp_range > 0.0f || p.xtc_probability > 0.0f || p.dry_multiplier > 0.0f;
}

bool reads_token_counts(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

void TokenHistory::add_prompt(std::span<const int32_t> tokens) {
  if (counted)
    for (int32_t t : tokens) ++seen[t];
  sequence.insert(sequence.end(), tokens.begin(), tokens.end());
  prompt_length = sequence.size();
}

void TokenHistory::add_generated(int32_t token) {
  if (counted) {
    ++seen[token];
    ++generated[token];
  }
  sequence.push_back(token);
}

std::span<const float> masked_logits(std::span<const float> logits, std::span<const uint32_t> mask,
                                     std::vector<float>& scratch) {
  if (mask.empty()) return logits;
  scratch.assign(logits.begin(), logits.end());
  apply_token_mask(scratch, mask);
  return scratch;
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

std::vector<float> Sampler::distribution(std::span<const float> logits, const TokenHistory& history,
                                        bool xtc_fires) const {
  const Weighted c = filtered(logits, params_, history, xtc_fires);
  const double total = std::accumulate(c.weights.begin(), c.weights.end(), 0.0);
  std::vector<float> probs(logits.size(), 0.0f);
  for (size_t i = 0; i < c.tokens.size(); ++i) probs[c.tokens[i]] = static_cast<float>(c.weights[i] / total);
  return probs;
}

SampledToken Sampler::sample(std::span<const float> logits, const TokenHistory& history) {
  // XTC's coin comes first and only when XTC is on, so that other requests' draws are what they always were.
  const bool xtc_fires =
      params_.xtc_probability > 0.0f && std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < params_.xtc_probability;
  const Weighted c = filtered(logits, params_, history, xtc_fires);
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
