// Verification of a speculative draft against the target model's distributions (DESIGN.md,
// request path step 4): greedy longest-prefix acceptance, and speculative sampling (accept
// with min(1, p/q), otherwise resample from norm(max(0, p - q))), which is lossless in
// distribution. Pure functions over [positions, vocab] tensors; no model, no I/O.
#pragma once

#include <cstdint>
#include <random>
#include <span>

#include <ATen/ATen.h>

namespace tophat {

struct VerifyResult {
  int64_t accepted = 0;    // leading draft tokens kept
  int32_t next_token = 0;  // the target's correction, or the bonus token when all were kept
};

// target_logits: [n + 1, V] float32, row i scoring the token after draft position i - 1
// (row 0 follows the last accepted token). drafts: n tokens. Keeps drafts while each equals
// the target's argmax (lowest index among equal maxima, as Sampler does), then takes the
// target's argmax at the first disagreement or after the last draft.
VerifyResult VerifyGreedy(const at::Tensor& target_logits, std::span<const int32_t> drafts);

// target_probs: [n + 1, V], draft_probs: [n, V], both float32 rows summing to 1 (the
// distributions the tokens were or would be sampled from, after temperature/top-k/top-p).
// drafts[i] was drawn from draft_probs[i]. Draft i is kept with probability
// min(1, p_i(x) / q_i(x)); at the first rejection the next token is drawn from
// norm(max(0, p_i - q_i)); if all are kept, from p_n.
//
// `forced` (empty, or one flag per draft): a draft the answer's format forced has no row in
// draft_probs, which holds the other drafts' rows in order; its q is all mass on the token,
// as if the row were one-hot (the same draws, without a vocabulary-sized row for each).
VerifyResult VerifySpeculativeSampling(const at::Tensor& target_probs,
                                       const at::Tensor& draft_probs,
                                       std::span<const int32_t> drafts, std::mt19937_64& rng,
                                       std::span<const uint8_t> forced = {});

}  // namespace tophat
