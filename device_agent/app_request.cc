#include "device_agent/app_request.h"

#include <algorithm>
#include <random>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "models/grammar/choice_grammar.h"
#include "models/grammar/ebnf_grammar.h"
#include "models/grammar/harmony_call_constraint.h"
#include "models/grammar/structural_tag_grammar.h"
#include "nlohmann/json.hpp"

namespace tophat {
namespace {

// A request's seed when it names none: from the OS's entropy, so that two unseeded sampled
// requests differ.
uint64_t FreshSeed() {
  std::random_device entropy;
  return (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const CompiledSchema>> CompileJsonSchema(std::string_view text) {
  if (static_cast<int64_t>(text.size()) > kMaxJsonSchemaBytes) {
    return absl::InvalidArgumentError(absl::StrCat("json_schema: ", text.size(),
                                                   " bytes is more than ", kMaxJsonSchemaBytes));
  }
  if (text.empty()) return absl::InvalidArgumentError("json_schema: empty (give the schema)");
  const nlohmann::json schema = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return absl::InvalidArgumentError("json_schema: not JSON");
  absl::StatusOr<std::shared_ptr<const CompiledSchema>> compiled = CompiledSchema::CompileShared(schema);
  if (!compiled.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("json_schema: ", compiled.status().message()));
  }
  return compiled;
}

// The tools' parameters compiled, named in errors as "tool_calls.tools[t]".
absl::StatusOr<std::vector<ToolCallTool>> CompileTools(const v1::ToolCallFormat& format) {
  std::vector<ToolCallTool> tools;
  int64_t bytes = 0;
  for (int t = 0; t < format.tools_size(); ++t) {
    const v1::ToolCallFormat::Tool& tool = format.tools(t);
    bytes += static_cast<int64_t>(tool.parameters().size());
    if (bytes > kMaxJsonSchemaBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tool_calls.tools: their parameters hold more than ", kMaxJsonSchemaBytes, " bytes"));
    }
    absl::StatusOr<std::shared_ptr<const CompiledSchema>> parameters =
        CompileJsonSchema(tool.parameters());
    if (!parameters.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tool_calls.tools[", t, "].parameters: ",
                                                     parameters.status().message()));
    }
    tools.push_back({.name = tool.name(), .parameters = *std::move(parameters)});
  }
  return tools;
}

absl::StatusOr<std::shared_ptr<const ToolCallSpec>> CompileToolCalls(
    const v1::ToolCallFormat& format) {
  absl::StatusOr<std::vector<ToolCallTool>> tools = CompileTools(format);
  if (!tools.ok()) return tools.status();
  ToolCallSyntax syntax{.open = format.open(),
                        .between = format.between(),
                        .close = format.close(),
                        .separator = format.has_separator()
                                         ? std::optional<std::string>(format.separator())
                                         : std::nullopt,
                        .start_tag = format.start_tag()};
  absl::StatusOr<std::shared_ptr<const ToolCallSpec>> spec = ToolCallSpec::Create(
      std::move(syntax), *std::move(tools),
      static_cast<int32_t>(std::min<uint32_t>(format.max_calls(), 1u << 20)), format.text_first());
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tool_calls: ", spec.status().message()));
  }
  return spec;
}

