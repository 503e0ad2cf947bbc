#include "scheduler/state_monitor.h"

#include <cmath>

namespace tophat {
namespace {

// A moving average that takes its first sample as is; non-positive samples are "unknown".
void Smooth(double& average, double sample, double alpha) {
  if (!(sample > 0) || !std::isfinite(sample)) return;
  average = average > 0 ? alpha * average + (1 - alpha) * sample : sample;
}

}  // namespace

StateMonitor::StateMonitor(int64_t max_batch_tokens, double alpha)
    : alpha_(alpha), step_time_(max_batch_tokens, alpha) {}

void StateMonitor::ObserveStep(int64_t batched_tokens, double seconds) {
  if (batched_tokens < 1) return;
  mean_tokens_ = seen_step_ ? alpha_ * mean_tokens_ + (1 - alpha_) * static_cast<double>(batched_tokens)
                            : static_cast<double>(batched_tokens);
  seen_step_ = true;
  step_time_.Observe(batched_tokens, seconds);
}

void StateMonitor::ObserveDevice(uint64_t device, const DeviceReport& report) {
  DeviceEstimate& estimate = devices_[device];
  Smooth(estimate.uplink_bytes_per_second, report.uplink_bytes_per_second, alpha_);
  Smooth(estimate.downlink_bytes_per_second, report.downlink_bytes_per_second, alpha_);
  Smooth(estimate.draft_step_seconds, report.draft_step_seconds, alpha_);
  Smooth(estimate.draft_tokens_per_round, report.draft_tokens_per_round, alpha_);
}

void StateMonitor::ForgetDevice(uint64_t device) { devices_.erase(device); }

std::optional<DeviceEstimate> StateMonitor::device(uint64_t device) const {
  auto it = devices_.find(device);
  if (it == devices_.end()) return std::nullopt;
  return it->second;
}

}  // namespace tophat
