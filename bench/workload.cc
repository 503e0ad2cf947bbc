#include "bench/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tophat {

absl::StatusOr<PromptLengthSampler> PromptLengthSampler::FromSpec(const std::string& spec) {
  PromptLengthSampler sampler;
  sampler.name_ = spec;
  // Shapes fitted so that P90/mean matches the dataset (mean = shape * scale).
  if (spec == "specbench") {
    sampler.gamma_shape_ = 0.6465;
    sampler.gamma_scale_ = 351.0 / sampler.gamma_shape_;
    return sampler;
  }
  if (spec == "cnndm") {
    sampler.gamma_shape_ = 3.4936;
    sampler.gamma_scale_ = 1037.0 / sampler.gamma_shape_;
    return sampler;
  }
  if (absl::StartsWith(spec, "fixed:")) {
    int64_t length = 0;
    if (!absl::SimpleAtoi(spec.substr(6), &length) || length <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt lengths \"", spec, "\": fixed:N needs a positive integer N"));
    }
    sampler.lengths_ = {length};
    return sampler;
  }
  std::ifstream in(spec);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        "prompt lengths \"", spec,
        "\": not a built-in (specbench, cnndm, fixed:N) and no such file"));
  }
  std::string line;
  int line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text.front() == '#') continue;
    int64_t length = 0;
    if (!absl::SimpleAtoi(text, &length) || length <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(spec, ":", line_number,
                                                     ": expected a positive integer, got \"",
                                                     std::string(text), "\""));
    }
    sampler.lengths_.push_back(length);
  }
  if (sampler.lengths_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(spec, ": no prompt lengths in the file"));
  }
  return sampler;
}

int64_t PromptLengthSampler::Sample(std::mt19937_64& rng, int64_t max_length) const {
  int64_t length = 1;
  if (!lengths_.empty()) {
    std::uniform_int_distribution<size_t> pick(0, lengths_.size() - 1);
    length = lengths_[pick(rng)];
  } else {
    std::gamma_distribution<double> gamma(gamma_shape_, gamma_scale_);
    length = static_cast<int64_t>(std::llround(gamma(rng)));
  }
  return std::clamp<int64_t>(length, 1, std::max<int64_t>(1, max_length));
}

std::vector<double> PoissonArrivals(double rate, int64_t count, std::mt19937_64& rng) {
  std::vector<double> arrivals;
  arrivals.reserve(count);
  double t = 0;
  std::exponential_distribution<double> gap(rate > 0 ? rate : 1.0);
  for (int64_t i = 0; i < count; ++i) {
    arrivals.push_back(rate > 0 ? t : 0.0);
    if (rate > 0) t += gap(rng);
  }
  return arrivals;
}

LatencySummary Summarize(std::span<const double> samples) {
  LatencySummary summary;
  if (samples.empty()) return summary;
  std::vector<double> sorted(samples.begin(), samples.end());
  std::sort(sorted.begin(), sorted.end());
  double total = 0;
  for (double x : sorted) total += x;
  summary.mean = total / static_cast<double>(sorted.size());
  const auto rank = [&](double q) {
    const size_t index = static_cast<size_t>(std::ceil(q * sorted.size()));
    return sorted[std::min(sorted.size() - 1, index == 0 ? 0 : index - 1)];
  };
  summary.p50 = rank(0.5);
  summary.p90 = rank(0.9);
  summary.p99 = rank(0.99);
  return summary;
}

}  // namespace tophat
