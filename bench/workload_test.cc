#include "bench/workload.h"

#include <algorithm>
#include <fstream>

#include <catch2/catch.hpp>

namespace tophat {
namespace {

TEST_CASE("Built-in prompt-length distributions match the datasets' mean and P90") {
  for (const auto& [spec, mean, p90] :
       {std::tuple{"specbench", 351.0, 891.0}, std::tuple{"cnndm", 1037.0, 1772.0}}) {
    auto sampler = PromptLengthSampler::FromSpec(spec);
    REQUIRE(sampler.ok());
    std::mt19937_64 rng(1);
    std::vector<double> lengths;
    for (int i = 0; i < 20000; ++i) lengths.push_back(sampler->Sample(rng, 1 << 20));
    const LatencySummary summary = Summarize(lengths);
    CHECK(summary.mean == Approx(mean).epsilon(0.05));
    CHECK(summary.p90 == Approx(p90).epsilon(0.05));
  }
}

TEST_CASE("Prompt lengths are clamped, fixed, or read from a file with line errors") {
  std::mt19937_64 rng(2);
  auto fixed = PromptLengthSampler::FromSpec("fixed:64");
  REQUIRE(fixed.ok());
  CHECK(fixed->Sample(rng, 1000) == 64);
  CHECK(fixed->Sample(rng, 10) == 10);
  CHECK_FALSE(PromptLengthSampler::FromSpec("fixed:-3").ok());
  CHECK(absl::IsNotFound(PromptLengthSampler::FromSpec("/no/such/file").status()));

  const std::string path = "workload_test_lengths.txt";
  std::ofstream(path) << "# lengths\n12\n\n30\nabc\n";
  auto bad = PromptLengthSampler::FromSpec(path);
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find(":5:") != std::string::npos);
  std::ofstream(path) << "12\n30\n";
  auto good = PromptLengthSampler::FromSpec(path);
  REQUIRE(good.ok());
  const int64_t length = good->Sample(rng, 100);
  CHECK((length == 12 || length == 30));
  std::remove(path.c_str());
}

TEST_CASE("Poisson arrivals have the requested rate") {
  std::mt19937_64 rng(3);
  const auto arrivals = PoissonArrivals(50.0, 5000, rng);
  REQUIRE(arrivals.size() == 5000);
  CHECK(std::is_sorted(arrivals.begin(), arrivals.end()));
  CHECK(arrivals.back() / 5000 == Approx(1.0 / 50).epsilon(0.05));
  const auto burst = PoissonArrivals(0, 4, rng);
  CHECK(burst == std::vector<double>(4, 0.0));
}

TEST_CASE("Summarize gives nearest-rank percentiles") {
  std::vector<double> xs;
  for (int i = 1; i <= 100; ++i) xs.push_back(i);
  const LatencySummary s = Summarize(xs);
  CHECK(s.mean == Approx(50.5));
  CHECK(s.p50 == 50);
  CHECK(s.p90 == 90);
  CHECK(s.p99 == 99);
  CHECK(Summarize({}).p99 == 0);
}

}  // namespace
}  // namespace tophat
