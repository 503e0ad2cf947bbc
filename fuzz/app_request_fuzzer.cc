// What an app sends its agent: any bytes parsed as a GenerateRequest and planned as the
// agent plans one (device_agent/app_request.h) with a Llama-3-style tokenizer.json, then the
// prompt streamed through the detokenizer as the agent does before generating.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

#include "device_agent/app_request.h"
#include "fuzz/fuzz_util.h"
#include "models/tokenizers/bpe_tokenizer.h"

namespace {

const tophat::Tokenizer& LoadTokenizer() {
  static const std::unique_ptr<tophat::BpeTokenizer> tokenizer = [] {
    const std::string path = std::string(TOPHAT_FUZZ_DATA_DIR) + "/tokenizer_json/llama3.json";
    auto loaded = tophat::BpeTokenizer::Load(path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
      std::abort();
    }
    return std::move(*loaded);
  }();
  return *tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const tophat::Tokenizer& tokenizer = LoadTokenizer();
  tophat::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const tophat::AppRequestLimits limits{.vocab_size = tokenizer.vocab_size(),
                                        .context = 512,
                                        .max_prompt_bytes = 4096,
                                        .default_max_new_tokens = 16,
                                        .eos_token_ids = {2}};
  auto plan = tophat::PlanAppRequest(request, tokenizer, limits);
  if (!plan.ok()) {
    TOPHAT_FUZZ_CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  TOPHAT_FUZZ_CHECK(!plan->prompt.empty());
  TOPHAT_FUZZ_CHECK(static_cast<int64_t>(plan->prompt.size()) + plan->max_new_tokens <=
                    limits.context);
  TOPHAT_FUZZ_CHECK(plan->sampling.Validate().ok());
  TOPHAT_FUZZ_CHECK(plan->top_logprobs >= -1 && plan->top_logprobs <= tophat::kMaxTopLogprobs);
  TOPHAT_FUZZ_CHECK(!plan->prompt_logprobs || plan->top_logprobs >= 0);
  TOPHAT_FUZZ_CHECK(!plan->prompt_only || (plan->prompt_logprobs && plan->max_new_tokens == 0));
  // A format after a thinking model's </think>: only a real format or a reasoning budget,
  // and a token of the vocabulary; a budget only with that token.
  TOPHAT_FUZZ_CHECK(plan->sampling.reasoning_budget ==
                    (request.has_reasoning_token_budget()
                         ? static_cast<int64_t>(request.reasoning_token_budget())
                         : -1));
  TOPHAT_FUZZ_CHECK(!request.has_reasoning_token_budget() || request.has_format_after_token_id() ||
                    plan->sampling.response_format == tophat::ResponseFormat::kHarmonyCall);
  if (request.has_format_after_token_id()) {
    TOPHAT_FUZZ_CHECK(plan->sampling.response_format != tophat::ResponseFormat::kText ||
                      plan->sampling.reasoning_budget >= 0);
    TOPHAT_FUZZ_CHECK(plan->sampling.format_after_token ==
                      static_cast<int32_t>(request.format_after_token_id()));
    TOPHAT_FUZZ_CHECK(plan->sampling.format_after_token < limits.vocab_size);
  } else {
    TOPHAT_FUZZ_CHECK(plan->sampling.format_after_token == -1);
  }
  // The tokens a spent budget forces: the request's, only with a budget, each of the
  // vocabulary and none that ends the reasoning or the answer.
  const auto& forced = plan->sampling.reasoning_budget_end;
  TOPHAT_FUZZ_CHECK(static_cast<int>(forced.size()) == request.reasoning_budget_end_ids_size());
  TOPHAT_FUZZ_CHECK(forced.empty() || plan->sampling.reasoning_budget >= 0);
  TOPHAT_FUZZ_CHECK(static_cast<int>(forced.size()) <= tophat::kMaxReasoningBudgetEndIds);
  for (size_t i = 0; i < forced.size(); ++i) {
    TOPHAT_FUZZ_CHECK(forced[i] == static_cast<int32_t>(request.reasoning_budget_end_ids(
                                       static_cast<int>(i))));
    TOPHAT_FUZZ_CHECK(forced[i] >= 0 && forced[i] < limits.vocab_size);
    TOPHAT_FUZZ_CHECK(forced[i] != plan->sampling.format_after_token);
    for (int32_t stop : plan->stop_ids) TOPHAT_FUZZ_CHECK(forced[i] != stop);
    for (int64_t eos : limits.eos_token_ids) TOPHAT_FUZZ_CHECK(forced[i] != eos);
    TOPHAT_FUZZ_CHECK(forced[i] != tokenizer.eos_id());
  }
  // The tokens before the reasoning's end: the request's, only with that end, each of the
  // vocabulary, none the end itself, the first not repeated.
  const auto& prefix = plan->sampling.format_after_prefix;
  TOPHAT_FUZZ_CHECK(static_cast<int>(prefix.size()) == request.format_after_token_prefix_size());
  TOPHAT_FUZZ_CHECK(prefix.empty() || plan->sampling.format_after_token >= 0);
  TOPHAT_FUZZ_CHECK(static_cast<int>(prefix.size()) <= tophat::kMaxFormatAfterTokenPrefix);
  for (size_t i = 0; i < prefix.size(); ++i) {
    TOPHAT_FUZZ_CHECK(prefix[i] >= 0 && prefix[i] < limits.vocab_size);
    TOPHAT_FUZZ_CHECK(prefix[i] != plan->sampling.format_after_token);
    TOPHAT_FUZZ_CHECK(i == 0 || prefix[i] != prefix[0]);
  }
  // gpt-oss's harmony calls: only from a tool-call format that asked for them, with distinct
  // control tokens of the vocabulary and at least one tool.
  if (plan->sampling.response_format == tophat::ResponseFormat::kHarmonyCall) {
    TOPHAT_FUZZ_CHECK(request.response_format() == tophat::v1::RESPONSE_FORMAT_TOOL_CALLS &&
                      request.tool_calls().has_harmony());
    const tophat::HarmonyCallIds& ids = plan->sampling.harmony_call->ids();
    const int32_t controls[] = {ids.start, ids.channel,   ids.message,
                                ids.end,   ids.constrain, ids.call};
    for (size_t i = 0; i < std::size(controls); ++i) {
      TOPHAT_FUZZ_CHECK(controls[i] >= 0 && controls[i] < limits.vocab_size);
      for (size_t j = 0; j < i; ++j) TOPHAT_FUZZ_CHECK(controls[i] != controls[j]);
    }
    TOPHAT_FUZZ_CHECK(!plan->sampling.harmony_call->tools().empty());
  } else {
    TOPHAT_FUZZ_CHECK(!request.tool_calls().has_harmony() ||
                      request.response_format() != tophat::v1::RESPONSE_FORMAT_TOOL_CALLS);
  }
  tophat::StreamingDetokenizer detokenizer(tokenizer);
  for (int32_t id : plan->prompt) {
    TOPHAT_FUZZ_CHECK(id >= 0 && id < limits.vocab_size);
    (void)detokenizer.Push(id);
  }
  (void)detokenizer.Flush();
  return 0;
}
