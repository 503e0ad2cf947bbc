#include "models/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "models/grammar/after_token_constraint.h"

namespace tophat {

absl::Status SamplingParams::Validate() const {
  // NaN fails every comparison, so each check is written to fail on it: a NaN temperature
  // would otherwise sample one token forever, an infinite one uniform noise.
  if (!(temperature >= 0 && std::isfinite(temperature))) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be finite and >= 0 (0: greedy), got ", temperature));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", top_k));
  if (!(top_p > 0.0 && top_p <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  if (!(min_p >= 0.0 && min_p <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1], got ", min_p));
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("logit_bias: token id ", id));
    if (!(bias >= -100 && bias <= 100)) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias of token ", id, " must be in [-100, 100], got ", bias));
    }
  }
  if (!(presence_penalty >= -2 && presence_penalty <= 2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("presence_penalty must be in [-2, 2] (0: off), got ", presence_penalty));
  }
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("frequency_penalty must be in [-2, 2] (0: off), got ", frequency_penalty));
  }
  if (reasoning_budget < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("reasoning_budget must be >= 0 (-1: no limit), got ", reasoning_budget));
  }
  if (reasoning_budget >= 0 && format_after_token < 0 &&
      response_format != ResponseFormat::kHarmonyCall) {
    return absl::InvalidArgumentError(
        "a reasoning budget needs the token that ends the reasoning (format_after_token), or "
        "a harmony call format (which ends it itself)");
  }
  if (!format_after_prefix.empty() && format_after_token < 0) {
    return absl::InvalidArgumentError(
        "format_after_prefix: the tokens before the reasoning's end need that end "
        "(format_after_token)");
  }
  for (size_t i = 0; i < format_after_prefix.size(); ++i) {
    if (format_after_prefix[i] < 0 || (i > 0 && format_after_prefix[i] == format_after_prefix[0])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "format_after_prefix[", i, "]: token id ", format_after_prefix[i],
          format_after_prefix[i] < 0 ? " is negative" : " repeats the prefix's first token"));
    }
  }
  if (!reasoning_budget_end.empty() && reasoning_budget < 0) {
    return absl::InvalidArgumentError(
        "reasoning_budget_end: the tokens that end a spent reasoning budget need the budget");
  }
  for (const int32_t id : reasoning_budget_end) {
    if (id < 0 || id == format_after_token) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reasoning_budget_end: token id ", id,
          id < 0 ? " is negative" : " is the reasoning's end, which is forced after them"));
    }
  }
  if (min_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("min_tokens must be >= 0, got ", min_tokens));
  }
  if (!(repetition_penalty > 0 && std::isfinite(repetition_penalty))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "repetition_penalty must be finite and > 0 (1: off), got ", repetition_penalty));
  }
  if (response_format == ResponseFormat::kJsonSchema && json_schema == nullptr) {
    return absl::InvalidArgumentError("a JSON Schema response format without a schema");
  }
  if (response_format == ResponseFormat::kToolCalls && tool_calls == nullptr) {
    return absl::InvalidArgumentError("a tool-call response format without its tools");
  }
  if (response_format == ResponseFormat::kRegex && regex == nullptr) {
    return absl::InvalidArgumentError("a regex response format without its regex");
  }
  if (response_format == ResponseFormat::kGrammar && grammar == nullptr) {
    return absl::InvalidArgumentError("a grammar response format without its grammar");
  }
  if (response_format == ResponseFormat::kChoice && choice == nullptr) {
    return absl::InvalidArgumentError("a choice response format without its choices");
  }
  if (response_format == ResponseFormat::kHarmonyCall && harmony_call == nullptr) {
    return absl::InvalidArgumentError("a harmony call response format without its tools");
  }
  if (response_format == ResponseFormat::kStructuralTag && structural_tag == nullptr) {
    return absl::InvalidArgumentError("a structural tag response format without its structures");
  }
  if (response_format != ResponseFormat::kText) {
    if (min_tokens > 0) {
      return absl::InvalidArgumentError(
          "min_tokens cannot be combined with a JSON, regex, choice, grammar or structural tag "
          "response format or tool calls: the answer could be complete before the minimum");
    }
    if (stop_ids.empty()) {
      return absl::InvalidArgumentError(
          "a JSON, regex, choice, grammar or structural tag response format or tool calls need "
          "an end of sequence to end the answer with (not with ignore_eos and no stop ids)");
    }
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params, std::shared_ptr<const TokenVocabulary> vocabulary)
    : params_(params), rng_(params.seed) {
  // A caller's bug, not a request's: answering unconstrained would break the promise.
  const auto require = [](bool given) {
    if (given) return;
    std::fputs(
        "Sampler: a response format needs the tokenizer's vocabulary (and kJsonSchema "
        "its schema, kToolCalls and kHarmonyCall their tools, kRegex its regex, kGrammar "
        "its grammar, kStructuralTag its structures, kChoice its choices)\n",
        stderr);
    std::abort();
  };
  switch (params_.response_format) {
    case ResponseFormat::kText:
      break;
    case ResponseFormat::kJsonObject:
      require(vocabulary != nullptr);
      format_ = std::make_unique<JsonConstraint>(vocabulary, params_.stop_ids);
      break;
    case ResponseFormat::kJsonSchema:
      require(vocabulary != nullptr && params_.json_schema != nullptr);
      format_ = MakeSchemaConstraint(vocabulary, params_.stop_ids, params_.json_schema);
      break;
    case ResponseFormat::kToolCalls:
      require(vocabulary != nullptr && params_.tool_calls != nullptr);
      format_ = MakeToolCallConstraint(vocabulary, params_.stop_ids, params_.tool_calls);
      break;
    case ResponseFormat::kRegex:
      require(vocabulary != nullptr && params_.regex != nullptr);
      format_ = MakeRegexConstraint(vocabulary, params_.stop_ids, params_.regex);
      break;
    case ResponseFormat::kGrammar:
      require(vocabulary != nullptr && params_.grammar != nullptr);
      format_ = MakeEbnfConstraint(vocabulary, params_.stop_ids, params_.grammar);
      break;
    case ResponseFormat::kChoice:
      require(vocabulary != nullptr && params_.choice != nullptr);
      format_ = MakeChoiceConstraint(vocabulary, params_.stop_ids, params_.choice);
      break;
    case ResponseFormat::kHarmonyCall:
      require(vocabulary != nullptr && params_.harmony_call != nullptr);
      // Its budget counts the tokens before the call; spent, it ends the reasoning itself.
      format_ = MakeHarmonyCallConstraint(vocabulary, params_.stop_ids, params_.harmony_call,
                                          params_.reasoning_budget, params_.reasoning_budget_end);
      break;
    case ResponseFormat::kStructuralTag:
      require(vocabulary != nullptr && params_.structural_tag != nullptr);
      format_ = MakeStructuralTagConstraint(vocabulary, params_.stop_ids,
                                            params_.structural_tag);
      break;
  }
  if (params_.format_after_token >= 0 && (format_ != nullptr || params_.reasoning_budget >= 0)) {
    require(vocabulary != nullptr);
    format_ = std::make_unique<AfterTokenConstraint>(
        std::move(vocabulary), params_.format_after_token, std::move(format_),
        params_.reasoning_budget, params_.reasoning_budget_end, params_.format_after_prefix);
  }
  if (params_.logit_bias.empty()) return;
  std::vector<int64_t> ids;
  std::vector<float> values;
  for (const auto& [id, bias] : params_.logit_bias) {
    ids.push_back(id);
    values.push_back(bias);
  }
  bias_ids_ = at::tensor(ids, at::kLong);
  bias_values_ = at::tensor(values, at::kFloat);
}

