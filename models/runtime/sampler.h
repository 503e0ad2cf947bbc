// Token choice from logits: greedy, or seeded temperature / top-k / top-p sampling.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <span>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"

namespace tophat {

struct SamplingParams {
  double temperature = 0.0;  // 0 means greedy
  int64_t top_k = 0;         // 0 keeps every token
  double top_p = 1.0;        // nucleus mass kept, in (0, 1]
  uint64_t seed = 0;
  // Added to the logits of these token ids before any choice (OpenAI's logit_bias, each in
  // [-100, 100]: -100 bans a token, 100 all but forces it). The ids are the caller's to check
  // against the vocabulary.
  std::vector<std::pair<int32_t, float>> logit_bias;

  absl::Status Validate() const;
  bool greedy() const { return temperature <= 0.0; }
};

// Draws an index from a [V] probability vector (not necessarily normalised) with `rng`.
int32_t DrawIndex(const at::Tensor& probs, std::mt19937_64& rng);

// A generated token's log-probability, and the likeliest tokens at its position.
struct TokenLogprob {
  float logprob = 0;
  std::vector<int32_t> top_ids;     // likeliest first
  std::vector<float> top_logprobs;  // one per top_ids entry
};

// The log-probabilities of `tokens` under the model's own distribution: the log-softmax of
// the logits, before temperature, top-k and top-p (what OpenAI's `logprobs` report, and
// vLLM's by default), each with the `top` likeliest tokens of its row. logits: [n, V], row
// i the one that decided tokens[i]. Computed in float32 whatever the logits' dtype.
std::vector<TokenLogprob> TokenLogprobs(const at::Tensor& logits, std::span<const int32_t> tokens,
                                        int64_t top);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // logits: [V] float32, the model's. Greedy takes the lowest index among equal maxima of
  // the biased logits.
  int32_t Sample(const at::Tensor& logits);

  // The distribution Sample() draws from, [V] float32 summing to 1: softmax(biased logits /
  // T) restricted to the top-k and top-p set and renormalised. Speculative sampling needs it.
  at::Tensor Distribution(const at::Tensor& logits) const;

  // The logits with logit_bias added ([V] or [n, V], the vocabulary last): what greedy
  // choices compare. The same tensor, not a copy, without a bias.
  at::Tensor Biased(const at::Tensor& logits) const;

  // Draws an index from a [V] probability vector with this sampler's generator.
  int32_t Draw(const at::Tensor& probs);

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  // logit_bias as tensors, for one index_add.
  at::Tensor bias_ids_;     // [k] int64
  at::Tensor bias_values_;  // [k] float32
};

}  // namespace tophat
