#include "scheduler/layer_planner.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <functional>
#include <random>

namespace tophat {
namespace {

PlannerInputs RandomInputs(std::mt19937& rng, size_t devices, size_t layers) {
  std::uniform_real_distribution<double> seconds(0.5, 4.0);
  std::uniform_real_distribution<double> link(0.0, 3.0);
  std::uniform_real_distribution<double> memory(2.0, 8.0);
  PlannerInputs in;
  in.layer_bytes.assign(layers, 1.0);
  for (size_t d = 0; d < devices; ++d) {
    PlannerDevice device{.name = "d" + std::to_string(d), .memory_bytes = memory(rng)};
    const double speed = seconds(rng);  // devices differ by a factor, layers a little
    for (size_t l = 0; l < layers; ++l) device.layer_seconds.push_back(speed * (0.8 + 0.1 * (l % 4)));
    in.devices.push_back(device);
  }
  in.transfer_seconds.assign(devices, std::vector<double>(devices, 0));
  for (size_t a = 0; a < devices; ++a) {
    for (size_t b = 0; b < devices; ++b) {
      if (a != b) in.transfer_seconds[a][b] = link(rng);
    }
  }
  return in;
}

// Calls `visit` with the boundaries of every split of `layers` into `stages` non-empty
// ranges (0, the cuts in increasing order, layers).
void ForEachSplit(int64_t layers, size_t stages,
                  const std::function<void(const std::vector<int64_t>&)>& visit) {
  std::vector<int64_t> boundaries = {0};
  std::function<void(int64_t)> cut = [&](int64_t from) {
    if (boundaries.size() == stages) {
      boundaries.push_back(layers);
      visit(boundaries);
      boundaries.pop_back();
      return;
    }
    for (int64_t c = from; c < layers; ++c) {
      boundaries.push_back(c);
      cut(c + 1);
      boundaries.pop_back();
    }
  };
  if (static_cast<int64_t>(stages) <= layers) cut(1);
}

// Every plan: each ordered choice of distinct devices after device 0, each split of the
// layers into that many non-empty ranges.
double BruteForce(const PlannerInputs& in, PlanObjective objective) {
  const size_t devices = in.devices.size();
  const auto layers = static_cast<int64_t>(in.layer_bytes.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> order = {0};
  std::function<void()> extend = [&] {
    ForEachSplit(layers, order.size(), [&](const std::vector<int64_t>& boundaries) {
      auto cost = EvaluatePlan(in, {.devices = order, .boundaries = boundaries}, objective);
      if (cost.ok()) best = std::min(best, *cost);
    });
    for (size_t d = 1; d < devices; ++d) {
      if (std::find(order.begin(), order.end(), static_cast<int>(d)) != order.end()) continue;
      order.push_back(static_cast<int>(d));
      extend();
      order.pop_back();
    }
  };
  extend();
  return best;
}

TEST_CASE("The layer planner's DPs find the brute-force optimum on small cases", "[scheduler]") {
  std::mt19937 rng(17);
  int feasible = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const size_t devices = 1 + trial % 4;
    const size_t layers = 1 + trial % 7;
    const PlannerInputs in = RandomInputs(rng, devices, layers);
    for (PlanObjective objective : {PlanObjective::kLatency, PlanObjective::kThroughput}) {
      const double want = BruteForce(in, objective);
      auto plan = PlanLayers(in, objective);
      INFO("trial " << trial << " objective " << static_cast<int>(objective));
      if (std::isinf(want)) {
        CHECK(plan.status().code() == absl::StatusCode::kResourceExhausted);
        continue;
      }
      ++feasible;
      REQUIRE(plan.ok());
      CHECK(plan->predicted_seconds == Approx(want));
      // The plan is what it claims: a valid partition whose evaluated cost is its prediction.
      auto evaluated = EvaluatePlan(in, *plan, objective);
      REQUIRE(evaluated.ok());
      CHECK(*evaluated == Approx(plan->predicted_seconds));
    }
  }
  CHECK(feasible > 60);  // most cases fit, so the comparison is not vacuous
}

TEST_CASE("Planning stages in a fixed order finds the best split of all of them",
          "[scheduler]") {
  std::mt19937 rng(29);
  for (int trial = 0; trial < 40; ++trial) {
    const size_t devices = 1 + trial % 3;
    const size_t layers = devices + trial % 5;
    PlannerInputs in = RandomInputs(rng, devices, layers);
    for (auto& device : in.devices) device.memory_bytes = 100;  // fixed order must fit
    for (PlanObjective objective : {PlanObjective::kLatency, PlanObjective::kThroughput}) {
      // Every split of the layers into `devices` non-empty ranges, devices in order.
      double want = std::numeric_limits<double>::infinity();
      std::vector<int> order(devices);
      for (size_t d = 0; d < devices; ++d) order[d] = static_cast<int>(d);
      ForEachSplit(static_cast<int64_t>(layers), devices,
                   [&](const std::vector<int64_t>& boundaries) {
                     auto cost =
                         EvaluatePlan(in, {.devices = order, .boundaries = boundaries}, objective);
                     if (cost.ok()) want = std::min(want, *cost);
                   });
      auto plan = PlanStagesInOrder(in, objective);
      INFO("trial " << trial);
      REQUIRE(plan.ok());
      CHECK(plan->devices == order);
      CHECK(plan->predicted_seconds == Approx(want));
      auto evaluated = EvaluatePlan(in, *plan, objective);
      REQUIRE(evaluated.ok());
      CHECK(*evaluated == Approx(plan->predicted_seconds));
    }
  }
}

TEST_CASE("On a fast and a slow device the planner gives the fast one more layers",
          "[scheduler]") {
  PlannerInputs in;
  in.layer_bytes.assign(12, 1.0);
  in.devices.push_back({.name = "fast", .memory_bytes = 100, .layer_seconds =
                                                                 std::vector<double>(12, 1.0)});
  in.devices.push_back({.name = "slow", .memory_bytes = 100, .layer_seconds =
                                                                 std::vector<double>(12, 3.0)});
  in.transfer_seconds = {{0, 0.5}, {0.5, 0}};
  auto plan = PlanLayers(in, PlanObjective::kThroughput);
  REQUIRE(plan.ok());
  REQUIRE(plan->devices == std::vector<int>{0, 1});
  // 9 layers at 1 s against 3 at 3 s balances the stages at 9 s.
  CHECK(plan->boundaries == std::vector<int64_t>{0, 9, 12});
  CHECK(plan->predicted_seconds == Approx(9.0));
  auto even = EvaluatePlan(in, {.devices = {0, 1}, .boundaries = EvenBoundaries(12, 2)},
                           PlanObjective::kThroughput);
  REQUIRE(even.ok());
  CHECK(*even == Approx(18.0));
  // For one step's latency the fast device alone is best: no transfer, no slow layers.
  auto latency = PlanLayers(in, PlanObjective::kLatency);
  REQUIRE(latency.ok());
  CHECK(latency->devices == std::vector<int>{0});
  CHECK(latency->predicted_seconds == Approx(12.0));
}

TEST_CASE("The layer planner respects memory and reports when nothing fits", "[scheduler]") {
  PlannerInputs in;
  in.layer_bytes.assign(6, 1.0);
  in.devices.push_back({.name = "small", .memory_bytes = 2, .layer_seconds = std::vector<double>(6, 1)});
  in.devices.push_back({.name = "big", .memory_bytes = 4, .layer_seconds = std::vector<double>(6, 2)});
  in.transfer_seconds = {{0, 0.1}, {0.1, 0}};
  auto plan = PlanLayers(in, PlanObjective::kLatency);
  REQUIRE(plan.ok());
  CHECK(plan->boundaries == std::vector<int64_t>{0, 2, 6});
  in.devices[1].memory_bytes = 3;
  auto none = PlanLayers(in, PlanObjective::kLatency);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == absl::StatusCode::kResourceExhausted);
  in.devices[1].layer_seconds.pop_back();
  CHECK(PlanLayers(in, PlanObjective::kLatency).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tophat
