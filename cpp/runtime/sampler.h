// The sampler: turns one row of logits into a token, with the request's own RNG stream so that a seeded request
// gives the same tokens whatever else the engine is running.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ninfer {

// The stages of a sampler chain (llama.cpp's names: penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc,
// temperature). A request that names an order runs exactly those stages in that order.
enum class SamplerStage : uint8_t { Penalties, Dry, TopNSigma, TopK, TypicalP, TopP, MinP, Xtc, Temperature };

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  int32_t top_k = 0;                // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off; keeps tokens with p >= min_p * p_max
  float presence_penalty = 0.0f;    // OpenAI: subtracted once from every token generated so far
  float frequency_penalty = 0.0f;   // OpenAI: subtracted per occurrence in the generated tokens
  float repetition_penalty = 1.0f;  // CTRL: divides positive / multiplies negative logits of prompt + generated
  // The last this many tokens of prompt + output are what the penalties count (-1 = all; llama.cpp's repeat_last_n).
  int32_t penalty_last_n = -1;
  float typical_p = 1.0f;           // 1 = off (locally typical sampling)
  float top_n_sigma = -1.0f;        // <= 0 = off; keeps logits within n standard deviations of the largest
  float dynatemp_range = 0.0f;      // 0 = off; the temperature moves in [t - range, t + range] with the entropy
  float dynatemp_exponent = 1.0f;
  float xtc_probability = 0.0f;     // 0 = off; chance per token that XTC removes the likeliest tokens
  float xtc_threshold = 0.1f;       // XTC removes all tokens with p >= threshold but the least likely of them
  float dry_multiplier = 0.0f;      // 0 = off (DRY: penalises tokens that would extend a repeated sequence)
  float dry_base = 1.75f;
  int32_t dry_allowed_length = 2;   // repeats up to this long go unpenalised
  int32_t dry_penalty_last_n = -1;  // how far back DRY looks (-1 = all of prompt + output)
  std::vector<int32_t> dry_breakers;  // tokens a repeated sequence may not extend across
  std::vector<SamplerStage> order;    // empty: the default chain (sampler_default_order)
  bool has_seed = false;
  uint64_t seed = 0;
  bool logprobs = false;            // return the chosen token's logprob
  int32_t top_logprobs = 0;         // and this many alternatives (0..20)
};

// Throws EngineError naming the field and the accepted range for any invalid value.
void sampling_params_validate(const SamplingParams& params);

// The chain a request that names no order runs: the penalties, then the filters in Hugging Face's order (the
// temperature before top-p and min-p) with the stages HF lacks after them.
const std::vector<SamplerStage>& sampler_default_order();

// Whether a request uses a stage only the host sampler has (the device sampler implements penalties, temperature,
// top-k, top-p and min-p in the default order): its logits must come to the host.
bool needs_host_sampler(const SamplingParams& params);

using TokenLogprob = std::pair<int32_t, float>;

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;             // from the unmodified log-softmax of the logits
  std::vector<TokenLogprob> top;    // the top_logprobs most likely tokens of that same distribution
};

// Whether sampling with `params` reads a history's token counts (the repetition, presence and frequency
// penalties).
bool reads_token_counts(const SamplingParams& params);

// The tokens a request has seen, which the penalties and DRY read.
struct TokenHistory {
  std::unordered_map<int32_t, int32_t> generated;  // token -> occurrences in the output so far
  std::unordered_map<int32_t, int32_t> seen;       // token -> occurrences in prompt + output
  std::vector<int32_t> sequence;                   // prompt + output, in order
  size_t prompt_length = 0;
  // false: `generated` and `seen` stay empty, for a request whose sampling reads no counts (reads_token_counts):
  // counting a 120k-token prompt took ~10 ms of its admission, and the device sampler uploads the counts of every
  // row it draws.
  bool counted = true;
  void add_prompt(std::span<const int32_t> tokens);
  void add_generated(int32_t token);
};

class Sampler {
 public:
  // Unseeded requests draw their seed from std::random_device: still a private stream.
  explicit Sampler(const SamplingParams& params);

  SampledToken sample(std::span<const float> logits, const TokenHistory& history);

  // The distribution `sample` draws from (after the chain's stages), as probabilities over the whole vocabulary;
  // greedy puts 1 on the argmax. XTC acts on a random share of tokens: `xtc_fires` says whether it does on this one.
  // Exposed for the reference test.
  std::vector<float> distribution(std::span<const float> logits, const TokenHistory& history,
                                  bool xtc_fires = true) const;

  // The request's seed, or the one drawn for it: a device sampler keys its counter-based draws with it.
  uint64_t seed() const { return seed_; }

 private:
  SamplingParams params_;
  uint64_t seed_;
  std::mt19937_64 rng_;
};

// 32-bit words in a token mask over `vocab` tokens: bit t % 32 of word t / 32 allows token t.
inline int64_t token_mask_words(int64_t vocab) { return (vocab + 31) / 32; }

// Sets the logits of tokens `mask` disallows to -inf, in place; returns how many tokens stay allowed.
int64_t apply_token_mask(std::span<float> logits, std::span<const uint32_t> mask);
// `logits` under `mask` (empty: unconstrained, `logits` itself), masked in `scratch`: what a constrained row is
// drawn from, so its logprobs too are those of the constrained distribution.
std::span<const float> masked_logits(std::span<const float> logits, std::span<const uint32_t> mask,
                                     std::vector<float>& scratch);
// How many of the first `vocab` tokens `mask` allows (what apply_token_mask returns, without logits).
int64_t token_mask_allowed(std::span<const uint32_t> mask, int64_t vocab);

// log-softmax of `logits` (numerically stable, double accumulation).
std::vector<float> log_softmax(std::span<const float> logits);

}  // namespace ninfer
