#include "models/runtime/speculative_verify.h"

#include <array>
#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

namespace tophat {
namespace {

at::Tensor Rows(const std::vector<std::vector<float>>& rows) {
  at::Tensor t = at::empty({static_cast<int64_t>(rows.size()),
                            static_cast<int64_t>(rows.front().size())});
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t j = 0; j < rows[i].size(); ++j) t[i][j] = rows[i][j];
  }
  return t;
}

TEST_CASE("Greedy verification keeps the agreeing prefix and adds the target's token") {
  // Target argmax per row: 2, 0, 3, 1.
  const at::Tensor logits = Rows({{0, 1, 5, 2}, {4, 1, 0, 2}, {0, 0, 1, 9}, {0, 3, 1, 2}});
  const std::vector<int32_t> all_agree = {2, 0, 3};
  VerifyResult r = VerifyGreedy(logits, all_agree);
  CHECK(r.accepted == 3);
  CHECK(r.next_token == 1);  // bonus token from the last row

  const std::vector<int32_t> second_wrong = {2, 1, 3};
  r = VerifyGreedy(logits, second_wrong);
  CHECK(r.accepted == 1);
  CHECK(r.next_token == 0);  // the correction at the first disagreement

  r = VerifyGreedy(logits.narrow(0, 0, 1), {});
  CHECK(r.accepted == 0);
  CHECK(r.next_token == 2);  // no drafts: plain decoding

  // Ties go to the lowest index, as the sampler's greedy mode does.
  r = VerifyGreedy(Rows({{3, 7, 7, 1}}), {});
  CHECK(r.next_token == 1);
}

// Draws `count` emitted sequences through speculative sampling with i.i.d. drafts from q
// against a context-free target p, and returns the frequency of each token at emitted
// position `position`.
std::array<double, 4> EmittedFrequencies(const std::vector<float>& p, const std::vector<float>& q,
                                         int drafts_per_round, int position, int count,
                                         uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::discrete_distribution<int32_t> draft_dist(q.begin(), q.end());
  const at::Tensor target = Rows(std::vector<std::vector<float>>(drafts_per_round + 1, p));
  const at::Tensor draft = Rows(std::vector<std::vector<float>>(drafts_per_round, q));
  std::array<double, 4> counts{};
  for (int trial = 0; trial < count; ++trial) {
    std::vector<int32_t> emitted;
    while (static_cast<int>(emitted.size()) <= position) {
      std::vector<int32_t> drafts(drafts_per_round);
      for (int32_t& d : drafts) d = draft_dist(rng);
      const VerifyResult r = VerifySpeculativeSampling(target, draft, drafts, rng);
      emitted.insert(emitted.end(), drafts.begin(), drafts.begin() + r.accepted);
      emitted.push_back(r.next_token);
    }
    counts[emitted[position]] += 1;
  }
  for (double& c : counts) c /= count;
  return counts;
}

double TotalVariation(const std::array<double, 4>& a, const std::vector<float>& b) {
  double tv = 0;
  for (size_t i = 0; i < 4; ++i) tv += std::abs(a[i] - b[i]);
  return tv / 2;
}

TEST_CASE("Speculative sampling emits the target distribution at every position") {
  const std::vector<float> p = {0.5f, 0.3f, 0.15f, 0.05f};
  const std::vector<float> q = {0.1f, 0.2f, 0.3f, 0.4f};  // TV(p, q) = 0.45: a bad drafter
  const int trials = 20000;
  // With 20000 samples each frequency has a standard error below 0.0036; the TV of an
  // exact sampler stays well under 0.02, while emitting drafts unchecked would give ~0.45.
  for (int drafts : {1, 3}) {
    for (int position : {0, 1, 2}) {
      INFO("drafts per round " << drafts << ", emitted position " << position);
      const auto freq = EmittedFrequencies(p, q, drafts, position, trials, 100 + position);
      CHECK(TotalVariation(freq, p) < 0.02);
    }
  }
}

