#include "scheduler/chunk_plan.h"

#include <algorithm>
#include <functional>
#include <vector>

#include <catch2/catch.hpp>

namespace tophat {
namespace {

TEST_CASE("A chunk's cost grows with its length and with the context it attends", "[chunk_plan]") {
  const ChunkCost q{.fixed_s = 1, .per_position_s = 0.1, .per_pair_s = 0.01};
  // 4 positions after 10: 1 + 0.4 + 0.01 * 4 * (10 + 2.5).
  CHECK(q.Seconds(4, 10) == Approx(1 + 0.4 + 0.5));
  CHECK(q.Seconds(4, 100) > q.Seconds(4, 10));
}

TEST_CASE("Chunks flow through the stages one at a time per stage", "[chunk_plan]") {
  // Stage 0 takes 1 s a chunk, stage 1 2 s: the second stage is the beat.
  const std::vector<ChunkCost> stages = {{.fixed_s = 1}, {.fixed_s = 2}};
  const std::vector<int64_t> three = {16, 16, 16};
  // Chunk 1 leaves stage 1 at 3, chunk 2 at 5, chunk 3 at 7.
  CHECK(PipelineSeconds(stages, three) == Approx(7));
  const std::vector<int64_t> one = {48};
  CHECK(PipelineSeconds(stages, one) == Approx(3));
}

TEST_CASE("A chunk cost is fitted from timings, and bad timings are named", "[chunk_plan]") {
  const ChunkCost truth{.fixed_s = 0.002, .per_position_s = 1e-4, .per_pair_s = 2e-7};
  std::vector<ChunkSample> samples;
  for (int64_t x : {16, 64, 256}) {
    for (int64_t y : {0, 256, 1024}) samples.push_back({x, y, truth.Seconds(x, y)});
  }
  auto fitted = FitChunkCost(samples);
  REQUIRE(fitted.ok());
  CHECK(fitted->fixed_s == Approx(truth.fixed_s).epsilon(1e-6));
  CHECK(fitted->per_position_s == Approx(truth.per_position_s).epsilon(1e-6));
  CHECK(fitted->per_pair_s == Approx(truth.per_pair_s).epsilon(1e-6));
  // A cost with no attention term: the fit does not invent a negative one.
  const ChunkCost link{.fixed_s = 0.01, .per_position_s = 2e-4};
  std::vector<ChunkSample> link_samples;
  for (int64_t x : {16, 64, 256}) {
    for (int64_t y : {0, 1024}) link_samples.push_back({x, y, link.Seconds(x, y) * 1.001});
  }
  auto link_fit = FitChunkCost(link_samples);
  REQUIRE(link_fit.ok());
  CHECK(link_fit->per_pair_s >= 0);
  CHECK(link_fit->fixed_s >= 0);
  CHECK(link_fit->Seconds(128, 512) == Approx(link.Seconds(128, 512)).epsilon(0.01));

  std::vector<ChunkSample> bad = samples;
  bad[4].seconds = 0;
  auto refused = FitChunkCost(bad);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("chunk timing #4"));
  const std::vector<ChunkSample> two = {{16, 0, 0.1}, {32, 0, 0.2}, {16, 0, 0.1}};
  auto too_few = FitChunkCost(two);
  REQUIRE_FALSE(too_few.ok());
  CHECK_THAT(std::string(too_few.status().message()), Catch::Contains("at least 3"));
}

// Every way to cut `prompt` into chunks ending at multiples of `unit` (or the prompt's end),
// none shorter than `floor` unless it is the whole prompt.
void ForEachSplit(int64_t prompt, int64_t unit, int64_t floor,
                  const std::function<void(const std::vector<int64_t>&)>& visit) {
  std::vector<int64_t> chunks;
  std::function<void(int64_t)> extend = [&](int64_t at) {
    if (at == prompt) {
      visit(chunks);
      return;
    }
    for (int64_t end = (at / unit + 1) * unit;; end += unit) {
      end = std::min(end, prompt);
      const int64_t length = end - at;
      if (length >= floor || (at == 0 && end == prompt)) {
        chunks.push_back(length);
        extend(end);
        chunks.pop_back();
      }
      if (end == prompt) break;
    }
  };
  extend(0);
}

double Beat(const std::vector<ChunkCost>& stages, const std::vector<int64_t>& chunks) {
  double beat = 0;
  int64_t context = 0;
  for (int64_t x : chunks) {
    for (const ChunkCost& s : stages) beat = std::max(beat, s.Seconds(x, context));
    context += x;
  }
  return beat;
}

TEST_CASE("The plan's slowest chunk is the best any split into as many chunks has, by brute "
          "force",
          "[chunk_plan]") {
  // Device input, uplink, two cloud stages, downlink, device output: the cloud's and the
  // devices' layers attend, the links do not.
  const std::vector<ChunkCost> pipeline = {
      {.fixed_s = 0.001, .per_position_s = 4e-4, .per_pair_s = 4e-7},
      {.fixed_s = 0.010, .per_position_s = 6e-4},
      {.fixed_s = 0.004, .per_position_s = 5e-5, .per_pair_s = 2e-6},
      {.fixed_s = 0.004, .per_position_s = 5e-5, .per_pair_s = 2e-6},
      {.fixed_s = 0.010, .per_position_s = 3e-4},
      {.fixed_s = 0.001, .per_position_s = 2e-4, .per_pair_s = 4e-7}};
  for (int64_t prompt : {40, 100, 161, 256}) {
    for (int64_t floor : {16, 32}) {
      INFO("prompt " << prompt << ", floor " << floor);
      auto dp = PlanChunks(prompt, pipeline,
                           {.granularity = 16, .min_chunk = floor, .refine = false});
      auto plan = PlanChunks(prompt, pipeline, {.granularity = 16, .min_chunk = floor});
      REQUIRE(dp.ok());
      REQUIRE(plan.ok());
      for (const ChunkPlan* p : {&*dp, &*plan}) {
        int64_t sum = 0;
        for (int64_t x : p->chunks) {
          sum += x;
          if (p->chunks.size() > 1) CHECK(x >= floor);
        }
        CHECK(sum == prompt);
        CHECK(p->seconds == Approx(PipelineSeconds(pipeline, p->chunks)));
        CHECK(p->slowest_stage_s == Approx(Beat(pipeline, p->chunks)));
      }
      // Of all splits into as many chunks as the DP's, none has a faster slowest chunk. Over
      // all splits, the refined plan's latency is within 5% of the fastest (3.1% at most in
      // these cases), and never above the DP's.
      double best_beat = 1e9;
      double best_seconds = 1e9;
      ForEachSplit(prompt, 16, floor, [&](const std::vector<int64_t>& chunks) {
        if (chunks.size() == dp->chunks.size()) {
          best_beat = std::min(best_beat, Beat(pipeline, chunks));
        }
        best_seconds = std::min(best_seconds, PipelineSeconds(pipeline, chunks));
      });
      CHECK(dp->slowest_stage_s == Approx(best_beat).epsilon(1e-9));
      CHECK(plan->seconds <= dp->seconds + 1e-12);
      CHECK(plan->seconds <= 1.05 * best_seconds);
    }
  }
}

TEST_CASE("Where attention dominates, the DP makes later chunks shorter, and the plan is never "
          "slower than equal chunks",
          "[chunk_plan]") {
  // A cloud stage whose cost is mostly attention over the context: for the slowest chunk to
  // be as fast as it can, the later chunks, which attend more, take fewer positions.
  const std::vector<ChunkCost> attention = {{.fixed_s = 0.002, .per_position_s = 5e-5},
                                            {.fixed_s = 0.010, .per_pair_s = 1e-6}};
  auto dp = PlanChunks(2048, attention,
                       {.granularity = 16, .min_chunk = 16, .max_chunks = 8, .refine = false});
  REQUIRE(dp.ok());
  INFO("DP chunks: " << dp->chunks.size() << ", first " << dp->chunks.front() << ", last "
                     << dp->chunks.back());
  REQUIRE(dp->chunks.size() > 2);
  CHECK(dp->chunks.front() > 2 * dp->chunks.back());
  for (size_t i = 1; i < dp->chunks.size(); ++i) {
    CHECK(dp->chunks[i] <= dp->chunks[i - 1] + 16);  // no later chunk markedly longer
  }
  // The refined plan against HAT's equal chunks of the same count, and the DP's own split.
  for (const auto& pipeline :
       {attention, std::vector<ChunkCost>{{.fixed_s = 0.005, .per_position_s = 1e-3},
                                          {.fixed_s = 0.005, .per_pair_s = 1e-6}}}) {
    auto plan = PlanChunks(2048, pipeline, {.granularity = 16, .min_chunk = 16});
    auto unrefined = PlanChunks(2048, pipeline, {.granularity = 16, .min_chunk = 16,
                                                 .refine = false});
    REQUIRE(plan.ok());
    REQUIRE(unrefined.ok());
    CHECK(plan->seconds <= plan->equal_chunks_seconds);
    CHECK(plan->seconds <= unrefined->seconds);
  }
  CHECK_FALSE(PlanChunks(0, attention).ok());
  CHECK_FALSE(PlanChunks(100, std::span<const ChunkCost>()).ok());
}

TEST_CASE("A ceiling bounds every chunk of a plan", "[chunk_plan]") {
  const std::vector<ChunkCost> attention = {{.fixed_s = 0.002, .per_position_s = 5e-5},
                                            {.fixed_s = 0.001, .per_pair_s = 1e-6}};
  // Unbounded, the plan takes long chunks; under a ceiling of 64 none is longer.
  auto free = PlanChunks(2048, attention, {.granularity = 16, .min_chunk = 16});
  REQUIRE(free.ok());
  CHECK(*std::max_element(free->chunks.begin(), free->chunks.end()) > 64);
  auto bounded = PlanChunks(2048, attention, {.granularity = 8, .min_chunk = 16,
                                              .max_chunks = 96, .max_chunk = 64});
  REQUIRE(bounded.ok());
  int64_t total = 0;
  for (const int64_t chunk : bounded->chunks) {
    CHECK(chunk <= 64);
    total += chunk;
  }
  CHECK(total == 2048);
  CHECK(bounded->seconds <= bounded->equal_chunks_seconds);
  // The DP's own split (unrefined) under the ceiling keeps it too. (Where the cloud's
  // attention is the bottleneck throughout, as here, the fastest plan is as few chunks as the
  // ceiling allows: the attention's total is the same however the prompt is cut.)
  auto dp = PlanChunks(2048, attention, {.granularity = 8, .min_chunk = 16, .max_chunks = 96,
                                         .max_chunk = 64, .refine = false});
  REQUIRE(dp.ok());
  CHECK(*std::max_element(dp->chunks.begin(), dp->chunks.end()) <= 64);
  // A ceiling no split into max_chunks can meet is an error, named.
  auto impossible = PlanChunks(2048, attention, {.granularity = 16, .min_chunk = 16,
                                                 .max_chunks = 8, .max_chunk = 64});
  REQUIRE_FALSE(impossible.ok());
  CHECK_THAT(std::string(impossible.status().message()), Catch::Contains("at most 8 chunks"));
}

}  // namespace
}  // namespace tophat