std::optional<ForcedDraft> Sampler::ForcedToken(std::span<const int32_t> pending) const {
  if (format_ == nullptr) return std::nullopt;
  const std::optional<ForcedDraft> forced = format_->Forced(pending);
  if (!forced || std::find(params_.stop_ids.begin(), params_.stop_ids.end(), forced->token) !=
                     params_.stop_ids.end()) {
    return std::nullopt;
  }
  return forced;
}

void Sampler::SetPrompt(std::span<const int32_t> prompt) {
  if (params_.repetition_penalty == 1.0) return;
  prompt_tokens_.assign(prompt.begin(), prompt.end());
  std::sort(prompt_tokens_.begin(), prompt_tokens_.end());
  prompt_tokens_.erase(std::unique(prompt_tokens_.begin(), prompt_tokens_.end()),
                       prompt_tokens_.end());
}

void Sampler::Commit(std::span<const int32_t> tokens) {
  generated_ += static_cast<int64_t>(tokens.size());
  if (format_ != nullptr) format_->Commit(tokens);
  if (!params_.penalized()) return;
  for (const int32_t token : tokens) ++generated_counts_[token];
}

at::Tensor Sampler::Adjusted(const at::Tensor& logits, std::span<const int32_t> pending) const {
  const bool too_short = generated_ + static_cast<int64_t>(pending.size()) < params_.min_tokens &&
                         !params_.stop_ids.empty();
  // Null: the format takes every token here (a thinking model's reasoning).
  const std::shared_ptr<const std::vector<uint8_t>> allowed =
      format_ != nullptr ? format_->Allowed(pending) : nullptr;
  if (!params_.penalized() && !too_short && allowed == nullptr) return Biased(logits);
  at::Tensor biased = Biased(logits);
  at::Tensor row = biased.is_same(logits)
                       ? logits.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true)
                       : biased;
  if (too_short) {
    // Not yet: the end-of-sequence and stop ids cannot be chosen (those in the vocabulary).
    std::vector<int64_t> banned;
    for (const int32_t id : params_.stop_ids) {
      if (id >= 0 && id < row.size(0)) banned.push_back(id);
    }
    if (!banned.empty()) {
      row.index_fill_(0, at::tensor(banned, at::kLong).to(row.device()),
                      -std::numeric_limits<float>::infinity());
    }
  }
  if (params_.penalized()) Penalize(row, pending);
  if (allowed != nullptr) {
    // The tokens the format refuses; the logits may have more rows than the tokenizer has
    // tokens (padded vocabularies), which no answer can use.
    const int64_t known = std::min<int64_t>(row.size(0), static_cast<int64_t>(allowed->size()));
    at::Tensor refused = at::ones({row.size(0)}, at::kBool);
    refused.narrow(0, 0, known)
        .copy_(at::from_blob(const_cast<uint8_t*>(allowed->data()), {known}, at::kBool)
                   .logical_not());
    row.masked_fill_(refused.to(row.device()), -std::numeric_limits<float>::infinity());
  }
  return row;
}