TEST_CASE("A broken acceptance rule is caught by the same bound") {
  // Always accepting is what a wrong p/q ratio degenerates to: the drafts' q shows through.
  const std::vector<float> p = {0.5f, 0.3f, 0.15f, 0.05f};
  const std::vector<float> q = {0.1f, 0.2f, 0.3f, 0.4f};
  std::mt19937_64 rng(7);
  std::discrete_distribution<int32_t> draft_dist(q.begin(), q.end());
  const at::Tensor target = Rows({q, q});  // a verifier that believes the drafter
  const at::Tensor draft = Rows({q});
  std::array<double, 4> freq{};
  const int trials = 20000;
  for (int i = 0; i < trials; ++i) {
    const std::vector<int32_t> drafts = {draft_dist(rng)};
    const VerifyResult r = VerifySpeculativeSampling(target, draft, drafts, rng);
    freq[r.accepted == 1 ? drafts[0] : r.next_token] += 1.0 / trials;
  }
  CHECK(TotalVariation(freq, p) > 0.3);
}

TEST_CASE("Speculative sampling with identical distributions accepts every draft") {
  const std::vector<float> p = {0.25f, 0.25f, 0.25f, 0.25f};
  std::mt19937_64 rng(3);
  const std::vector<int32_t> drafts = {0, 3, 2};
  const VerifyResult r =
      VerifySpeculativeSampling(Rows({p, p, p, p}), Rows({p, p, p}), drafts, rng);
  CHECK(r.accepted == 3);
  CHECK(r.next_token >= 0);
  CHECK(r.next_token < 4);
}

TEST_CASE("A forced draft without a q row verifies as a one-hot row would, draw for draw") {
  // Targets that do and do not put all their mass on the forced token (a format's forced
  // token gets p = 1; a wrong one must still be refused as often as a one-hot q is).
  const std::vector<std::vector<float>> targets = {
      {0.0f, 0.0f, 1.0f, 0.0f}, {0.5f, 0.3f, 0.15f, 0.05f}, {0.1f, 0.2f, 0.3f, 0.4f}};
  const std::vector<float> q = {0.4f, 0.3f, 0.2f, 0.1f};
  std::mt19937_64 pick(11);
  int rejected_forced = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + static_cast<int>(pick() % 5);
    std::vector<std::vector<float>> p_rows;
    std::vector<std::vector<float>> one_hot_rows;
    std::vector<std::vector<float>> unforced_rows;
    std::vector<int32_t> drafts;
    std::vector<uint8_t> forced;
    for (int i = 0; i < n; ++i) {
      p_rows.push_back(targets[pick() % targets.size()]);
      const int32_t token = static_cast<int32_t>(pick() % 4);
      drafts.push_back(token);
      forced.push_back(pick() % 2);
      if (forced.back() != 0) {
        std::vector<float> one_hot(4, 0.0f);
        one_hot[token] = 1.0f;
        one_hot_rows.push_back(one_hot);
      } else {
        one_hot_rows.push_back(q);
        unforced_rows.push_back(q);
      }
    }
    p_rows.push_back(targets[pick() % targets.size()]);
    const at::Tensor unforced =
        unforced_rows.empty() ? at::empty({0, 4}, at::kFloat) : Rows(unforced_rows);
    std::mt19937_64 with_rows(1000 + trial);
    std::mt19937_64 without_rows(1000 + trial);
    const VerifyResult expected =
        VerifySpeculativeSampling(Rows(p_rows), Rows(one_hot_rows), drafts, with_rows);
    const VerifyResult got =
        VerifySpeculativeSampling(Rows(p_rows), unforced, drafts, without_rows, forced);
    INFO("trial " << trial);
    REQUIRE(got.accepted == expected.accepted);
    REQUIRE(got.next_token == expected.next_token);
    if (expected.accepted < n && forced[expected.accepted] != 0) ++rejected_forced;
  }
  // The comparison saw forced drafts refused (a target that did not force them), not only
  // kept ones.
  CHECK(rejected_forced > 100);
}

}  // namespace
}  // namespace tophat
