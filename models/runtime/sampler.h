// Token choice from logits: greedy, or seeded temperature / top-k / top-p sampling.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "models/grammar/choice_grammar.h"
#include "models/grammar/ebnf_grammar.h"
#include "models/grammar/harmony_call_constraint.h"
#include "models/grammar/json_constraint.h"
#include "models/grammar/regex_grammar.h"
#include "models/grammar/structural_tag_grammar.h"
#include "models/grammar/tool_call_grammar.h"

namespace tophat {

// What an answer must be (OpenAI's response_format).
enum class ResponseFormat : uint8_t {
  kText,        // anything
  kJsonObject,  // a JSON object, then the end (JsonConstraint)
  kJsonSchema,  // a value of SamplingParams::json_schema, then the end (SchemaConstraint)
  kToolCalls,   // tool calls of SamplingParams::tool_calls, then the end (ToolCallConstraint)
  kRegex,       // text SamplingParams::regex matches whole, then the end (RegexConstraint)
  kGrammar,     // text SamplingParams::grammar's root matches whole, then the end (EbnfConstraint)
  // text in which each structure of SamplingParams::structural_tag begun is whole and valid
  // (StructuralTagConstraint)
  kStructuralTag,
  kChoice,  // one of SamplingParams::choice's strings, then the end (ChoiceConstraint)
  // gpt-oss's reasoning, then one call of SamplingParams::harmony_call's tools in harmony's
  // layout (HarmonyCallConstraint)
  kHarmonyCall,
};

struct SamplingParams {
  double temperature = 0.0;  // 0 means greedy
  int64_t top_k = 0;         // 0 keeps every token
  double top_p = 1.0;        // nucleus mass kept, in (0, 1]
  // Keeps the tokens at least min_p times as likely as the likeliest (vLLM's and llama.cpp's
  // min_p), in [0, 1]; 0 keeps every token.
  double min_p = 0.0;
  uint64_t seed = 0;
  // Added to the logits of these token ids before any choice (OpenAI's logit_bias, each in
  // [-100, 100]: -100 bans a token, 100 all but forces it). The ids are the caller's to check
  // against the vocabulary.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Penalties on repetition, as OpenAI's and vLLM's servers apply them: each logit of a
  // token generated c > 0 times so far loses frequency_penalty * c + presence_penalty
  // (each in [-2, 2]; 0 is off), and a token in the prompt or generated so far has its logit
  // divided by repetition_penalty when positive, multiplied when not (> 0; 1 is off;
  // Hugging Face's and vLLM's repetition_penalty). Applied after logit_bias.
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  double repetition_penalty = 1.0;
  // Until min_tokens tokens are generated, these (the request's end-of-sequence and stop
  // ids) cannot be chosen (vLLM's min_tokens); 0: no minimum.
  int64_t min_tokens = 0;
  std::vector<int32_t> stop_ids;
  // kJsonObject: every choice keeps the answer a JSON object that can still be completed,
  // and once it is complete only stop_ids may follow, which it then needs (the Sampler needs
  // the tokenizer's TokenVocabulary). Not with min_tokens: the object could be complete
  // before the minimum, leaving nothing to choose. kJsonSchema: the same for a value of
  // json_schema; kToolCalls, for tool_calls' calls (tool_choice "required" or a named
  // function); kRegex, for text `regex` matches; kGrammar, for text `grammar`'s root matches;
  // kStructuralTag, for text whose structures `structural_tag` holds to (its text may end
  // anywhere, so it is never complete).
  ResponseFormat response_format = ResponseFormat::kText;
  std::shared_ptr<const CompiledSchema> json_schema;  // with kJsonSchema
  std::shared_ptr<const ToolCallSpec> tool_calls;     // with kToolCalls
  std::shared_ptr<const StringPattern> regex;         // with kRegex (CompileRegexFormat)
  std::shared_ptr<const EbnfGrammar> grammar;         // with kGrammar (EbnfGrammar::Compile)
  std::shared_ptr<const StructuralTagSpec> structural_tag;  // with kStructuralTag
  std::shared_ptr<const ChoiceSpec> choice;                 // with kChoice
  std::shared_ptr<const HarmonyCallSpec> harmony_call;      // with kHarmonyCall
  // A thinking model's end of reasoning ("</think>"'s id), or -1: the format holds only for
  // the tokens after the first of these, the reasoning before it free
  // (AfterTokenConstraint).
  int32_t format_after_token = -1;
  // The tokens that must come right before format_after_token for it to end the reasoning
  // (gpt-oss's "<|channel|>final" before "<|message|>"); its first token is not repeated in
  // it.
  std::vector<int32_t> format_after_prefix;
  // The most tokens before format_after_token (-1: no limit): once they are generated it is
  // the only choice, and the answer proper follows (vLLM's thinking_token_budget). Only with
  // format_after_token, with or without a format, or with kHarmonyCall (the tokens before
  // the call, HarmonyCallConstraint).
  int64_t reasoning_budget = -1;
  // With reasoning_budget: the tokens forced before format_after_token once the budget is
  // spent (a message that ends the reasoning, as llama.cpp's reasoning budget message;
  // none: the token alone). Forcing waits until the reasoning's text ends between characters
  // (AfterTokenConstraint::kCharacterWait).
  std::vector<int32_t> reasoning_budget_end;

