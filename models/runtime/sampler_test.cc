#include "models/runtime/sampler.h"

#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "nlohmann/json.hpp"

namespace tophat {
namespace {

// A sampler's answer from random logits, token by token, until it chooses id 0 (the end);
// nullopt when 400 choices did not end it. Each token must be one with bytes.
std::optional<std::string> SampleToEnd(const SamplingParams& params,
                                       const std::shared_ptr<const TokenVocabulary>& vocabulary,
                                       std::mt19937_64& rng,
                                       std::normal_distribution<float>& normal) {
  Sampler sampler(params, vocabulary);
  std::string text;
  for (int step = 0; step < 400; ++step) {
    std::vector<float> logits(static_cast<size_t>(vocabulary->size()));
    for (float& logit : logits) logit = normal(rng);
    const int32_t token = sampler.Sample(at::tensor(logits));
    if (token == 0) return text;
    INFO(text);
    REQUIRE(vocabulary->bytes(token) != nullptr);
    text += *vocabulary->bytes(token);
    sampler.Commit(std::vector<int32_t>{token});
  }
  INFO("no end after 400 choices: " << text);
  return std::nullopt;
}

TEST_CASE("Greedy picks the argmax and its distribution is one-hot", "[sampler]") {
  at::Tensor logits = at::tensor({0.1f, 2.0f, -1.0f, 1.9f});
  Sampler sampler({});
  CHECK(sampler.Sample(logits) == 1);
  at::Tensor p = sampler.Distribution(logits);
  CHECK(p[1].item<float>() == 1.0f);
  CHECK(p.sum().item<float>() == 1.0f);
}

TEST_CASE("Token log-probabilities are the logits' log-softmax, with the likeliest tokens",
          "[sampler]") {
  // Row 0 decided token 2, row 1 token 0. bf16 logits are read in float32.
  const at::Tensor logits =
      at::tensor({1.0f, 3.0f, 2.0f, 0.0f, 0.5f, -1.0f, 0.5f, 4.0f}).reshape({2, 4});
  const std::vector<int32_t> tokens = {2, 0};
  const std::vector<TokenLogprob> got = TokenLogprobs(logits.to(at::kBFloat16), tokens, 3);
  REQUIRE(got.size() == 2);
  const auto log_softmax = [](std::vector<double> row, size_t i) {
    double sum = 0;
    for (double x : row) sum += std::exp(x);
    return row[i] - std::log(sum);
  };
  CHECK(got[0].logprob == Approx(log_softmax({1, 3, 2, 0}, 2)).margin(1e-5));
  CHECK(got[1].logprob == Approx(log_softmax({0.5, -1, 0.5, 4}, 0)).margin(1e-5));
  CHECK(got[0].top_ids == std::vector<int32_t>{1, 2, 0});
  REQUIRE(got[0].top_logprobs.size() == 3);
  CHECK(got[0].top_logprobs[0] == Approx(log_softmax({1, 3, 2, 0}, 1)).margin(1e-5));
  CHECK(got[0].top_logprobs[1] == Approx(got[0].logprob).margin(1e-6));
  CHECK(got[1].top_ids[0] == 3);
  // No alternatives asked for; fewer rows' tokens than rows (a round cut at a stop).
  const std::vector<TokenLogprob> bare = TokenLogprobs(logits, std::span(tokens).first(1), 0);
  REQUIRE(bare.size() == 1);
  CHECK(bare[0].top_ids.empty());
  CHECK(bare[0].logprob == Approx(got[0].logprob).margin(1e-5));
  // More alternatives than the vocabulary: all of it.
  CHECK(TokenLogprobs(logits, tokens, 99)[1].top_ids.size() == 4);
}

TEST_CASE("logit_bias shifts every choice: greedy, the distribution, and [n, V] rows",
          "[sampler]") {
  const at::Tensor logits = at::tensor({3.0f, 2.0f, 1.0f, 0.0f});
  Sampler banned({.logit_bias = {{0, -100.0f}, {3, 1.5f}}});
  CHECK(banned.Sample(logits) == 1);  // 3 - 100 < 2 > 0 + 1.5
  CHECK(Sampler({.logit_bias = {{3, 3.5f}}}).Sample(logits) == 3);
  Sampler sampled({.temperature = 1.0, .logit_bias = {{0, -100.0f}}});
  const at::Tensor p = sampled.Distribution(logits);
  CHECK(p[0].item<float>() < 1e-30f);
  CHECK(p[1].item<float>() / p[2].item<float>() == Approx(std::exp(1.0)).epsilon(1e-4));
  // Rows: each gets the bias; the input is left as it was.
  const at::Tensor rows = at::stack({logits, logits});
  const at::Tensor biased = banned.AdjustedRows(rows, {});
  CHECK(biased[1][0].item<float>() == Approx(-97.0f));
  CHECK(biased[0][3].item<float>() == Approx(1.5f));
  CHECK(rows[0][0].item<float>() == 3.0f);
  // Without a bias, the same tensor.
  CHECK(Sampler({}).AdjustedRows(rows, {}).is_same(rows));
  CHECK_FALSE(SamplingParams{.logit_bias = {{1, 101.0f}}}.Validate().ok());
  CHECK_FALSE(SamplingParams{.logit_bias = {{1, std::nanf("")}}}.Validate().ok());
  CHECK_FALSE(SamplingParams{.logit_bias = {{-1, 1.0f}}}.Validate().ok());
}

TEST_CASE("Penalties count the prompt, the committed tokens and the pending ones, after the "
          "bias",
          "[sampler]") {
  const at::Tensor logits = at::tensor({3.0f, 2.0f, -1.0f, 0.5f});
  const at::Tensor untouched = logits.clone();
  Sampler sampler({.logit_bias = {{3, 1.0f}},
                   .presence_penalty = 0.5,
                   .frequency_penalty = 0.25,
                   .repetition_penalty = 2.0});
  sampler.SetPrompt(std::vector<int32_t>{3, 3});
  // Nothing generated: the prompt's token 3 only, by repetition, after its bias: 1.5 / 2.
  at::Tensor adjusted = sampler.Adjusted(logits);
  CHECK(adjusted[3].item<float>() == Approx(0.75f));
  CHECK(adjusted[0].item<float>() == 3.0f);
  sampler.Commit(std::vector<int32_t>{0, 0});
  adjusted = sampler.Adjusted(logits);
  CHECK(adjusted[0].item<float>() == Approx(3.0f / 2 - 0.25f * 2 - 0.5f));  // 0.5
  CHECK(adjusted[2].item<float>() == -1.0f);
  CHECK(sampler.Sample(logits) == 1);  // [0.5, 2, -1, 0.75]
  // Pending tokens count as generated: a negative logit is multiplied by the repetition
  // penalty; token 1 drops below token 3.
  const std::vector<int32_t> drafts = {2, 1};
  at::Tensor with_pending = sampler.Adjusted(logits, drafts);
  CHECK(with_pending[2].item<float>() == Approx(-1.0f * 2 - 0.25f - 0.5f));
  CHECK(with_pending[1].item<float>() == Approx(2.0f / 2 - 0.25f - 0.5f));
  CHECK(sampler.Sample(logits, drafts) == 3);
  // A verification's rows: row i sees the drafts before it.
  const at::Tensor rows = sampler.AdjustedRows(at::stack({logits, logits, logits}), drafts);
  CHECK(at::equal(rows[0], sampler.Adjusted(logits)));
  CHECK(at::equal(rows[1], sampler.Adjusted(logits, std::span(drafts).first(1))));
  CHECK(at::equal(rows[2], with_pending));
  Sampler sampled({.temperature = 0.7, .presence_penalty = 1.0});
  sampled.Commit(std::vector<int32_t>{1});
  CHECK(at::allclose(sampled.Distribution(logits, std::vector<int32_t>{0}),
                     at::softmax(at::tensor({2.0f, 1.0f, -1.0f, 0.5f}) / 0.7, 0)));
  CHECK(at::equal(logits, untouched));
  // Without penalties nothing is kept or changed.
  Sampler plain({});
  plain.SetPrompt(std::vector<int32_t>{0});
  plain.Commit(std::vector<int32_t>{0});
  CHECK(plain.Adjusted(logits, drafts).is_same(logits));
  CHECK_FALSE(SamplingParams{.presence_penalty = 2.5}.Validate().ok());
  CHECK_FALSE(SamplingParams{.frequency_penalty = std::nan("")}.Validate().ok());
  CHECK_FALSE(SamplingParams{.repetition_penalty = 0}.Validate().ok());
  CHECK(SamplingParams{.presence_penalty = -2, .frequency_penalty = 2, .repetition_penalty = 1.3}
            .Validate()
            .ok());
}

TEST_CASE("min_tokens keeps the stop ids from being chosen until enough tokens, pending "
          "ones included",
          "[sampler]") {
  const at::Tensor logits = at::tensor({3.0f, 2.0f, 1.0f, 0.0f});
  Sampler sampler({.min_tokens = 3, .stop_ids = {0, 7}});  // 7: outside the vocabulary
  CHECK(sampler.Sample(logits) == 1);
  CHECK(std::isinf(sampler.Adjusted(logits)[0].item<float>()));
  sampler.Commit(std::vector<int32_t>{1, 1});
  CHECK(sampler.Sample(logits) == 1);                            // 2 generated
  CHECK(sampler.Sample(logits, std::vector<int32_t>{2}) == 0);  // 2 + 1 pending
  // A verification's rows: the row after two drafts may stop, the first may not.
  const at::Tensor rows =
      sampler.AdjustedRows(at::stack({logits, logits}), std::vector<int32_t>{1});
  CHECK(rows[0].argmax().item<int64_t>() == 1);
  CHECK(rows[1].argmax().item<int64_t>() == 0);
  CHECK(at::equal(logits, at::tensor({3.0f, 2.0f, 1.0f, 0.0f})));
  // Sampled: no probability on the stop id.
  Sampler sampled({.temperature = 1.0, .min_tokens = 1, .stop_ids = {0}});
  CHECK(sampled.Distribution(logits)[0].item<float>() == 0.0f);
  CHECK_FALSE(SamplingParams{.min_tokens = -1}.Validate().ok());
}

TEST_CASE("A JSON response format refuses what cannot start or continue an object, pending "
          "tokens and verification rows included",
          "[sampler]") {
  // Ids: 0 ends the answer (special), 1 "{", 2 "}", 3 "x", 4 "\"", 5 "{}"; the logits are one
  // longer than the vocabulary (a padded head), and the last, likeliest, row is no token.
  const auto vocabulary = std::make_shared<const TokenVocabulary>(
      std::vector<std::optional<std::string>>{std::nullopt, "{", "}", "x", "\"", "{}"});
  const at::Tensor logits = at::tensor({5.0f, 1.0f, 4.0f, 3.0f, 2.0f, 0.0f, 9.0f});
  const SamplingParams json{.stop_ids = {0}, .response_format = ResponseFormat::kJsonObject};
  Sampler sampler(json, vocabulary);
  const float inf = std::numeric_limits<float>::infinity();
  // Only "{" and "{}" can start an object.
  CHECK(at::equal(sampler.Adjusted(logits),
                  at::tensor({-inf, 1.0f, -inf, -inf, -inf, 0.0f, -inf})));
  CHECK(sampler.Sample(logits) == 1);
  // After "{": a key's quote or the close; after "{}": only the end.
  CHECK(sampler.Sample(logits, std::vector<int32_t>{1}) == 2);
  CHECK(sampler.Sample(logits, std::vector<int32_t>{5}) == 0);
  const at::Tensor rows =
      sampler.AdjustedRows(at::stack({logits, logits, logits}), std::vector<int32_t>{1, 4});
  CHECK(at::equal(rows[1], sampler.Adjusted(logits, std::vector<int32_t>{1})));
  // In the key every token with bytes may come, not the end nor the padded row.
  CHECK(at::equal(rows[2], at::tensor({-inf, 1.0f, 4.0f, 3.0f, 2.0f, 0.0f, -inf})));
  sampler.Commit(std::vector<int32_t>{1, 4, 3});
  CHECK(sampler.Sample(logits) == 2);
  // Sampled: no probability off the object.
  Sampler sampled({.temperature = 1.0, .stop_ids = {0}, .response_format = ResponseFormat::kJsonObject},
                  vocabulary);
  const at::Tensor p = sampled.Distribution(logits);
  CHECK(p[1].item<float>() + p[5].item<float>() == Approx(1.0));

  CHECK_FALSE(SamplingParams{.min_tokens = 1, .stop_ids = {0},
                             .response_format = ResponseFormat::kJsonObject}
                  .Validate()
                  .ok());
  CHECK_FALSE(SamplingParams{.response_format = ResponseFormat::kJsonObject}.Validate().ok());
  CHECK(json.Validate().ok());
}

TEST_CASE("Required tool calls: greedy choices from random logits write calls the grammar "
          "takes, then the end",
          "[sampler]") {
  // Id 0 ends the answer; the others are pieces of Qwen's and Llama's call syntax and of the
  // arguments, cut across their boundaries, and enough smaller ones that every piece is
  // followed by another (else the constraint ends the answer where the vocabulary stops).
  std::vector<std::optional<std::string>> tokens = {std::nullopt};
  for (const char* piece :
       {"<tool_call>\n", "<tool_call>", "\n", "{\"name\": \"", "{", "}", "\"", "name", ":",
        " ", "get", "_weather", "get_weather", "\", \"arguments\": ", "\", \"parameters\": ",
        "\", ", ",", "arguments", "parameters", "city", "\"city\"", "days", "\"days\": ",
        "Paris", "x", "1", "2", "0", "\\n", "\xC3\xA9", "}}", "}\n</tool_call>",
        "\n</tool_call>", "</tool_call>"}) {
    tokens.emplace_back(piece);
  }
  const auto vocabulary = std::make_shared<const TokenVocabulary>(std::move(tokens));
  auto weather = CompiledSchema::Compile(nlohmann::json::parse(R"({"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
      "required": ["city"], "additionalProperties": false})"));
  auto get = CompiledSchema::Compile(nlohmann::json::parse(R"({"type": "object",
      "properties": {"days": {"type": "integer", "maximum": 9}}, "additionalProperties": false})"));
  REQUIRE(weather.ok());
  REQUIRE(get.ok());
  const std::vector<ToolCallTool> tools = {{.name = "get_weather", .parameters = *weather},
                                           {.name = "get", .parameters = *get}};
  const ToolCallSyntax hermes{.open = "<tool_call>\n{\"name\": \"",
                              .between = "\", \"arguments\": ",
                              .close = "}\n</tool_call>",
                              .separator = "\n"};
  const ToolCallSyntax llama{
      .open = "{\"name\": \"", .between = "\", \"parameters\": ", .close = "}"};
  std::mt19937_64 rng(21);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (const auto& [syntax, max_calls] : {std::pair{hermes, 2}, {llama, 1}}) {
    auto spec = ToolCallSpec::Create(syntax, tools, max_calls);
    REQUIRE(spec.ok());
    const SamplingParams params{
        .stop_ids = {0}, .response_format = ResponseFormat::kToolCalls, .tool_calls = *spec};
    REQUIRE(params.Validate().ok());
    std::set<std::string> answers;
    for (int answer = 0; answer < 20; ++answer) {
      const std::optional<std::string> text = SampleToEnd(params, vocabulary, rng, normal);
      REQUIRE(text.has_value());
      ToolCallGrammar grammar(spec->get());
      CHECK(grammar.Feed(*text));
      CHECK(grammar.can_end());
      CHECK(grammar.complete() == (grammar.calls() == max_calls));
      answers.insert(*text);
    }
    CHECK(answers.size() > 10);
  }
  const auto refused =
      SamplingParams{.stop_ids = {0}, .response_format = ResponseFormat::kToolCalls}.Validate();
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.message()), Catch::Contains("tool-call response format"));
}

