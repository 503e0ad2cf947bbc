#include "models/runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tophat {

absl::StatusOr<PipelineGenerator> PipelineGenerator::Create(std::vector<const Submodel*> stages) {
  if (stages.empty()) return absl::InvalidArgumentError("a pipeline needs at least one submodel");
  if (!stages.front()->spec().embedding) {
    return absl::InvalidArgumentError("the first submodel of a pipeline must hold the embedding");
  }
  if (!stages.back()->spec().head) {
    return absl::InvalidArgumentError("the last submodel of a pipeline must hold the LM head");
  }
  for (size_t i = 1; i < stages.size(); ++i) {
    if (stages[i]->spec().layers.begin != stages[i - 1]->spec().layers.end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "submodel ", i, " starts at layer ", stages[i]->spec().layers.begin,
          " but the previous one ends at layer ", stages[i - 1]->spec().layers.end));
    }
  }
  if (stages.back()->spec().layers.end != stages.front()->config().num_hidden_layers) {
    return absl::InvalidArgumentError("the pipeline does not cover every decoder layer");
  }
  return PipelineGenerator(std::move(stages));
}

PipelineGenerator::PipelineGenerator(std::vector<const Submodel*> stages)
    : stages_(std::move(stages)) {
  int64_t capacity = stages_.front()->max_context();
  for (const Submodel* s : stages_) capacity = std::min(capacity, s->max_context());
  for (const Submodel* s : stages_) caches_.push_back(s->NewCache(capacity));
}

void PipelineGenerator::Reset() {
  for (KvCache& c : caches_) c.Clear();
}

absl::StatusOr<at::Tensor> PipelineGenerator::Step(const std::vector<int32_t>& tokens,
                                                   bool last_only) {
  std::vector<int64_t> ids(tokens.begin(), tokens.end());
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor hidden, stages_.front()->Embed(at::tensor(ids, at::kLong)));
  hidden = hidden.to(stages_.front()->options().dtype);
  for (size_t i = 0; i < stages_.size(); ++i) {
    TOPHAT_ASSIGN_OR_RETURN(hidden, stages_[i]->Forward(hidden, caches_[i]));
  }
  if (last_only && hidden.size(0) > 1) hidden = hidden.narrow(0, hidden.size(0) - 1, 1);
  return stages_.back()->Logits(hidden);
}

absl::StatusOr<GenerationResult> PipelineGenerator::Generate(const std::vector<int32_t>& prompt,
                                                             const GenerationOptions& options,
                                                             const TokenCallback& on_token) {
  TOPHAT_RETURN_IF_ERROR(options.sampling.Validate());
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (options.max_new_tokens < 0) {
    return absl::InvalidArgumentError("max_new_tokens must be >= 0");
  }
  const int64_t needed = static_cast<int64_t>(prompt.size()) + options.max_new_tokens;
  if (needed > caches_.front().capacity()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", prompt.size(), " tokens) + max_new_tokens (", options.max_new_tokens,
        ") exceeds the context limit of ", caches_.front().capacity()));
  }
  Reset();
  GenerationResult result;
  Sampler sampler(options.sampling);
  sampler.SetPrompt(prompt);
  using Clock = std::chrono::steady_clock;

  const auto prefill_start = Clock::now();
  const size_t chunk = options.prefill_chunk > 0 ? static_cast<size_t>(options.prefill_chunk)
                                                 : prompt.size();
  at::Tensor logits;
  for (size_t begin = 0; begin < prompt.size(); begin += chunk) {
    const size_t end = std::min(prompt.size(), begin + chunk);
    TOPHAT_ASSIGN_OR_RETURN(
        logits, Step(std::vector<int32_t>(prompt.begin() + begin, prompt.begin() + end),
                     /*last_only=*/true));
  }
  result.prefill_seconds = std::chrono::duration<double>(Clock::now() - prefill_start).count();

  const auto decode_start = Clock::now();
  while (static_cast<int64_t>(result.tokens.size()) < options.max_new_tokens) {
    if (!result.tokens.empty()) {
      TOPHAT_ASSIGN_OR_RETURN(logits, Step({result.tokens.back()}));
    }
    const int32_t token = sampler.Sample(logits[logits.size(0) - 1]);
    sampler.Commit(std::span<const int32_t>(&token, 1));
    result.tokens.push_back(token);
    if (on_token && !on_token(token)) {
      result.finish_reason = FinishReason::kCancelled;
      break;
    }
    if (std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), token) !=
        options.stop_token_ids.end()) {
      result.finish_reason = FinishReason::kStop;
      break;
    }
  }
  result.decode_seconds = std::chrono::duration<double>(Clock::now() - decode_start).count();
  return result;
}

}  // namespace tophat