void Sampler::Penalize(at::Tensor& row, std::span<const int32_t> pending) const {
  // The tokens the penalties touch, with how often each was generated (0: only in the
  // prompt). A few hundred at most against a vocabulary of 10^5: they are gathered, changed
  // on the host and scattered back, rather than the whole row changed on its device.
  absl::flat_hash_map<int32_t, int64_t> counts = generated_counts_;
  for (const int32_t token : pending) ++counts[token];
  for (const int32_t token : prompt_tokens_) counts.try_emplace(token, 0);
  if (counts.empty()) return;
  std::vector<int64_t> ids;
  ids.reserve(counts.size());
  for (const auto& [token, count] : counts) ids.push_back(token);
  const int64_t vocab = row.size(0);
  std::erase_if(ids, [vocab](int64_t id) { return id < 0 || id >= vocab; });
  if (ids.empty()) return;
  const at::Tensor index = at::tensor(ids, at::kLong).to(row.device());
  at::Tensor values = row.index_select(0, index).to(at::kCPU).contiguous();
  float* value = values.data_ptr<float>();
  const bool repetition = params_.repetition_penalty != 1.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t count = counts.at(static_cast<int32_t>(ids[i]));
    double v = value[i];
    // Every counted token was seen (in the prompt or generated), as repetition_penalty asks.
    if (repetition) v = v > 0 ? v / params_.repetition_penalty : v * params_.repetition_penalty;
    if (count > 0) {
      v -= params_.frequency_penalty * static_cast<double>(count) + params_.presence_penalty;
    }
    value[i] = static_cast<float>(v);
  }
  row.index_copy_(0, index, values.to(row.device()));
}

at::Tensor Sampler::AdjustedRows(const at::Tensor& logits, std::span<const int32_t> drafts) const {
  if (!params_.history_dependent()) return Biased(logits);
  std::vector<at::Tensor> rows;
  rows.reserve(static_cast<size_t>(logits.size(0)));
  for (int64_t i = 0; i < logits.size(0); ++i) {
    rows.push_back(Adjusted(logits[i], drafts.first(std::min<size_t>(
                                           static_cast<size_t>(i), drafts.size()))));
  }
  return at::stack(rows);
}

at::Tensor Sampler::Biased(const at::Tensor& logits) const {
  if (params_.logit_bias.empty()) return logits;
  at::Tensor biased = logits.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  const at::Tensor ids = bias_ids_.to(biased.device());
  const at::Tensor values = bias_values_.to(biased.device());
  if (biased.dim() == 1) return biased.index_add_(0, ids, values);
  return biased.index_add_(biased.dim() - 1, ids, values.expand({biased.size(0), values.size(0)}));
}

