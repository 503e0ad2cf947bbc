#include "scheduler/batch_planner.h"

#include <catch2/catch.hpp>

namespace tophat {
namespace {

std::vector<PlannedWork> Plan(std::vector<PendingWork> pending, BatchLimits limits) {
  std::vector<PlannedWork> plan;
  PlanBatch(pending, limits, plan);
  return plan;
}

TEST_CASE("PlanBatch puts decode work first and fills the rest with prefill") {
  // Arrival order: prefill 300, decode 1, prefill 400, decode 4.
  auto plan = Plan({{300, false}, {1, true}, {400, false}, {4, true}},
                   {.max_batch_tokens = 512, .max_sequences = 8});
  REQUIRE(plan.size() == 4);
  CHECK(plan[0].index == 1);
  CHECK(plan[0].num_tokens == 1);
  CHECK(plan[1].index == 3);
  CHECK(plan[1].num_tokens == 4);
  CHECK(plan[2].index == 0);
  CHECK(plan[2].num_tokens == 300);
  CHECK(plan[3].index == 2);
  CHECK(plan[3].num_tokens == 512 - 5 - 300);  // the second prefill is cut to the budget
}

TEST_CASE("PlanBatch never splits decode work and never returns an empty step") {
  auto plan = Plan({{600, true}, {8, true}}, {.max_batch_tokens = 512, .max_sequences = 8});
  REQUIRE(plan.size() == 1);  // the oversize verification runs alone; the next one waits
  CHECK(plan[0].index == 0);
  CHECK(plan[0].num_tokens == 600);

  plan = Plan({{8, true}, {600, true}, {16, true}}, {.max_batch_tokens = 512, .max_sequences = 8});
  REQUIRE(plan.size() == 2);
  CHECK(plan[0].index == 0);
  CHECK(plan[1].index == 2);

  plan = Plan({{2000, false}}, {.max_batch_tokens = 512, .max_sequences = 8});
  REQUIRE(plan.size() == 1);
  CHECK(plan[0].num_tokens == 512);
}

TEST_CASE("PlanBatch honours the sequence limit and skips empty work") {
  auto plan = Plan({{1, true}, {0, true}, {1, true}, {1, true}, {10, false}},
                   {.max_batch_tokens = 512, .max_sequences = 2});
  REQUIRE(plan.size() == 2);
  CHECK(plan[0].index == 0);
  CHECK(plan[1].index == 2);
  CHECK(Plan({}, {}).empty());
}

}  // namespace
}  // namespace tophat
