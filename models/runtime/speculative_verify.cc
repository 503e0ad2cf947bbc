#include "models/runtime/speculative_verify.h"

#include <algorithm>
#include <vector>

namespace tophat {
namespace {

int32_t ArgmaxRow(const float* row, int64_t vocab) {
  int32_t best = 0;
  for (int64_t v = 1; v < vocab; ++v) {
    if (row[v] > row[best]) best = static_cast<int32_t>(v);
  }
  return best;
}

// Draws an index from unnormalised non-negative weights.
int32_t DrawWeighted(const float* weights, int64_t vocab, std::mt19937_64& rng) {
  double total = 0;
  for (int64_t v = 0; v < vocab; ++v) total += weights[v];
  std::uniform_real_distribution<double> uniform(0.0, total);
  double u = uniform(rng);
  int32_t last_positive = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    if (weights[v] <= 0) continue;
    last_positive = static_cast<int32_t>(v);
    if (u < weights[v]) return last_positive;
    u -= weights[v];
  }
  return last_positive;  // rounding at the top end
}

}  // namespace

VerifyResult VerifyGreedy(const at::Tensor& target_logits, std::span<const int32_t> drafts) {
  const at::Tensor logits = target_logits.to(at::kFloat).contiguous();
  const int64_t vocab = logits.size(1);
  const float* data = logits.data_ptr<float>();
  VerifyResult result;
  for (const int32_t draft : drafts) {
    const int32_t target = ArgmaxRow(data + result.accepted * vocab, vocab);
    if (target != draft) {
      result.next_token = target;
      return result;
    }
    ++result.accepted;
  }
  result.next_token = ArgmaxRow(data + result.accepted * vocab, vocab);
  return result;
}

VerifyResult VerifySpeculativeSampling(const at::Tensor& target_probs,
                                       const at::Tensor& draft_probs,
                                       std::span<const int32_t> drafts, std::mt19937_64& rng,
                                       std::span<const uint8_t> forced) {
  const at::Tensor p = target_probs.to(at::kFloat).contiguous();
  const at::Tensor q = draft_probs.to(at::kFloat).contiguous();
  const int64_t vocab = p.size(1);
  const float* p_data = p.data_ptr<float>();
  const float* q_data = q.numel() > 0 ? q.data_ptr<float>() : nullptr;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<float> residual(vocab);
  VerifyResult result;
  int64_t q_rows_used = 0;
  for (size_t i = 0; i < drafts.size(); ++i) {
    const int32_t draft = drafts[i];
    const bool is_forced = !forced.empty() && forced[i] != 0;
    const float* p_row = p_data + result.accepted * vocab;
    const float* q_row = is_forced ? nullptr : q_data + q_rows_used++ * vocab;
    const double p_x = p_row[draft];
    const double q_x = is_forced ? 1.0 : q_row[draft];
    // q_x > 0 for a token that was drawn from q; guard anyway so a zero never divides.
    if (q_x > 0 && uniform(rng) < std::min(1.0, p_x / q_x)) {
      ++result.accepted;
      continue;
    }
    bool any = false;
    for (int64_t v = 0; v < vocab; ++v) {
      const float q_v = is_forced ? (v == draft ? 1.0f : 0.0f) : q_row[v];
      residual[v] = std::max(0.0f, p_row[v] - q_v);
      any |= residual[v] > 0;
    }
    // p == q leaves no residual mass, but then the draft cannot be rejected; fall back to p.
    result.next_token = DrawWeighted(any ? residual.data() : p_row, vocab, rng);
    return result;
  }
  result.next_token = DrawWeighted(p_data + result.accepted * vocab, vocab, rng);
  return result;
}

}  // namespace tophat