at::Tensor Sampler::Distribution(const at::Tensor& logits,
                                 std::span<const int32_t> pending) const {
  at::Tensor l = Adjusted(logits, pending).to(at::kFloat).contiguous();
  const int64_t vocab = l.size(0);
  if (params_.greedy()) {
    at::Tensor probs = at::zeros({vocab}, l.options());
    probs[l.argmax().item<int64_t>()] = 1.0f;
    return probs;
  }
  at::Tensor probs = at::softmax(l / params_.temperature, 0);
  const bool use_top_k = params_.top_k > 0 && params_.top_k < vocab;
  if (!use_top_k && params_.top_p >= 1.0 && params_.min_p <= 0.0) return probs;

  // Sort once; every filter keeps a prefix of the sorted order.
  auto [sorted, order] = probs.sort(/*dim=*/0, /*descending=*/true);
  const float* p = sorted.data_ptr<float>();
  int64_t keep = use_top_k ? params_.top_k : vocab;
  if (params_.min_p > 0.0) {
    // Relative to the likeliest, so the same whichever filter goes first.
    const double threshold = params_.min_p * p[0];
    int64_t kept = 1;
    while (kept < keep && p[kept] >= threshold) ++kept;
    keep = kept;
  }
  if (params_.top_p < 1.0) {
    // The nucleus of what the filters before left, renormalised (vLLM's and Hugging Face's
    // top-p after top-k).
    double left = 0.0;
    for (int64_t i = 0; i < keep; ++i) left += p[i];
    double mass = 0.0;
    int64_t nucleus = 0;
    while (nucleus < keep) {
      mass += p[nucleus++];
      if (mass >= params_.top_p * left) break;
    }
    keep = std::max<int64_t>(nucleus, 1);
  }
  at::Tensor filtered = at::zeros_like(probs);
  filtered.index_copy_(0, order.narrow(0, 0, keep), sorted.narrow(0, 0, keep));
  return filtered / filtered.sum();
}

int32_t Sampler::Draw(const at::Tensor& probs) { return DrawIndex(probs, rng_); }

int32_t DrawIndex(const at::Tensor& probs, std::mt19937_64& rng) {
  at::Tensor p = probs.to(at::kFloat).contiguous();
  const float* data = p.data_ptr<float>();
  const int64_t n = p.size(0);
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += data[i];
  std::uniform_real_distribution<double> uniform(0.0, total);
  const double target = uniform(rng);
  double cumulative = 0.0;
  int64_t last_nonzero = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (data[i] <= 0.0f) continue;
    cumulative += data[i];
    last_nonzero = i;
    if (target < cumulative) return static_cast<int32_t>(i);
  }
  // Rounding can leave `target` a hair above the running sum.
  return static_cast<int32_t>(last_nonzero);
}

std::vector<TokenLogprob> TokenLogprobs(const at::Tensor& logits, std::span<const int32_t> tokens,
                                        int64_t top) {
  const auto n = static_cast<int64_t>(tokens.size());
  std::vector<TokenLogprob> out(static_cast<size_t>(n));
  if (n == 0) return out;
  const at::Tensor rows =
      at::log_softmax(logits.narrow(0, 0, n).to(at::kCPU, at::kFloat), /*dim=*/1).contiguous();
  const int64_t vocab = rows.size(1);
  const int64_t k = std::clamp<int64_t>(top, 0, vocab);
  at::Tensor top_values;
  at::Tensor top_indices;
  if (k > 0) {
    std::tie(top_values, top_indices) = rows.topk(k, /*dim=*/1, /*largest=*/true, /*sorted=*/true);
    top_values = top_values.contiguous();
    top_indices = top_indices.contiguous();
  }
  const float* values = rows.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    TokenLogprob& entry = out[static_cast<size_t>(i)];
    entry.logprob = values[i * vocab + tokens[static_cast<size_t>(i)]];
    for (int64_t j = 0; j < k; ++j) {
      entry.top_ids.push_back(static_cast<int32_t>(top_indices.data_ptr<int64_t>()[i * k + j]));
      entry.top_logprobs.push_back(top_values.data_ptr<float>()[i * k + j]);
    }
  }
  return out;
}

int32_t Sampler::Sample(const at::Tensor& logits, std::span<const int32_t> pending) {
  if (params_.greedy()) {
    return static_cast<int32_t>(Adjusted(logits, pending).argmax().item<int64_t>());
  }
  return Draw(Distribution(logits, pending));
}

}  // namespace tophat
