// The cloud's state monitor (HAT section 3.2, DESIGN.md "State monitor"): moving averages,
// with weight α = 0.8 on the past, of
//   - μ, the tokens batched per engine step, and g(μ), the step time as a function of them
//     (StepTimePredictor);
//   - with the middle split into P pipeline stages, g_s(μ) for each stage s: its own forward
//     time, so the scheduler sees the slowest stage (the pipeline's beat) rather than g / P;
//   - per device: γ_i, its draft delay per step, and β_i,up / β_i,down, its link bandwidths,
//     as the agent measured them from real transfers and reported in DeviceState.
// Pure bookkeeping: the engine thread calls it; no clock, no I/O, not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "scheduler/moving_average.h"
#include "scheduler/step_time_predictor.h"

namespace tophat {

// One DeviceState report; a value <= 0 (or not finite) means "not measured yet" and leaves
// the average as it was.
struct DeviceReport {
  double uplink_bytes_per_second = 0;
  double downlink_bytes_per_second = 0;
  double draft_step_seconds = 0;
  double draft_tokens_per_round = 0;  // μ_i of equation 6
};

// The smoothed view of one device; a field is 0 until its first measurement.
struct DeviceEstimate {
  double uplink_bytes_per_second = 0;
  double downlink_bytes_per_second = 0;
  double draft_step_seconds = 0;
  double draft_tokens_per_round = 0;
};

class StateMonitor {
 public:
  // `pipeline_stages` > 1 keeps a step-time model per stage.
  explicit StateMonitor(int64_t max_batch_tokens = 8192, double alpha = 0.8,
                        int pipeline_stages = 1);

  void ObserveStep(int64_t batched_tokens, double seconds);
  // Stage `stage`'s own forward seconds for a step of `batched_tokens` (ignored without a
  // pipeline or for a stage out of range).
  void ObserveStageStep(int stage, int64_t batched_tokens, double seconds);
  void ObserveDevice(uint64_t device, const DeviceReport& report);
  void ForgetDevice(uint64_t device);

  double mean_batched_tokens() const { return mean_tokens_.value(); }  // μ (0 before any step)
  const StepTimePredictor& step_time() const { return step_time_; }
  // g_s of each pipeline stage; empty without a pipeline.
  std::span<const StepTimePredictor> stage_step_times() const { return stage_step_times_; }
  std::optional<DeviceEstimate> device(uint64_t device) const;

 private:
  struct DeviceAverages {
    explicit DeviceAverages(double alpha)
        : uplink(alpha), downlink(alpha), draft_step(alpha), round_length(alpha) {}
    MovingAverage uplink, downlink, draft_step, round_length;
  };
  double alpha_;
  MovingAverage mean_tokens_;
  StepTimePredictor step_time_;
  std::vector<StepTimePredictor> stage_step_times_;
  std::unordered_map<uint64_t, DeviceAverages> devices_;
};

}  // namespace tophat
