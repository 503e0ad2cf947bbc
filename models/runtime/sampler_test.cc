#include "models/runtime/sampler.h"

#include <map>

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

namespace tophat {
namespace {

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
  const at::Tensor biased = banned.Biased(rows);
  CHECK(biased[1][0].item<float>() == Approx(-97.0f));
  CHECK(biased[0][3].item<float>() == Approx(1.5f));
  CHECK(rows[0][0].item<float>() == 3.0f);
  // Without a bias, the same tensor.
  CHECK(Sampler({}).Biased(rows).is_same(rows));
  CHECK_FALSE(SamplingParams{.logit_bias = {{1, 101.0f}}}.Validate().ok());
  CHECK_FALSE(SamplingParams{.logit_bias = {{1, std::nanf("")}}}.Validate().ok());
  CHECK_FALSE(SamplingParams{.logit_bias = {{-1, 1.0f}}}.Validate().ok());
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
