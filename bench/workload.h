// Workload generation and latency statistics for `tophat bench`: Poisson arrivals, prompt
// lengths from built-in dataset-shaped distributions or a file, percentiles, SLA compliance.
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tophat {

// Prompt-length distributions. The built-ins are gamma distributions fitted to the mean and
// P90 of the datasets HAT evaluates on: SpecBench (mean 351, P90 891) and CNN/DailyMail
// (mean 1037, P90 1772).
class PromptLengthSampler {
 public:
  // "specbench", "cnndm", "fixed:N", or a file with one positive integer per line.
  static absl::StatusOr<PromptLengthSampler> FromSpec(const std::string& spec);

  // A length in [1, max_length].
  int64_t Sample(std::mt19937_64& rng, int64_t max_length) const;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  double gamma_shape_ = 0;
  double gamma_scale_ = 0;
  std::vector<int64_t> lengths_;  // from a file or fixed:N; drawn uniformly
};

// Arrival offsets (seconds from the start) of `count` requests at `rate` requests/s;
// rate <= 0 means all at once.
std::vector<double> PoissonArrivals(double rate, int64_t count, std::mt19937_64& rng);

struct LatencySummary {
  double mean = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
};
// Nearest-rank percentiles; all zero for an empty sample.
LatencySummary Summarize(std::span<const double> samples);

}  // namespace tophat
