// Token choice from logits: greedy, or seeded temperature / top-k / top-p sampling.
#pragma once

#include <cstdint>
#include <random>

#include <ATen/ATen.h>

#include "absl/status/status.h"

namespace tophat {

struct SamplingParams {
  double temperature = 0.0;  // 0 means greedy
  int64_t top_k = 0;         // 0 keeps every token
  double top_p = 1.0;        // nucleus mass kept, in (0, 1]
  uint64_t seed = 0;

  absl::Status Validate() const;
  bool greedy() const { return temperature <= 0.0; }
};

// Draws an index from a [V] probability vector (not necessarily normalised) with `rng`.
int32_t DrawIndex(const at::Tensor& probs, std::mt19937_64& rng);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

  // logits: [V] float32. Greedy takes the lowest index among equal maxima.
  int32_t Sample(const at::Tensor& logits);

  // The distribution Sample() draws from, [V] float32 summing to 1: softmax(logits / T)
  // restricted to the top-k and top-p set and renormalised. Speculative sampling needs it.
  at::Tensor Distribution(const at::Tensor& logits) const;

  // Draws an index from a [V] probability vector with this sampler's generator.
  int32_t Draw(const at::Tensor& probs);

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace tophat
