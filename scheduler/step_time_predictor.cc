#include "scheduler/step_time_predictor.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace tophat {

StepTimePredictor::StepTimePredictor(int64_t max_tokens, double alpha) {
  const auto top = static_cast<uint64_t>(std::max<int64_t>(1, max_tokens));
  buckets_.assign(std::min<size_t>(kMaxBuckets, static_cast<size_t>(std::bit_width(top))),
                  Bucket(std::clamp(alpha, 0.0, 0.999)));
}

void StepTimePredictor::Observe(int64_t tokens, double seconds) {
  if (tokens < 1 || !(seconds > 0) || !std::isfinite(seconds)) return;
  const size_t index = std::min(buckets_.size() - 1,
                                static_cast<size_t>(std::bit_width(static_cast<uint64_t>(tokens))) - 1);
  Bucket& bucket = buckets_[index];
  bucket.tokens.Add(static_cast<double>(tokens));
  bucket.seconds.Add(seconds);
  ++observations_;
}

bool StepTimePredictor::has_data() const { return observations_ > 0; }

size_t StepTimePredictor::FillPoints(std::array<Point, kMaxBuckets>& points) const {
  size_t count = 0;
  for (const Bucket& bucket : buckets_) {
    if (!bucket.tokens.empty()) points[count++] = {bucket.tokens.value(), bucket.seconds.value()};
  }
  // Bucket order is token order except when two averages cross at a boundary; keep it sorted.
  std::sort(points.begin(), points.begin() + static_cast<ptrdiff_t>(count),
            [](const Point& a, const Point& b) { return a.tokens < b.tokens; });
  // Noise can make a larger bucket look faster; a step time is not decreasing in its size.
  for (size_t i = 1; i < count; ++i) {
    points[i].seconds = std::max(points[i].seconds, points[i - 1].seconds);
  }
  return count;
}

std::vector<StepTimePredictor::Point> StepTimePredictor::Points() const {
  std::array<Point, kMaxBuckets> points;
  const size_t count = FillPoints(points);
  return {points.begin(), points.begin() + static_cast<ptrdiff_t>(count)};
}

double StepTimePredictor::Predict(double tokens) const {
  std::array<Point, kMaxBuckets> points;
  const size_t count = FillPoints(points);
  if (count == 0) return 0;
  if (count == 1) return points[0].seconds;
  size_t right = 1;
  while (right + 1 < count && points[right].tokens < tokens) ++right;
  const Point& a = points[right - 1];
  const Point& b = points[right];
  const double span = b.tokens - a.tokens;
  const double slope = span > 0 ? (b.seconds - a.seconds) / span : 0;
  double value = a.seconds + slope * (tokens - a.tokens);
  // Below the first point the curve does not fall under half the smallest step seen: a step
  // has a fixed cost that extrapolating a steep segment down to zero tokens would miss.
  if (tokens < points[0].tokens) value = std::max(value, 0.5 * points[0].seconds);
  return std::max(0.0, value);
}

int64_t StepTimePredictor::MaxTokensWithin(double seconds, int64_t upper) const {
  if (upper <= 0) return 0;
  if (Predict(static_cast<double>(upper)) <= seconds) return upper;
  int64_t fits = 0;        // Predict(fits) <= seconds, or 0
  int64_t too_many = upper;  // Predict(too_many) > seconds
  while (too_many - fits > 1) {
    const int64_t middle = fits + (too_many - fits) / 2;
    if (Predict(static_cast<double>(middle)) <= seconds) {
      fits = middle;
    } else {
      too_many = middle;
    }
  }
  return fits;
}

}  // namespace tophat
