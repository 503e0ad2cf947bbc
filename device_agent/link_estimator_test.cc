#include "device_agent/link_estimator.h"

#include <random>

#include <catch2/catch.hpp>

namespace tophat {
namespace {

TEST_CASE("The link estimator separates bandwidth from latency", "[link]") {
  struct Row {
    double bandwidth, latency;
  };
  for (const Row& row : {Row{5e6, 0.010}, Row{20e6, 0.002}, Row{1e9, 0.0001}}) {
    INFO("bandwidth " << row.bandwidth << " latency " << row.latency);
    LinkEstimator link;
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> bytes(1e3, 2e5);
    std::normal_distribution<double> jitter(0, 0.02 * row.latency);
    for (int i = 0; i < 200; ++i) {
      const double b = bytes(rng);
      link.Observe(b, 2 * row.latency + 2 * b / row.bandwidth + jitter(rng));
    }
    CHECK(link.symmetric_bytes_per_second() == Approx(row.bandwidth).epsilon(0.1));
    CHECK(link.one_way_latency_seconds() == Approx(row.latency).epsilon(0.1));
  }
}

TEST_CASE("The link estimator says nothing until sizes differ", "[link]") {
  LinkEstimator link;
  CHECK(link.symmetric_bytes_per_second() == 0);
  for (int i = 0; i < 20; ++i) link.Observe(1000, 0.01);
  CHECK(link.symmetric_bytes_per_second() == 0);  // one size: latency and bandwidth mix
  link.Observe(-5, 0.01);
  link.Observe(1000, -1);
  CHECK(link.samples() == 20);
  // A slow link followed by a fast one: old samples fade.
  LinkEstimator moving(0.9);
  for (int i = 0; i < 100; ++i) moving.Observe(1000.0 * (1 + i % 10), 0.002 + 2 * 1000.0 * (1 + i % 10) / 1e6);
  for (int i = 0; i < 100; ++i) moving.Observe(1000.0 * (1 + i % 10), 0.002 + 2 * 1000.0 * (1 + i % 10) / 1e7);
  CHECK(moving.symmetric_bytes_per_second() == Approx(1e7).epsilon(0.05));
}

}  // namespace
}  // namespace tophat
