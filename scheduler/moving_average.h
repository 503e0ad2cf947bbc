// The moving average every monitored quantity uses (HAT's state monitor: weight α on the
// past, 1 - α on the new sample), taking its first sample as it is.
#pragma once

namespace tophat {

class MovingAverage {
 public:
  explicit MovingAverage(double alpha = 0.8) : alpha_(alpha) {}

  void Add(double sample) {
    value_ = seen_ ? alpha_ * value_ + (1 - alpha_) * sample : sample;
    seen_ = true;
  }
  double value() const { return value_; }  // 0 before the first sample
  bool empty() const { return !seen_; }

 private:
  double alpha_;
  double value_ = 0;
  bool seen_ = false;
};

}  // namespace tophat
