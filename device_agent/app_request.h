// What the agent makes of an app's GenerateRequest before any model runs: the prompt's
// token ids (text tokenized on the device, or ids checked against the vocabulary), the
// token budget against the context, the sampling parameters and the stop ids. Pure: the
// agent's request loop and the app-request fuzz target (fuzz/) share it, so the bytes an
// app sends meet exactly this code.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "models/grammar/json_schema.h"
#include "models/grammar/tool_call_grammar.h"
#include "models/runtime/sampler.h"
#include "models/tokenizers/tokenizer.h"
#include "tophat/v1/agent.pb.h"

namespace tophat {

struct AppRequestLimits {
  int64_t vocab_size = 0;              // of the model
  int64_t context = 0;                 // positions the device's submodels hold
  int64_t max_prompt_bytes = 1 << 20;  // text longer than this is refused before tokenizing
  int64_t default_max_new_tokens = 256;
  std::vector<int64_t> eos_token_ids;  // the model's (config.json)
};

struct AppRequestPlan {
  std::vector<int32_t> prompt;  // BOS included where the tokenizer has one
  int64_t max_new_tokens = 0;   // prompt.size() + this <= context
  SamplingParams sampling;      // validated
  std::vector<int32_t> stop_ids;
  // GenerateRequest.logprobs: how many alternatives each token's log-probability comes with;
  // -1: no log-probabilities.
  int64_t top_logprobs = -1;
  bool prompt_logprobs = false;  // GenerateRequest.prompt_logprobs (needs top_logprobs >= 0)
  bool prompt_only = false;      // GenerateRequest.prompt_only: max_new_tokens is 0
};

// The most alternatives a token's log-probability comes with (OpenAI's limit for chat).
inline constexpr int64_t kMaxTopLogprobs = 20;
// The most logit_bias entries a request may carry.
inline constexpr int64_t kMaxLogitBias = 1024;
// The most tokens a spent reasoning budget forces before the reasoning's end
// (reasoning_budget_end_ids): a sentence, not a second answer.
inline constexpr int kMaxReasoningBudgetEndIds = 256;
// GenerateRequest.format_after_token_prefix's most tokens.
inline constexpr int kMaxFormatAfterTokenPrefix = 8;

// A request's JSON Schema (GenerateRequest.json_schema), compiled; InvalidArgument naming
// the field and the place in the schema ("json_schema: at /properties/age: ...").
absl::StatusOr<std::shared_ptr<const CompiledSchema>> CompileJsonSchema(std::string_view text);

// A request's tool-call format (GenerateRequest.tool_calls), compiled; InvalidArgument naming
// the field ("tool_calls.tools[1].parameters: at /properties/x: ...").
absl::StatusOr<std::shared_ptr<const ToolCallSpec>> CompileToolCalls(
    const v1::ToolCallFormat& format);

// Errors are kInvalidArgument and name the request's field.
absl::StatusOr<AppRequestPlan> PlanAppRequest(const v1::GenerateRequest& request,
                                              const Tokenizer& tokenizer,
                                              const AppRequestLimits& limits);

}  // namespace tophat
