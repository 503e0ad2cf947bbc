#include "base/log_rate.h"

#include <catch2/catch.hpp>

namespace tophat {
namespace {

TEST_CASE("LogRate lets a few lines a second through and counts the rest", "[base]") {
  LogRate rate(2);
  const LogRate::Clock::time_point start{};
  int64_t held_back = -1;
  CHECK(rate.Allow(start + std::chrono::seconds(5), &held_back));
  CHECK(held_back == 0);
  CHECK(rate.Allow(start + std::chrono::milliseconds(5100), &held_back));
  for (int i = 0; i < 1000; ++i) {
    int64_t unused = 0;
    CHECK_FALSE(rate.Allow(start + std::chrono::milliseconds(5200), &unused));
  }
  // A new second: the next line reports what the last one held back.
  CHECK(rate.Allow(start + std::chrono::milliseconds(6100), &held_back));
  CHECK(held_back == 1000);
  CHECK(rate.Allow(start + std::chrono::milliseconds(6200), &held_back));
  CHECK(held_back == 0);
}

}  // namespace
}  // namespace tophat
