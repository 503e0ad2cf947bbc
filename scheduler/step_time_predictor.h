// g(μ): the predicted duration of one cloud step that batches μ tokens (HAT section 3.2,
// DESIGN.md "State monitor"). A piecewise-linear curve through one point per bucket of batch
// sizes (buckets 1, 2-3, 4-7, ... so decode-sized and prefill-sized steps each get points of
// their own). Each bucket's point is a moving average (weight α on the past, HAT's
// g^t = α g^{t-1} + (1 - α) measured) of the token counts and the durations that fell into
// it, so the curve follows the machine as load and clocks drift. Pure arithmetic: no clock,
// no I/O, not thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "scheduler/moving_average.h"

namespace tophat {

class StepTimePredictor {
 public:
  // Buckets cover 1 .. max_tokens (powers of two); alpha in [0, 1).
  explicit StepTimePredictor(int64_t max_tokens = 8192, double alpha = 0.8);

  // One measured step: `tokens` batched (>= 1) took `seconds` (> 0); others are ignored.
  void Observe(int64_t tokens, double seconds);

  // Predicted seconds for a step of `tokens`. With no observations, 0. With points in one
  // bucket only, that bucket's time (a flat curve). Otherwise linear between neighbouring
  // points and, beyond the outer points, along the nearest segment; never below 0, and never
  // decreasing in `tokens` (a longer step is not predicted faster).
  double Predict(double tokens) const;

  // The most tokens, at most `upper`, that a step may batch and be predicted to take at
  // most `seconds` (0 when even one token takes longer): Predict inverted, by bisection.
  int64_t MaxTokensWithin(double seconds, int64_t upper) const;

  bool has_data() const;
  int64_t observations() const { return observations_; }

  struct Point {
    double tokens = 0;
    double seconds = 0;
  };
  // The curve's points, by increasing tokens (buckets with data only).
  std::vector<Point> Points() const;

  static constexpr size_t kMaxBuckets = 64;  // bit widths of int64 token counts
  // Points() without allocating (Predict runs in the engine's step); returns the count.
  size_t FillPoints(std::array<Point, kMaxBuckets>& points) const;

 private:

  struct Bucket {
    explicit Bucket(double alpha) : tokens(alpha), seconds(alpha) {}
    MovingAverage tokens;   // of the batch sizes observed in the bucket
    MovingAverage seconds;  // of their durations
  };
  std::vector<Bucket> buckets_;
  int64_t observations_ = 0;
};

}  // namespace tophat
