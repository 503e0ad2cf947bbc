#include "bench/process_control.h"

#include <catch2/catch.hpp>

namespace tophat::bench {
namespace {

TEST_CASE("Histogram buckets are read from the exposition and summed over label sets",
          "[bench]") {
  const std::string exposition =
      "# HELP h_ratio a histogram\n"
      "# TYPE h_ratio histogram\n"
      "h_ratio_count{stream=\"1\"} 4\n"
      "h_ratio_bucket{stream=\"1\",le=\"0.1\"} 1\n"
      "h_ratio_bucket{stream=\"1\",le=\"0.5\"} 3\n"
      "h_ratio_bucket{stream=\"1\",le=\"+Inf\"} 4\n"
      "h_ratio_bucket{stream=\"2\",le=\"0.1\"} 2\n"
      "h_ratio_bucket{stream=\"2\",le=\"0.5\"} 2\n"
      "h_ratio_bucket{stream=\"2\",le=\"+Inf\"} 5\n"
      "h_ratio_other_bucket{le=\"0.1\"} 9\n";
  const auto buckets = HistogramBuckets(exposition, "h_ratio");
  REQUIRE(buckets.size() == 2);
  CHECK(buckets[0].first == Approx(0.1));
  CHECK(buckets[0].second == 3);
  CHECK(buckets[1].first == Approx(0.5));
  CHECK(buckets[1].second == 5);
  CHECK(HistogramBuckets(exposition, "missing").empty());
}

}  // namespace
}  // namespace tophat::bench
