#include "device_agent/prompt_chunk_planner.h"

#include <catch2/catch.hpp>

#include <numeric>

namespace tophat {
namespace {

// Timings of each stage from known costs, at the chunk lengths and contexts a prompt of
// `prompt` in chunks of `chunk` would give.
void ObservePrompt(PromptChunkPlanner& planner, const ChunkCost& input, const ChunkCost& output,
                   const ChunkCost& cloud, int64_t prompt, int64_t chunk) {
  for (int64_t start = 0; start < prompt; start += chunk) {
    const int64_t n = std::min(chunk, prompt - start);
    planner.ObserveDeviceInput(n, start, input.Seconds(n, start));
    planner.ObserveDeviceOutput(n, start, output.Seconds(n, start));
    planner.ObserveCloud(n, start, cloud.Seconds(n, start));
  }
}

const ChunkCost kInput{.fixed_s = 0.002, .per_position_s = 0.0002, .per_pair_s = 2e-8};
const ChunkCost kOutput{.fixed_s = 0.001, .per_position_s = 0.0001, .per_pair_s = 1e-8};
// A cloud whose attention grows past the uplink's pace late in a long prompt.
const ChunkCost kCloud{.fixed_s = 0.001, .per_position_s = 0.00005, .per_pair_s = 1e-7};
const PromptChunkPlanner::LinkRates kLinks{.uplink_seconds_per_position = 0.0002,
                                           .downlink_seconds_per_position = 0.0002};

TEST_CASE("No chunk plan before every stage is timed and the uplink is measured",
          "[chunk_plan]") {
  PromptChunkPlanner planner;
  CHECK_FALSE(planner.Plan(0, 1024, kLinks).has_value());
  // One prompt in equal chunks: the last chunk is shorter, so three distinct timings.
  ObservePrompt(planner, kInput, kOutput, kCloud, 300, 128);
  CHECK(planner.Plan(0, 1024, kLinks).has_value());
  CHECK_FALSE(planner.Plan(0, 1024, {.uplink_seconds_per_position = 0,
                                     .downlink_seconds_per_position = 0.0002})
                  .has_value());
  // The downlink unmeasured: planned without it.
  const auto no_downlink = planner.Stages(0, {.uplink_seconds_per_position = 0.0004});
  REQUIRE(no_downlink.has_value());
  CHECK(no_downlink->size() == 3);
  CHECK_FALSE(planner.Plan(1024, 1024, kLinks).has_value());  // nothing left to send

  PromptChunkPlanner cloud_untimed;
  for (int64_t n : {16, 32, 48}) {
    cloud_untimed.ObserveDeviceInput(n, 0, kInput.Seconds(n, 0));
    cloud_untimed.ObserveDeviceOutput(n, 0, kOutput.Seconds(n, 0));
  }
  CHECK_FALSE(cloud_untimed.Plan(0, 1024, kLinks).has_value());
}

TEST_CASE("The stages are fitted from the timings: the device's two submodels as one stage",
          "[chunk_plan]") {
  PromptChunkPlanner planner;
  ObservePrompt(planner, kInput, kOutput, kCloud, 2000, 96);
  ObservePrompt(planner, kInput, kOutput, kCloud, 700, 160);
  const auto stages = planner.Stages(0, kLinks);
  REQUIRE(stages.has_value());
  REQUIRE(stages->size() == 4);
  const ChunkCost& device = (*stages)[0];
  CHECK(device.fixed_s == Approx(0.003).epsilon(1e-6));
  CHECK(device.per_position_s == Approx(0.0003).epsilon(1e-6));
  CHECK(device.per_pair_s == Approx(3e-8).epsilon(1e-6));
  CHECK((*stages)[1].per_position_s == kLinks.uplink_seconds_per_position);
  CHECK((*stages)[2].per_pair_s == Approx(kCloud.per_pair_s).epsilon(1e-6));
  CHECK((*stages)[3].per_position_s == kLinks.downlink_seconds_per_position);

  // A later turn of a conversation: every chunk attends over the earlier 1,000 positions too.
  const auto later = planner.Stages(1000, kLinks);
  REQUIRE(later.has_value());
  CHECK((*later)[2].Seconds(64, 0) == Approx(kCloud.Seconds(64, 1000)).epsilon(1e-6));
}

TEST_CASE("A long prompt's plan shortens the later chunks and beats equal ones",
          "[chunk_plan]") {
  PromptChunkPlanner planner;
  ObservePrompt(planner, kInput, kOutput, kCloud, 2000, 96);
  ObservePrompt(planner, kInput, kOutput, kCloud, 700, 160);
  const auto plan = planner.Plan(0, 2048, kLinks);
  REQUIRE(plan.has_value());
  CHECK(std::accumulate(plan->chunks.begin(), plan->chunks.end(), int64_t{0}) == 2048);
  REQUIRE(plan->chunks.size() >= 3);
  CHECK(plan->chunks.front() > plan->chunks.back());
  // By the planner's own model; the gain is small here (1.5%): the attention's total is the
  // same however the prompt is cut, and only the pipeline's fill and drain change.
  CHECK(plan->seconds < plan->equal_chunks_seconds);

  // Under HAT's size from the cloud: no chunk longer, on a finer grain.
  const auto capped = planner.Plan(0, 2048, kLinks, /*max_chunk=*/40);
  REQUIRE(capped.has_value());
  CHECK(std::accumulate(capped->chunks.begin(), capped->chunks.end(), int64_t{0}) == 2048);
  for (const int64_t chunk : capped->chunks) CHECK(chunk <= 40);
  // A ceiling that needs more chunks than the planner plans: no plan (equal chunks).
  CHECK_FALSE(planner.Plan(0, 2048, kLinks, /*max_chunk=*/4).has_value());

  // From a conversation's 1,500th position: the 548 left, no chunk under the floor but the
  // last.
  const auto rest = planner.Plan(1500, 2048, kLinks);
  REQUIRE(rest.has_value());
  CHECK(std::accumulate(rest->chunks.begin(), rest->chunks.end(), int64_t{0}) == 548);
  for (size_t i = 0; i + 1 < rest->chunks.size(); ++i) CHECK(rest->chunks[i] >= 16);
}

TEST_CASE("Old timings leave the window, and timings a fit cannot use are not kept",
          "[chunk_plan]") {
  PromptChunkPlanner planner({.window = 64});
  ObservePrompt(planner, kInput, kOutput, kCloud, 2000, 32);
  // The cloud gets twice as slow (a busier batch); 64 new timings replace the old.
  const ChunkCost slower{.fixed_s = 2 * kCloud.fixed_s,
                         .per_position_s = 2 * kCloud.per_position_s,
                         .per_pair_s = 2 * kCloud.per_pair_s};
  for (int round = 0; round < 2; ++round) {
    for (int64_t start = 0; start < 32 * 32; start += 32) {
      const int64_t n = 16 + round * 16;
      planner.ObserveCloud(n, start, slower.Seconds(n, start));
    }
  }
  planner.ObserveCloud(16, 0, 0.0);   // a step that took no measurable time
  planner.ObserveCloud(0, 0, 0.01);   // no positions
  const auto stages = planner.Stages(0, kLinks);
  REQUIRE(stages.has_value());
  CHECK((*stages)[2].fixed_s == Approx(slower.fixed_s).epsilon(1e-6));
  CHECK((*stages)[2].per_pair_s == Approx(slower.per_pair_s).epsilon(1e-6));
}

}  // namespace
}  // namespace tophat
