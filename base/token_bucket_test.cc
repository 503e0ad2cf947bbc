#include "base/token_bucket.h"

#include <catch2/catch.hpp>

namespace tophat {
namespace {

using std::chrono::milliseconds;

double Seconds(TokenBucket::Clock::duration d) { return std::chrono::duration<double>(d).count(); }

TEST_CASE("A token bucket lets a burst through, then paces to its rate", "[token_bucket]") {
  const auto start = TokenBucket::Clock::time_point{} + std::chrono::hours(1);
  TokenBucket bucket(100, 10, start);
  for (int i = 0; i < 10; ++i) CHECK(bucket.Take(start) == TokenBucket::Clock::duration::zero());
  // The 11th token is 10 ms away at 100/s, the 12th 20 ms.
  CHECK(Seconds(bucket.Take(start)) == Approx(0.010));
  CHECK(Seconds(bucket.Take(start)) == Approx(0.020));
  // 20 ms later both promised tokens have come: the next waits 10 ms again.
  CHECK(Seconds(bucket.Take(start + milliseconds(20))) == Approx(0.010));
}

TEST_CASE("A token bucket below its rate never waits, and refills only up to its burst",
          "[token_bucket]") {
  const auto start = TokenBucket::Clock::time_point{} + std::chrono::hours(1);
  TokenBucket bucket(100, 5, start);
  auto now = start;
  for (int i = 0; i < 1000; ++i) {
    now += milliseconds(11);  // 91 a second, under 100
    REQUIRE(bucket.Take(now) == TokenBucket::Clock::duration::zero());
  }
  // An hour idle holds at most 5 tokens, not 360,000.
  now += std::chrono::hours(1);
  for (int i = 0; i < 5; ++i) CHECK(bucket.Take(now) == TokenBucket::Clock::duration::zero());
  CHECK(bucket.Take(now) > TokenBucket::Clock::duration::zero());
}

TEST_CASE(
    "A token bucket's new rate keeps what it holds, at most the new burst, and what it "
    "owes",
    "[token_bucket]") {
  const auto start = TokenBucket::Clock::time_point{} + std::chrono::hours(1);
  TokenBucket bucket(100, 100, start);
  for (int i = 0; i < 40; ++i) REQUIRE(bucket.Take(start) == TokenBucket::Clock::duration::zero());
  // 60 held; the new burst is 10: 10 held, and the 11th waits a tenth of a second at 10/s.
  bucket.SetRate(10, 10, start);
  for (int i = 0; i < 10; ++i) CHECK(bucket.Take(start) == TokenBucket::Clock::duration::zero());
  CHECK(Seconds(bucket.Take(start)) == Approx(0.1));
  // Owing one token at 10/s; raised to 1,000/s the debt stays, and is repaid at the new rate.
  bucket.SetRate(1000, 1000, start);
  CHECK(Seconds(bucket.Take(start)) == Approx(0.002));
  // What accrued before a change counts at the old rate: 1 s at 1,000/s fills the new burst.
  bucket.SetRate(1000, 1000, start + std::chrono::seconds(1));
  bucket.SetRate(5, 5, start + std::chrono::seconds(1));
  for (int i = 0; i < 5; ++i) {
    CHECK(bucket.Take(start + std::chrono::seconds(1)) == TokenBucket::Clock::duration::zero());
  }
  CHECK(Seconds(bucket.Take(start + std::chrono::seconds(1))) == Approx(0.2));
}

}  // namespace
}  // namespace tophat