TEST_CASE(
    "A GBNF grammar: greedy choices from random logits write what its root matches, "
    "then the end",
    "[sampler]") {
  // Sums of numbers and parenthesised sums (recursive); id 0 ends the answer, the others are
  // pieces cut across the grammar's tokens.
  std::vector<std::optional<std::string>> tokens = {std::nullopt};
  for (const char* piece : {"(", ")", "+", "-", "1", "2", "0", "12", "(1", "+(", "))", "x"}) {
    tokens.emplace_back(piece);
  }
  const auto vocabulary = std::make_shared<const TokenVocabulary>(std::move(tokens));
  auto grammar = EbnfGrammar::Compile(R"g(
      root ::= expr
      expr ::= term (("+" | "-") term){0,2}
      term ::= [0-9]{1,3} | "(" expr ")")g");
  REQUIRE(grammar.ok());
  const SamplingParams params{
      .stop_ids = {0}, .response_format = ResponseFormat::kGrammar, .grammar = *grammar};
  REQUIRE(params.Validate().ok());
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::set<std::string> answers;
  bool nested = false;
  for (int answer = 0; answer < 20; ++answer) {
    const std::optional<std::string> answer_text = SampleToEnd(params, vocabulary, rng, normal);
    REQUIRE(answer_text.has_value());
    const std::string& text = *answer_text;
    EbnfWorkspace workspace(grammar->get());
    EbnfState state(&workspace);
    CHECK(state.Feed(text));
    CHECK(state.can_end());
    nested = nested || text.find('(') != std::string::npos;
    answers.insert(text);
  }
  CHECK(answers.size() > 10);
  CHECK(nested);
  const auto refused =
      SamplingParams{.stop_ids = {0}, .response_format = ResponseFormat::kGrammar}.Validate();
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.message()), Catch::Contains("grammar response format"));
}

