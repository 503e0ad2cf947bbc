#include "scheduler/batch_planner.h"

#include <catch2/catch.hpp>

#include "scheduler/step_time_predictor.h"

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

// Tokens planned per group.
std::vector<int64_t> PerGroup(const std::vector<PendingWork>& pending,
                              const std::vector<PlannedWork>& plan, size_t groups) {
  std::vector<int64_t> tokens(groups, 0);
  for (const PlannedWork& planned : plan) tokens[pending[planned.index].group] += planned.num_tokens;
  return tokens;
}

TEST_CASE("Devices with prompts waiting share the step's budget by weight") {
  BatchPlanner planner;
  std::vector<PlannedWork> plan;
  // Device 0 floods (four chunks of 256); device 1 has one 300-token prompt.
  std::vector<PendingWork> pending = {
      {256, false, 0}, {256, false, 0}, {300, false, 1}, {256, false, 0}, {256, false, 0}};
  std::vector<GroupShare> equal = {{1, false}, {1, false}};
  CHECK(planner.Plan(pending, {.max_batch_tokens = 512}, equal, 0, plan) == 512);
  CHECK(PerGroup(pending, plan, 2) == std::vector<int64_t>{256, 256});
  // First come first served within a device: its oldest chunk whole, not a bit of each.
  REQUIRE(plan.size() == 2);
  CHECK(plan[0].index == 0);
  CHECK(plan[1].index == 2);

  std::vector<GroupShare> weighted = {{1, false}, {3, false}};
  planner.Plan(pending, {.max_batch_tokens = 512}, weighted, 0, plan);
  CHECK(PerGroup(pending, plan, 2) == std::vector<int64_t>{212, 300});  // 384 > its 300

  pending[2].num_tokens = 100;  // less than its share: it gets all of it, the other the rest
  planner.Plan(pending, {.max_batch_tokens = 512}, equal, 0, plan);
  CHECK(PerGroup(pending, plan, 2) == std::vector<int64_t>{412, 100});
}

TEST_CASE("Decode work runs whole and first and the rest of the budget is shared") {
  BatchPlanner planner;
  std::vector<PlannedWork> plan;
  std::vector<PendingWork> pending = {{1000, false, 0}, {4, true, 1}, {1000, false, 1}};
  CHECK(planner.Plan(pending, {.max_batch_tokens = 100}, {}, 0, plan) == 100);
  REQUIRE(plan.size() == 3);
  CHECK(plan[0].index == 1);
  CHECK(PerGroup(pending, plan, 2) == std::vector<int64_t>{48, 52});
}

TEST_CASE("Tokens that do not divide evenly rotate between devices across steps") {
  BatchPlanner planner;
  std::vector<PlannedWork> plan;
  std::vector<PendingWork> pending = {{100, false, 0}, {100, false, 1}, {100, false, 2}};
  std::vector<int64_t> total(3, 0);
  for (uint64_t step = 0; step < 3; ++step) {
    CHECK(planner.Plan(pending, {.max_batch_tokens = 8}, {}, step, plan) == 8);
    std::vector<int64_t> got = PerGroup(pending, plan, 3);
    for (size_t g = 0; g < 3; ++g) {
      CHECK(got[g] >= 2);
      CHECK(got[g] <= 3);
      total[g] += got[g];
    }
  }
  CHECK(total == std::vector<int64_t>{8, 8, 8});
}

TEST_CASE("Capped devices fill the step up to its cap and the others take the rest of it") {
  BatchPlanner planner;
  std::vector<PlannedWork> plan;
  std::vector<PendingWork> pending = {
      {1, true, 2}, {256, false, 0}, {256, false, 1}, {256, false, 0}, {40, false, 2}};
  std::vector<GroupShare> groups = {{1, true}, {1, true}, {1, false}};
  // A cap of 10 tokens a step: the decode token in it and 9 of the capped prompts.
  CHECK(planner.Plan(pending, {.max_batch_tokens = 512, .capped_step_tokens = 10}, groups, 0,
                     plan) == 1 + 9 + 40);
  std::vector<int64_t> got = PerGroup(pending, plan, 3);
  CHECK(got[0] + got[1] == 9);
  CHECK(got[0] >= 4);
  CHECK(got[1] >= 4);
  CHECK(got[2] == 41);
  // With the decoding session's token away (not in this step), its room goes to the
  // capped prompts: the cap is on the step, not on the sessions that decode.
  pending[0].num_tokens = 0;
  CHECK(planner.Plan(pending, {.max_batch_tokens = 512, .capped_step_tokens = 10}, groups, 0,
                     plan) == 10 + 40);
  got = PerGroup(pending, plan, 3);
  CHECK(got[0] + got[1] == 10);
  // A capped device alone still moves, a token at a time at the least, even behind decode
  // work that fills the cap.
  pending = {{256, false, 0}};
  CHECK(planner.Plan(pending, {.max_batch_tokens = 512, .capped_step_tokens = 0}, groups, 0,
                     plan) == 1);
  pending = {{12, true, 2}, {256, false, 0}};
  CHECK(planner.Plan(pending, {.max_batch_tokens = 512, .capped_step_tokens = 10}, groups, 0,
                     plan) == 12 + 1);
}

