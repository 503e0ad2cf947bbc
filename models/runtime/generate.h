// Autoregressive generation through a pipeline of submodels on one machine: the monolithic
// model is a pipeline of one; the HAT split is input -> middle -> output.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "models/runtime/sampler.h"
#include "models/runtime/submodel.h"

namespace tophat {

struct GenerationOptions {
  int64_t max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // generation ends after emitting one of these
  // Prompt positions per forward pass; 0 runs the whole prompt at once.
  int64_t prefill_chunk = 0;
};

enum class FinishReason { kStop, kLength, kCancelled };

struct GenerationResult {
  std::vector<int32_t> tokens;
  FinishReason finish_reason = FinishReason::kLength;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
};

// Called with each new token; returning false cancels generation.
using TokenCallback = std::function<bool(int32_t token)>;

// The submodels must chain: the first holds the embedding, the last the head, and their
// layer ranges are contiguous. Each keeps its own KV cache, as on separate machines.
class PipelineGenerator {
 public:
  static absl::StatusOr<PipelineGenerator> Create(std::vector<const Submodel*> stages);

  absl::StatusOr<GenerationResult> Generate(const std::vector<int32_t>& prompt,
                                            const GenerationOptions& options,
                                            const TokenCallback& on_token = {});

  // Logits of `tokens` continuing the current caches: [T, V], or [1, V] for the last token
  // only when `last_only` (what generation needs; it skips the LM head for the others).
  absl::StatusOr<at::Tensor> Step(const std::vector<int32_t>& tokens, bool last_only = false);
  void Reset();
  int64_t length() const { return caches_.empty() ? 0 : caches_.front().length(); }

 private:
  explicit PipelineGenerator(std::vector<const Submodel*> stages);

  std::vector<const Submodel*> stages_;
  std::vector<KvCache> caches_;
};

}  // namespace tophat
