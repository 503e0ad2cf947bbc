#include "device_agent/link_estimator.h"

#include <algorithm>
#include <cmath>

namespace tophat {

LinkEstimator::LinkEstimator(double forgetting) : forgetting_(std::clamp(forgetting, 1e-3, 1.0)) {}

void LinkEstimator::Observe(double bytes_each_way, double network_seconds) {
  if (!(bytes_each_way > 0) || !(network_seconds > 0) || !std::isfinite(bytes_each_way) ||
      !std::isfinite(network_seconds)) {
    return;
  }
  const double x = 2 * bytes_each_way;  // up and down
  weight_ = forgetting_ * weight_ + 1;
  sum_x_ = forgetting_ * sum_x_ + x;
  sum_y_ = forgetting_ * sum_y_ + network_seconds;
  sum_xx_ = forgetting_ * sum_xx_ + x * x;
  sum_xy_ = forgetting_ * sum_xy_ + x * network_seconds;
  ++samples_;
}

bool LinkEstimator::Fit(double* slope, double* intercept) const {
  if (samples_ < 3) return false;
  const double mean_x = sum_x_ / weight_;
  const double variance = sum_xx_ / weight_ - mean_x * mean_x;
  // Sizes must spread by more than rounding: at least 10% of their mean.
  if (!(variance > 0.01 * mean_x * mean_x)) return false;
  const double mean_y = sum_y_ / weight_;
  const double covariance = sum_xy_ / weight_ - mean_x * mean_y;
  *slope = covariance / variance;
  *intercept = mean_y - *slope * mean_x;
  return true;
}

double LinkEstimator::symmetric_bytes_per_second() const {
  double slope = 0;
  double intercept = 0;
  if (!Fit(&slope, &intercept) || !(slope > 0)) return 0;
  // network = 2 L + (2 b) / β for b bytes each way at β each way: slope = 1 / β.
  return 1 / slope;
}

double LinkEstimator::one_way_latency_seconds() const {
  double slope = 0;
  double intercept = 0;
  if (!Fit(&slope, &intercept)) return 0;
  return std::max(0.0, intercept / 2);
}

}  // namespace tophat