  absl::Status Validate() const;
  bool greedy() const { return temperature <= 0.0; }
  bool penalized() const {
    return presence_penalty != 0.0 || frequency_penalty != 0.0 || repetition_penalty != 1.0;
  }
  // Whether a choice depends on the tokens before it (penalties, a minimum length, a
  // format, a reasoning budget).
  bool history_dependent() const {
    return penalized() || min_tokens > 0 || response_format != ResponseFormat::kText ||
           reasoning_budget >= 0;
  }
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

// Token choice for one request. With penalties it keeps what they count: the prompt
// (SetPrompt) and the tokens generated so far (Commit); with a format, the answer so far. A choice at a position past tokens
// not yet committed (the drafts before it in a speculative round) names them as `pending`,
// so that a draft, its verification and plain decoding all see the same history.
class Sampler {
 public:
  // `vocabulary` (the tokenizer's) is required with a response format other than kText and
  // unused otherwise.
  explicit Sampler(const SamplingParams& params,
                   std::shared_ptr<const TokenVocabulary> vocabulary = nullptr);

  // The prompt, which repetition_penalty counts as seen. Only kept when it applies.
  void SetPrompt(std::span<const int32_t> prompt);
  // Tokens generated (emitted) since the last Commit, in order.
  void Commit(std::span<const int32_t> tokens);

  // logits: [V] float32, the model's. Greedy takes the lowest index among equal maxima of
  // the adjusted logits.
  int32_t Sample(const at::Tensor& logits, std::span<const int32_t> pending = {});
  // The token the format leaves after the committed tokens and `pending`, whatever the
  // logits (TokenConstraint::Forced): the one it allows, which Sample would take, or a guess
  // at a literal's spelling; nullopt where the format leaves a choice, and for an end of the
  // answer (the decoder never runs past one).
  std::optional<ForcedDraft> ForcedToken(std::span<const int32_t> pending = {}) const;

  // The distribution Sample() draws from, [V] float32 summing to 1: softmax(adjusted logits /
  // T) restricted, as vLLM does it, to the tokens min_p keeps, then the top k of them, then
  // the nucleus of what is left renormalised, and renormalised. Speculative sampling needs
  // it.
  at::Tensor Distribution(const at::Tensor& logits, std::span<const int32_t> pending = {}) const;

  // The logits a choice compares, [V]: logit_bias added, then the penalties for the committed
  // tokens followed by `pending`, the stop ids at -inf while min_tokens are not yet
  // generated, and every token the format refuses after them at -inf. The same tensor, not a
  // copy, when none of that applies.
  at::Tensor Adjusted(const at::Tensor& logits, std::span<const int32_t> pending = {}) const;
  // A verification's rows, [n, V]: row i as Adjusted(logits[i], drafts[0, i)), the drafts
  // before the position it decides (drafts may be longer than n - 1).
  at::Tensor AdjustedRows(const at::Tensor& logits, std::span<const int32_t> drafts) const;

  // Draws an index from a [V] probability vector with this sampler's generator.
  int32_t Draw(const at::Tensor& probs);

  const SamplingParams& params() const { return params_; }
  // The format did not follow a way it allows for one of its bounds (TokenConstraint).
  bool format_cut_by_limit() const { return format_ != nullptr && format_->cut_by_limit(); }

 private:
  // logits + logit_bias, [V] or [n, V]; the same tensor without a bias.
  at::Tensor Biased(const at::Tensor& logits) const;
  // Applies the penalties for the committed tokens and `pending` to a [V] float32 row.
  void Penalize(at::Tensor& row, std::span<const int32_t> pending) const;

  SamplingParams params_;
  std::mt19937_64 rng_;
  // logit_bias as tensors, for one index_add.
  at::Tensor bias_ids_;     // [k] int64
  at::Tensor bias_values_;  // [k] float32
  // What the penalties count (empty without them): times each token was generated, and the
  // prompt's distinct tokens (with repetition_penalty only).
  absl::flat_hash_map<int32_t, int64_t> generated_counts_;
  int64_t generated_ = 0;  // tokens committed, with min_tokens
  std::vector<int32_t> prompt_tokens_;  // sorted, unique
  // With a response format other than kText, or a reasoning budget.
  std::unique_ptr<TokenConstraint> format_;
};

}  // namespace tophat