TEST_CASE("Top-k and top-p keep exactly the expected support", "[sampler]") {
  // Probabilities after softmax at T=1: roughly 0.64, 0.24, 0.09, 0.03.
  at::Tensor logits = at::tensor({3.0f, 2.0f, 1.0f, 0.0f});
  Sampler top2({.temperature = 1.0, .top_k = 2});
  at::Tensor p2 = top2.Distribution(logits);
  CHECK(p2[2].item<float>() == 0.0f);
  CHECK(p2[3].item<float>() == 0.0f);
  CHECK(p2.sum().item<float>() == Approx(1.0));
  CHECK(p2[0].item<float>() / p2[1].item<float>() == Approx(std::exp(1.0)).epsilon(1e-4));

  Sampler nucleus({.temperature = 1.0, .top_p = 0.8});  // 0.64 < 0.8 <= 0.88: two tokens
  at::Tensor pn = nucleus.Distribution(logits);
  CHECK(pn[1].item<float>() > 0.0f);
  CHECK(pn[2].item<float>() == 0.0f);

  Sampler tiny_p({.temperature = 1.0, .top_p = 0.01});  // always keeps the top token
  CHECK(tiny_p.Distribution(logits)[0].item<float>() == Approx(1.0));

  // Top-p after top-k is the nucleus of the top k renormalised (vLLM's and Hugging Face's):
  // of 0.64 and 0.24, 0.727 >= 0.7 alone.
  CHECK(Sampler({.temperature = 1.0, .top_k = 2, .top_p = 0.7}).Distribution(logits)[1]
            .item<float>() == 0.0f);

  // min_p keeps what is at least min_p times the likeliest: 0.24 / 0.64 = 0.37 and
  // 0.09 / 0.64 = 0.135.
  const at::Tensor pm = Sampler({.temperature = 1.0, .min_p = 0.3}).Distribution(logits);
  CHECK(pm[1].item<float>() > 0.0f);
  CHECK(pm[2].item<float>() == 0.0f);
  CHECK(pm.sum().item<float>() == Approx(1.0));
  CHECK(pm[0].item<float>() / pm[1].item<float>() == Approx(std::exp(1.0)).epsilon(1e-4));
  // ... after temperature: at T = 2 the ratios are 0.61 and 0.37.
  CHECK(Sampler({.temperature = 2.0, .min_p = 0.3}).Distribution(logits)[2].item<float>() > 0.0f);
  // min_p 1 is greedy (the likeliest alone), whatever the temperature.
  CHECK(Sampler({.temperature = 1.5, .min_p = 1.0}).Distribution(logits)[0].item<float>() ==
        Approx(1.0));
  // With top-p, the nucleus is taken of what min_p left: 0.64 / 0.88 = 0.727 >= 0.7.
  CHECK(Sampler({.temperature = 1.0, .top_p = 0.7, .min_p = 0.3}).Distribution(logits)[1]
            .item<float>() == 0.0f);
  CHECK_FALSE(SamplingParams{.min_p = 1.5}.Validate().ok());
  CHECK_FALSE(SamplingParams{.min_p = -0.1}.Validate().ok());
}

