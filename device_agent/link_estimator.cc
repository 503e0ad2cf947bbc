#include "device_agent/link_estimator.h"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace tophat {
namespace {
constexpr size_t kMinPairs = 3;
// Arrival gaps shorter than this are timer and scheduling noise, not transmission.
constexpr double kMinGapSeconds = 100e-6;
// Each queued pair weighs the older ones down by this: about the last 30 pairs count, and
// they keep counting through phases with no queueing (decoding alone).
constexpr double kPairForgetting = 0.97;
}  // namespace

DispersionEstimator::Pair DispersionEstimator::Queued(const Message& earlier,
                                                      const Message& later) {
  const double arrival_gap = later.arrived - earlier.arrived;
  if (arrival_gap < kMinGapSeconds) return {};
  // If the later message queued, the rate is later.bytes / arrival_gap, and at that rate the
  // earlier one was still crossing when the later one was sent. If it found the link idle,
  // its arrival gap is the send gap plus the difference of the two crossing times, and the
  // test fails whenever the later message is at least as large; a smaller later message
  // could pass it, so such pairs are not used.
  if (later.bytes < earlier.bytes) return {};
  const double rate = later.bytes / arrival_gap;
  if (!(later.sent - earlier.sent < 0.8 * earlier.bytes / rate)) return {};
  return {.queued = true, .bytes = later.bytes, .seconds = arrival_gap};
}

void DispersionEstimator::Observe(double sent_seconds, double arrival_seconds, double bytes) {
  if (!std::isfinite(sent_seconds) || !std::isfinite(arrival_seconds) || !(bytes > 0) ||
      !std::isfinite(bytes)) {
    return;
  }
  // Reports come late and out of order (results of different sessions), so messages wait in
  // a short window sorted by arrival; a pair is judged when its earlier message leaves it,
  // by then with its true neighbour.
  auto at = messages_.end();
  while (at != messages_.begin() && std::prev(at)->arrived > arrival_seconds) --at;
  messages_.insert(at, {sent_seconds, arrival_seconds, bytes});
  ++samples_seen_;
  while (messages_.size() > kWindow) {
    const Pair pair = Queued(messages_[0], messages_[1]);
    messages_.pop_front();
    if (!pair.queued) continue;
    settled_bytes_ = kPairForgetting * settled_bytes_ + pair.bytes;
    settled_seconds_ = kPairForgetting * settled_seconds_ + pair.seconds;
    ++settled_pairs_;
  }
}

double DispersionEstimator::bytes_per_second() const {
  // Summed over the queued pairs: a receiver that reads late stretches one gap and shrinks
  // the next by as much, which a per-pair statistic would see as two wrong rates.
  double bytes = settled_bytes_;
  double seconds = settled_seconds_;
  int64_t pairs = settled_pairs_;
  for (size_t i = 1; i < messages_.size(); ++i) {
    const Pair pair = Queued(messages_[i - 1], messages_[i]);
    if (!pair.queued) continue;
    bytes += pair.bytes;
    seconds += pair.seconds;
    ++pairs;
  }
  if (pairs < static_cast<int64_t>(kMinPairs) || !(seconds > 0)) return 0;
  return bytes / seconds;
}

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

void LinkEstimator::Directions(double* up, double* down) const {
  const double up_dispersion = uplink_.bytes_per_second();
  const double down_dispersion = downlink_.bytes_per_second();
  double slope = 0;
  double intercept = 0;
  // Seconds per byte sent up and back down: 1/β_up + 1/β_down.
  const double cost = Fit(&slope, &intercept) && slope > 0 ? 2 * slope : 0;
  const auto other = [&](double known) {
    const double rest = cost - 1 / known;
    // The rest of the round trip's cost; meaningless when the known side explains it all.
    return rest > 0.1 * cost ? 1 / rest : 0.0;
  };
  *up = up_dispersion;
  *down = down_dispersion;
  if (cost <= 0) return;
  if (down_dispersion <= 0 && up_dispersion > 0) *down = other(up_dispersion);
  if (up_dispersion <= 0 && down_dispersion > 0) *up = other(down_dispersion);
  // Without a split, the symmetric rate: it explains the cost, so it is safe for both.
  if (*up <= 0) *up = 2 / cost;
  if (*down <= 0) *down = 2 / cost;
}

double LinkEstimator::uplink_bytes_per_second() const {
  double up = 0;
  double down = 0;
  Directions(&up, &down);
  return up;
}

double LinkEstimator::downlink_bytes_per_second() const {
  double up = 0;
  double down = 0;
  Directions(&up, &down);
  return down;
}

double LinkEstimator::one_way_latency_seconds() const {
  double slope = 0;
  double intercept = 0;
  if (!Fit(&slope, &intercept)) return 0;
  return std::max(0.0, intercept / 2);
}

}  // namespace tophat
