#include "scheduler/state_monitor.h"

#include <cmath>

namespace tophat {
namespace {

// Non-positive (or non-finite) samples are "not measured": they leave the average alone.
void AddMeasured(MovingAverage& average, double sample) {
  if (sample > 0 && std::isfinite(sample)) average.Add(sample);
}

}  // namespace

StateMonitor::StateMonitor(int64_t max_batch_tokens, double alpha, int pipeline_stages)
    : alpha_(alpha), mean_tokens_(alpha), step_time_(max_batch_tokens, alpha) {
  if (pipeline_stages > 1) {
    stage_step_times_.assign(static_cast<size_t>(pipeline_stages),
                             StepTimePredictor(max_batch_tokens, alpha));
  }
}

void StateMonitor::ObserveStep(int64_t batched_tokens, double seconds) {
  if (batched_tokens < 1) return;
  mean_tokens_.Add(static_cast<double>(batched_tokens));
  step_time_.Observe(batched_tokens, seconds);
}

void StateMonitor::ObserveStageStep(int stage, int64_t batched_tokens, double seconds) {
  if (stage < 0 || static_cast<size_t>(stage) >= stage_step_times_.size()) return;
  stage_step_times_[static_cast<size_t>(stage)].Observe(batched_tokens, seconds);
}

void StateMonitor::ObserveDevice(uint64_t device, const DeviceReport& report) {
  DeviceAverages& averages = devices_.try_emplace(device, alpha_).first->second;
  AddMeasured(averages.uplink, report.uplink_bytes_per_second);
  AddMeasured(averages.downlink, report.downlink_bytes_per_second);
  AddMeasured(averages.draft_step, report.draft_step_seconds);
  AddMeasured(averages.round_length, report.draft_tokens_per_round);
}

void StateMonitor::ForgetDevice(uint64_t device) { devices_.erase(device); }

std::optional<DeviceEstimate> StateMonitor::device(uint64_t device) const {
  auto it = devices_.find(device);
  if (it == devices_.end()) return std::nullopt;
  const DeviceAverages& a = it->second;
  return DeviceEstimate{.uplink_bytes_per_second = a.uplink.value(),
                        .downlink_bytes_per_second = a.downlink.value(),
                        .draft_step_seconds = a.draft_step.value(),
                        .draft_tokens_per_round = a.round_length.value()};
}

}  // namespace tophat
