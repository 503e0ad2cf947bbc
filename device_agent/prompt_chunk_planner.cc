#include "device_agent/prompt_chunk_planner.h"

#include <algorithm>
#include <cmath>

namespace tophat {
namespace {

constexpr int64_t kMaxPlannedChunks = 256;

// q(x, y + first) as a cost of x after y: the context every chunk of this prompt starts with
// adds per_pair·first to each position's cost.
ChunkCost After(const ChunkCost& cost, int64_t first) {
  return {.fixed_s = cost.fixed_s,
          .per_position_s = cost.per_position_s + cost.per_pair_s * static_cast<double>(first),
          .per_pair_s = cost.per_pair_s};
}

std::optional<ChunkCost> Fit(const std::deque<ChunkSample>& samples) {
  const std::vector<ChunkSample> copied(samples.begin(), samples.end());
  absl::StatusOr<ChunkCost> fitted = FitChunkCost(copied);
  if (!fitted.ok()) return std::nullopt;
  return *fitted;
}

}  // namespace

void PromptChunkPlanner::Add(std::deque<ChunkSample>& samples, int64_t positions,
                             int64_t context, double seconds) {
  // A timing FitChunkCost would refuse (a clock that did not move) is not kept.
  if (positions <= 0 || context < 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  samples.push_back({.positions = positions, .context = context, .seconds = seconds});
  while (samples.size() > options_.window) samples.pop_front();
}

void PromptChunkPlanner::ObserveDeviceInput(int64_t positions, int64_t context,
                                            double seconds) {
  Add(device_input_, positions, context, seconds);
}
void PromptChunkPlanner::ObserveDeviceOutput(int64_t positions, int64_t context,
                                             double seconds) {
  Add(device_output_, positions, context, seconds);
}
void PromptChunkPlanner::ObserveCloud(int64_t positions, int64_t context, double seconds) {
  Add(cloud_, positions, context, seconds);
}

std::optional<std::vector<ChunkCost>> PromptChunkPlanner::Stages(int64_t first,
                                                                 const LinkRates& links) const {
  if (!(links.uplink_seconds_per_position > 0)) return std::nullopt;
  std::optional<ChunkCost> input, output, cloud;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    input = Fit(device_input_);
    output = Fit(device_output_);
    cloud = Fit(cloud_);
  }
  if (!input || !output || !cloud) return std::nullopt;
  const ChunkCost device{.fixed_s = input->fixed_s + output->fixed_s,
                         .per_position_s = input->per_position_s + output->per_position_s,
                         .per_pair_s = input->per_pair_s + output->per_pair_s};
  std::vector<ChunkCost> stages = {After(device, first),
                                   {.per_position_s = links.uplink_seconds_per_position},
                                   After(*cloud, first)};
  if (links.downlink_seconds_per_position > 0) {
    stages.push_back({.per_position_s = links.downlink_seconds_per_position});
  }
  return stages;
}

std::optional<ChunkPlan> PromptChunkPlanner::Plan(int64_t first, int64_t prompt,
                                                  const LinkRates& links,
                                                  int64_t max_chunk) const {
  if (prompt <= first) return std::nullopt;
  const std::optional<std::vector<ChunkCost>> stages = Stages(first, links);
  if (!stages) return std::nullopt;
  ChunkPlanOptions options = options_.plan;
  const int64_t positions = prompt - first;
  if (max_chunk > 0) {
    options.max_chunk = max_chunk;
    options.granularity = std::clamp<int64_t>(max_chunk / 4, 1, options.granularity);
    options.min_chunk = std::min(options.min_chunk, std::max<int64_t>(1, max_chunk / 2));
    // Room to make chunks shorter than the ceiling: twice as many as it needs, within reason
    // (the DP's cost grows with the chunks tried times the grain's positions).
    const int64_t needed = (positions + max_chunk - 1) / max_chunk;
    options.max_chunks = std::min<int64_t>(kMaxPlannedChunks, std::max(options.max_chunks,
                                                                         2 * needed));
    if (needed > options.max_chunks) return std::nullopt;  // equal chunks: too many to plan
  }
  absl::StatusOr<ChunkPlan> plan = PlanChunks(positions, *stages, options);
  if (!plan.ok()) return std::nullopt;
  return *std::move(plan);
}

}  // namespace tophat