// gpt-oss's call in harmony's layout: the layout's text fields left empty, one call, and
// control tokens inside the vocabulary.
absl::StatusOr<std::shared_ptr<const HarmonyCallSpec>> CompileHarmonyCall(
    const v1::ToolCallFormat& format, int64_t vocab_size) {
  for (const auto& [field, given] : {std::pair{"open", !format.open().empty()},
                                     {"between", !format.between().empty()},
                                     {"close", !format.close().empty()},
                                     {"separator", format.has_separator()},
                                     {"text_first", format.text_first()},
                                     {"start_tag", !format.start_tag().empty()}}) {
    if (given) {
      return absl::InvalidArgumentError(
          absl::StrCat("tool_calls.", field,
                       ": given with tool_calls.harmony, whose layout is "
                       "harmony's own"));
    }
  }
  if (format.max_calls() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("tool_calls.max_calls: ", format.max_calls(),
                                                   " with tool_calls.harmony (one call a turn)"));
  }
  const v1::HarmonyCallLayout& layout = format.harmony();
  HarmonyCallIds ids;
  for (const auto& [field, given, id] : {std::tuple{"start", layout.start(), &ids.start},
                                         {"channel", layout.channel(), &ids.channel},
                                         {"message", layout.message(), &ids.message},
                                         {"end", layout.end(), &ids.end},
                                         {"constrain", layout.constrain(), &ids.constrain},
                                         {"call", layout.call(), &ids.call}}) {
    if (given >= static_cast<uint64_t>(vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("tool_calls.harmony.", field, ": token id ",
                                                     given, " is outside the vocabulary of ",
                                                     vocab_size));
    }
    *id = static_cast<int32_t>(given);
  }
  absl::StatusOr<std::vector<ToolCallTool>> tools = CompileTools(format);
  if (!tools.ok()) return tools.status();
  absl::StatusOr<std::shared_ptr<const HarmonyCallSpec>> spec =
      HarmonyCallSpec::Create(ids, *std::move(tools));
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tool_calls: ", spec.status().message()));
  }
  return spec;
}