TEST_CASE("While devices decode, others' prompts may stretch their rounds so far") {
  StepTimePredictor step_time(1024, 0.0);
  // Nothing measured yet: no cap.
  CHECK_FALSE(DecodeStretchStepTokens(step_time, 1, 2.0, 0, 512).has_value());
  for (int64_t tokens = 1; tokens <= 512; tokens *= 2) {
    step_time.Observe(tokens, 1.0 + 0.1 * static_cast<double>(tokens));  // g = 1 s + 0.1 s/token
  }
  // One decoding: its step 1.1 s, and twice that holds 12 tokens.
  CHECK(DecodeStretchStepTokens(step_time, 1, 2.0, 0, 512) == 12);
  // Eight decoding: 1.8 s, and twice that holds 26 tokens.
  CHECK(DecodeStretchStepTokens(step_time, 8, 2.0, 0, 512) == 26);
  // A stretch of 1: a step no longer than the decode work's.
  CHECK(DecodeStretchStepTokens(step_time, 8, 1.0, 0, 512) == 8);
  // A round that spends 10.02 s away from the cloud (links, device) may see steps of
  // (10.02 s + 2 x 1.1 s) / 2 = 6.11 s: 51 tokens; a round away 1 s keeps the rule above
  // (1.6 s < 2.2 s).
  CHECK(DecodeStretchStepTokens(step_time, 1, 2.0, 10.02, 512) == 51);
  CHECK(DecodeStretchStepTokens(step_time, 1, 2.0, 1.0, 512) == 12);
  // With a stretch of 1 nothing may grow, however long the round.
  CHECK(DecodeStretchStepTokens(step_time, 8, 1.0, 10.0, 512) == 8);
  // The whole budget fits.
  CHECK(DecodeStretchStepTokens(step_time, 8, 100.0, 0, 64) == 64);
  // No cap: stretch 0 (off) or nobody decoding.
  CHECK_FALSE(DecodeStretchStepTokens(step_time, 1, 0.0, 0, 512).has_value());
  CHECK_FALSE(DecodeStretchStepTokens(step_time, 0, 2.0, 0, 512).has_value());
}

}  // namespace
}  // namespace tophat

namespace tophat {
namespace {

std::vector<int32_t> OrderOf(RoundRobinOrder& order, std::vector<int32_t> groups,
                             int32_t num_groups) {
  const std::span<const int32_t> out = order.Order(groups, num_groups);
  return {out.begin(), out.end()};
}

TEST_CASE("Round-robin order: each group's oldest item before any group's second") {
  RoundRobinOrder order;
  // Items in arrival order, by group: A A A B C B.
  // Ranks (how many of its group's came before): 0 1 2 0 0 1.
  // Rank 0 by arrival: items 0 (A), 3 (B), 4 (C); rank 1: 1 (A), 5 (B); rank 2: 2 (A).
  CHECK(OrderOf(order, {0, 0, 0, 1, 2, 1}, 3) == std::vector<int32_t>{0, 3, 4, 1, 5, 2});
  // One item a group: arrival order stands.
  CHECK(OrderOf(order, {2, 0, 1}, 3) == std::vector<int32_t>{0, 1, 2});
  // One group: first come, first served.
  CHECK(OrderOf(order, {1, 1, 1, 1}, 2) == std::vector<int32_t>{0, 1, 2, 3});
  CHECK(OrderOf(order, {}, 4).empty());
  // Scratch from a longer call does not leak into a shorter one: B B A, ranks 0 1 0.
  CHECK(OrderOf(order, {1, 1, 0}, 2) == std::vector<int32_t>{0, 2, 1});
}

TEST_CASE("Round-robin order keeps arrival order within a rank however many items") {
  RoundRobinOrder order;
  // 200 items over 7 groups, group i % 7: item i has rank i / 7, so the order is arrival.
  std::vector<int32_t> groups;
  for (int32_t i = 0; i < 200; ++i) groups.push_back(i % 7);
  std::vector<int32_t> expected(200);
  for (int32_t i = 0; i < 200; ++i) expected[i] = i;
  CHECK(OrderOf(order, groups, 7) == expected);
  // Reversed groups in blocks: the first 100 items group 0, the next 100 group 1. Rank r
  // holds items r and 100 + r, in that order.
  for (int32_t i = 0; i < 200; ++i) groups[i] = i < 100 ? 0 : 1;
  std::vector<int32_t> interleaved;
  for (int32_t r = 0; r < 100; ++r) {
    interleaved.push_back(r);
    interleaved.push_back(100 + r);
  }
  CHECK(OrderOf(order, groups, 2) == interleaved);
}

}  // namespace
}  // namespace tophat