TEST_CASE("Seeded sampling follows the distribution and repeats per seed", "[sampler]") {
  at::Tensor logits = at::tensor({1.0f, 0.0f, 2.0f});
  at::Tensor expected = at::softmax(logits, 0);
  Sampler sampler({.temperature = 1.0, .seed = 42});
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[sampler.Sample(logits)];
  for (int32_t id = 0; id < 3; ++id) {
    CHECK(static_cast<double>(counts[id]) / n ==
          Approx(expected[id].item<double>()).margin(0.015));
  }
  Sampler a({.temperature = 0.7, .seed = 9});
  Sampler b({.temperature = 0.7, .seed = 9});
  for (int i = 0; i < 50; ++i) CHECK(a.Sample(logits) == b.Sample(logits));
}

TEST_CASE(
    "A reasoning budget forces the end of reasoning once spent, and masks nothing "
    "before",
    "[sampler]") {
  // Ids: 0 ends the answer, 1 "</think>", 2 "a", 3 "b"; "a" is the likeliest.
  const auto vocabulary = std::make_shared<const TokenVocabulary>(
      std::vector<std::optional<std::string>>{std::nullopt, "</think>", "a", "b"});
  const at::Tensor logits = at::tensor({0.0f, 1.0f, 5.0f, 2.0f});
  const SamplingParams params{.stop_ids = {0}, .format_after_token = 1, .reasoning_budget = 2};
  REQUIRE(params.Validate().ok());
  REQUIRE(params.history_dependent());
  Sampler sampler(params, vocabulary);
  // Within the budget no mask is applied: the very tensor comes back, uncopied.
  CHECK(sampler.Adjusted(logits).is_same(logits));
  CHECK(sampler.Sample(logits) == 2);
  CHECK(sampler.Sample(logits, std::vector<int32_t>{2, 2}) == 1);  // pending ones count
  const at::Tensor rows =
      sampler.AdjustedRows(at::stack({logits, logits, logits}), std::vector<int32_t>{2, 3});
  CHECK(rows[1].argmax().item<int64_t>() == 2);
  CHECK(rows[2].argmax().item<int64_t>() == 1);
  sampler.Commit(std::vector<int32_t>{2, 3});
  CHECK(sampler.Sample(logits) == 1);
  Sampler sampled(
      {.temperature = 1.0, .stop_ids = {0}, .format_after_token = 1, .reasoning_budget = 0},
      vocabulary);
  CHECK(sampled.Distribution(logits)[1].item<float>() == Approx(1.0));
  // After </think> the answer is free again.
  sampler.Commit(std::vector<int32_t>{1});
  CHECK(sampler.Adjusted(logits).is_same(logits));
  CHECK(sampler.Sample(logits) == 2);

  // A message before </think>: "b", "a", then "</think>", each forced in turn, greedy or
  // sampled, committed or drafted.
  const SamplingParams with_message{.temperature = 1.0,
                                    .stop_ids = {0},
                                    .format_after_token = 1,
                                    .reasoning_budget = 1,
                                    .reasoning_budget_end = {3, 2}};
  REQUIRE(with_message.Validate().ok());
  Sampler ended(with_message, vocabulary);
  ended.Commit(std::vector<int32_t>{2});
  CHECK(ended.Distribution(logits)[3].item<float>() == Approx(1.0));
  CHECK(ended.Sample(logits, std::vector<int32_t>{3}) == 2);
  CHECK(ended.Sample(logits, std::vector<int32_t>{3, 2}) == 1);
  ended.Commit(std::vector<int32_t>{3, 2, 1});
  CHECK(ended.Adjusted(logits).is_same(logits));

  CHECK_THAT(std::string(SamplingParams{.reasoning_budget = 3}.Validate().message()),
             Catch::Contains("needs the token that ends the reasoning"));
  CHECK_FALSE(SamplingParams{.format_after_token = 1, .reasoning_budget = -2}.Validate().ok());
  CHECK_THAT(std::string(SamplingParams{.format_after_token = 1, .reasoning_budget_end = {2}}
                             .Validate()
                             .message()),
             Catch::Contains("need the budget"));
  CHECK_THAT(std::string(SamplingParams{.format_after_token = 1,
                                        .reasoning_budget = 2,
                                        .reasoning_budget_end = {2, 1}}
                             .Validate()
                             .message()),
             Catch::Contains("token id 1 is the reasoning's end"));
}

TEST_CASE("Invalid sampling parameters are rejected by name", "[sampler]") {
  CHECK_FALSE(SamplingParams{.temperature = -1}.Validate().ok());
  CHECK_FALSE(SamplingParams{.top_k = -2}.Validate().ok());
  auto status = SamplingParams{.top_p = 1.5}.Validate();
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(std::string(status.message()), Catch::Contains("top_p"));
  // Non-finite values are refused, not turned into a repeated token, noise or "off".
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  for (double temperature : {nan, inf, -inf}) {
    INFO(temperature);
    auto refused = SamplingParams{.temperature = temperature}.Validate();
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(std::string(refused.message()), Catch::Contains("temperature must be finite"));
  }
  for (double top_p : {nan, inf, -0.5, 0.0}) {
    INFO(top_p);
    CHECK_THAT(std::string(SamplingParams{.top_p = top_p}.Validate().message()),
               Catch::Contains("top_p must be in (0, 1]"));
  }
  CHECK(SamplingParams{.temperature = 0.7, .top_k = 5, .top_p = 0.9}.Validate().ok());
}

}  // namespace
}  // namespace tophat