absl::StatusOr<AppRequestPlan> PlanAppRequest(const v1::GenerateRequest& request,
                                              const Tokenizer& tokenizer,
                                              const AppRequestLimits& limits) {
  AppRequestPlan plan;
  if (request.has_prompt_ids()) {
    for (uint32_t id : request.prompt_ids().ids()) {
      if (id >= static_cast<uint64_t>(limits.vocab_size)) {
        return absl::InvalidArgumentError(absl::StrCat("prompt_ids: token id ", id,
                                                       " is outside the vocabulary of ",
                                                       limits.vocab_size));
      }
      plan.prompt.push_back(static_cast<int32_t>(id));
    }
  } else {
    if (!request.skip_bos() && tokenizer.bos_id()) plan.prompt.push_back(*tokenizer.bos_id());
    // Before tokenizing: a huge prompt would cost seconds of CPU only to be refused.
    if (static_cast<int64_t>(request.prompt().size()) > limits.max_prompt_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: ", request.prompt().size(),
                                                     " bytes is more than max_prompt_bytes (",
                                                     limits.max_prompt_bytes, ")"));
    }
    auto ids = tokenizer.Encode(request.prompt());
    if (!ids.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: ", ids.status().message()));
    }
    plan.prompt.insert(plan.prompt.end(), ids->begin(), ids->end());
  }
  if (plan.prompt.empty()) return absl::InvalidArgumentError("prompt: empty");
  const int64_t prompt_length = static_cast<int64_t>(plan.prompt.size());
  if (request.prompt_only() && !request.prompt_logprobs()) {
    return absl::InvalidArgumentError("prompt_only: needs prompt_logprobs");
  }
  if (request.prompt_logprobs() && !request.logprobs()) {
    return absl::InvalidArgumentError("prompt_logprobs: needs logprobs");
  }
  plan.prompt_logprobs = request.prompt_logprobs();
  plan.prompt_only = request.prompt_only();
  plan.max_new_tokens = request.prompt_only()              ? 0
                        : request.max_new_tokens() > 0 ? request.max_new_tokens()
                                                       : limits.default_max_new_tokens;
  if (prompt_length + plan.max_new_tokens > limits.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt of ", prompt_length, " tokens + max_new_tokens ", plan.max_new_tokens,
        " exceeds the context of ", limits.context, " positions"));
  }
  // top_p 0 is proto3's "not set": keep every token. Anything else, NaN and negatives
  // included, goes to Validate, which refuses what is not in (0, 1].
  plan.sampling = {.temperature = request.sampling().temperature(),
                   .top_k = request.sampling().top_k(),
                   .top_p = request.sampling().top_p() == 0 ? 1.0 : request.sampling().top_p(),
                   .min_p = request.sampling().min_p(),
                   .seed = request.sampling().has_seed() ? request.sampling().seed()
                                                         : FreshSeed(),
                   .presence_penalty = request.sampling().presence_penalty(),
                   .frequency_penalty = request.sampling().frequency_penalty(),
                   .repetition_penalty = request.sampling().repetition_penalty() == 0
                                             ? 1.0
                                             : request.sampling().repetition_penalty()};
  if (request.sampling().logit_bias_size() > kMaxLogitBias) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.logit_bias: ",
                                                   request.sampling().logit_bias_size(),
                                                   " entries, more than ", kMaxLogitBias));
  }
  for (const auto& [id, bias] : request.sampling().logit_bias()) {
    if (id >= static_cast<uint64_t>(limits.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.logit_bias: token id ", id,
                                                     " is outside the vocabulary of ",
                                                     limits.vocab_size));
    }
    plan.sampling.logit_bias.emplace_back(static_cast<int32_t>(id), bias);
  }
  // A map's order is the implementation's: sorted, a request's bias is the same every time.
  std::sort(plan.sampling.logit_bias.begin(), plan.sampling.logit_bias.end());
  std::vector<int32_t> eos_ids;
  for (int64_t eos : limits.eos_token_ids) eos_ids.push_back(static_cast<int32_t>(eos));
  if (tokenizer.eos_id()) eos_ids.push_back(*tokenizer.eos_id());
  if (!request.ignore_eos()) plan.stop_ids = eos_ids;
  for (uint32_t id : request.stop_token_ids()) plan.stop_ids.push_back(static_cast<int32_t>(id));
  if (request.min_new_tokens() > plan.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("min_new_tokens ", request.min_new_tokens(),
                                                   " is more than max_new_tokens ",
                                                   plan.max_new_tokens));
  }
  plan.sampling.min_tokens = request.min_new_tokens();
  if (!request.json_schema().empty() &&
      request.response_format() != v1::RESPONSE_FORMAT_JSON_SCHEMA) {
    return absl::InvalidArgumentError(
        "json_schema: given, but response_format is not RESPONSE_FORMAT_JSON_SCHEMA");
  }
  if (!request.regex().empty() && request.response_format() != v1::RESPONSE_FORMAT_REGEX) {
    return absl::InvalidArgumentError(
        "regex: given, but response_format is not "
        "RESPONSE_FORMAT_REGEX");
  }
  if (!request.grammar().empty() && request.response_format() != v1::RESPONSE_FORMAT_GRAMMAR) {
    return absl::InvalidArgumentError(
        "grammar: given, but response_format is not RESPONSE_FORMAT_GRAMMAR");
  }
  if (!request.structural_tag().empty() &&
      request.response_format() != v1::RESPONSE_FORMAT_STRUCTURAL_TAG) {
    return absl::InvalidArgumentError(
        "structural_tag: given, but response_format is not RESPONSE_FORMAT_STRUCTURAL_TAG");
  }
  if (request.choices_size() > 0 && request.response_format() != v1::RESPONSE_FORMAT_CHOICE) {
    return absl::InvalidArgumentError(
        "choices: given, but response_format is not RESPONSE_FORMAT_CHOICE");
  }
  if (request.has_tool_calls() && request.response_format() != v1::RESPONSE_FORMAT_TOOL_CALLS) {
    return absl::InvalidArgumentError(
        "tool_calls: given, but response_format is not RESPONSE_FORMAT_TOOL_CALLS");
  }
  switch (request.response_format()) {
    case v1::RESPONSE_FORMAT_TEXT:
      break;
    case v1::RESPONSE_FORMAT_JSON_OBJECT:
      if (request.outline().enabled()) {
        return absl::InvalidArgumentError("response_format: not with outline");
      }
      plan.sampling.response_format = ResponseFormat::kJsonObject;
      break;
    case v1::RESPONSE_FORMAT_JSON_SCHEMA: {
      if (request.outline().enabled()) {
        return absl::InvalidArgumentError("response_format: not with outline");
      }
      TOPHAT_ASSIGN_OR_RETURN(plan.sampling.json_schema, CompileJsonSchema(request.json_schema()));
      plan.sampling.response_format = ResponseFormat::kJsonSchema;
      break;
    }
    case v1::RESPONSE_FORMAT_TOOL_CALLS: {
      if (request.outline().enabled()) {
        return absl::InvalidArgumentError("response_format: not with outline");
      }
      if (request.tool_calls().has_harmony()) {
        TOPHAT_ASSIGN_OR_RETURN(plan.sampling.harmony_call,
                                CompileHarmonyCall(request.tool_calls(), limits.vocab_size));
        plan.sampling.response_format = ResponseFormat::kHarmonyCall;
        break;
      }
      TOPHAT_ASSIGN_OR_RETURN(plan.sampling.tool_calls, CompileToolCalls(request.tool_calls()));
      plan.sampling.response_format = ResponseFormat::kToolCalls;
      break;
    }
    case v1::RESPONSE_FORMAT_REGEX: {
      if (request.outline().enabled()) {
        return absl::InvalidArgumentError("response_format: not with outline");
      }
      TOPHAT_ASSIGN_OR_RETURN(plan.sampling.regex, CompileRegexFormat(request.regex()));
      plan.sampling.response_format = ResponseFormat::kRegex;
      break;
    }
    case v1::RESPONSE_FORMAT_GRAMMAR: {
      if (request.outline().enabled()) {
        return absl::InvalidArgumentError("response_format: not with outline");
      }
      // Its errors start "grammar: ", naming the line and column or the rule.
      TOPHAT_ASSIGN_OR_RETURN(plan.sampling.grammar, EbnfGrammar::Compile(request.grammar()));
      plan.sampling.response_format = ResponseFormat::kGrammar;
      break;
    }
    case v1::RESPONSE_FORMAT_CHOICE: {
      if (request.outline().enabled()) {
        return absl::InvalidArgumentError("response_format: not with outline");
      }
      // Its errors start "choice", naming what.
      TOPHAT_ASSIGN_OR_RETURN(plan.sampling.choice, ChoiceSpec::Create({request.choices().begin(),
                                                                        request.choices().end()}));
      plan.sampling.response_format = ResponseFormat::kChoice;
      break;
    }
    case v1::RESPONSE_FORMAT_STRUCTURAL_TAG: {
      if (request.outline().enabled()) {
        return absl::InvalidArgumentError("response_format: not with outline");
      }
      absl::StatusOr<std::shared_ptr<const StructuralTagSpec>> spec =
          StructuralTagSpec::Parse(request.structural_tag());
      if (!spec.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("structural_tag: ", spec.status().message()));
      }
      plan.sampling.structural_tag = *std::move(spec);
      plan.sampling.response_format = ResponseFormat::kStructuralTag;
      break;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("response_format: unknown value ", request.response_format()));
  }
  if (request.has_reasoning_token_budget()) {
    if (!request.has_format_after_token_id() &&
        plan.sampling.response_format != ResponseFormat::kHarmonyCall) {
      return absl::InvalidArgumentError(
          "reasoning_token_budget: needs format_after_token_id, the token that ends the "
          "reasoning (or a harmony call format, whose layout ends it)");
    }
    plan.sampling.reasoning_budget = request.reasoning_token_budget();
  }
  if (request.has_format_after_token_id()) {
    if (request.response_format() == v1::RESPONSE_FORMAT_TEXT &&
        !request.has_reasoning_token_budget()) {
      return absl::InvalidArgumentError(
          "format_after_token_id: given, but response_format is RESPONSE_FORMAT_TEXT and no "
          "reasoning_token_budget counts the tokens before it");
    }
    if (request.format_after_token_id() >= static_cast<uint64_t>(limits.vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("format_after_token_id: token id ", request.format_after_token_id(),
                       " is outside the vocabulary of ", limits.vocab_size));
    }
    plan.sampling.format_after_token = static_cast<int32_t>(request.format_after_token_id());
  }
  if (request.format_after_token_prefix_size() > 0) {
    if (!request.has_format_after_token_id()) {
      return absl::InvalidArgumentError(
          "format_after_token_prefix: given without format_after_token_id, which it comes "
          "before");
    }
    if (request.format_after_token_prefix_size() > kMaxFormatAfterTokenPrefix) {
      return absl::InvalidArgumentError(
          absl::StrCat("format_after_token_prefix: ", request.format_after_token_prefix_size(),
                       " tokens, more than the ", kMaxFormatAfterTokenPrefix, " allowed"));
    }
    const auto& prefix = request.format_after_token_prefix();
    for (int i = 0; i < prefix.size(); ++i) {
      std::string_view why;
      if (prefix[i] >= static_cast<uint64_t>(limits.vocab_size)) {
        why = " is outside the vocabulary";
      } else if (prefix[i] == request.format_after_token_id()) {
        why = " is format_after_token_id, which follows it";
      } else if (i > 0 && prefix[i] == prefix[0]) {
        why = " repeats its first token";
      }
      if (!why.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "format_after_token_prefix[", i, "]: token id ", prefix[i], std::string(why)));
      }
      plan.sampling.format_after_prefix.push_back(static_cast<int32_t>(prefix[i]));
    }
  }
  if (request.reasoning_budget_end_ids_size() > 0) {
    if (!request.has_reasoning_token_budget()) {
      return absl::InvalidArgumentError(
          "reasoning_budget_end_ids: given without reasoning_token_budget, whose end they are");
    }
    if (request.reasoning_budget_end_ids_size() > kMaxReasoningBudgetEndIds) {
      return absl::InvalidArgumentError(
          absl::StrCat("reasoning_budget_end_ids: ", request.reasoning_budget_end_ids_size(),
                       " tokens, more than the ", kMaxReasoningBudgetEndIds, " allowed"));
    }
    for (const uint32_t id : request.reasoning_budget_end_ids()) {
      std::string_view why;
      if (id >= static_cast<uint64_t>(limits.vocab_size)) {
        why = " is outside the vocabulary";
      } else if (id == request.format_after_token_id()) {
        why = " is format_after_token_id, which is forced after them";
      } else if (absl::c_linear_search(plan.stop_ids, static_cast<int32_t>(id)) ||
                 absl::c_linear_search(eos_ids, static_cast<int32_t>(id))) {
        why = " would end the answer (an end of sequence or a stop token)";
      }
      if (!why.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("reasoning_budget_end_ids: token id ", id, std::string(why)));
      }
      plan.sampling.reasoning_budget_end.push_back(static_cast<int32_t>(id));
    }
  }
  if (plan.sampling.history_dependent()) {
    plan.sampling.stop_ids = plan.stop_ids;
    // min_tokens holds the end of sequence back under ignore_eos too, as vLLM does (its
    // _all_stop_token_ids): ignore_eos keeps it from ending the answer, and a minimum keeps
    // it from being chosen. (Not with a JSON format, which refuses min_tokens and whose
    // stop_ids are what may end its object.)
    if (request.ignore_eos() && plan.sampling.min_tokens > 0) {
      plan.sampling.stop_ids.insert(plan.sampling.stop_ids.end(), eos_ids.begin(), eos_ids.end());
    }
  }
  if (absl::Status valid = plan.sampling.Validate(); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: ", valid.message()));
  }
  if (request.top_logprobs() > 0 && !request.logprobs()) {
    return absl::InvalidArgumentError("top_logprobs: needs logprobs");
  }
  if (request.top_logprobs() > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("top_logprobs: ", request.top_logprobs(),
                                                   " is more than ", kMaxTopLogprobs));
  }
  if (request.logprobs()) {
    // An outline's answer is text the model wrote in several requests, after a directive the
    // app never sent: there is no one distribution its tokens were drawn from.
    if (request.outline().enabled()) {
      return absl::InvalidArgumentError("logprobs: not with an outline");
    }
    plan.top_logprobs = request.top_logprobs();
  }
  return plan;
}

}  // namespace tophat
