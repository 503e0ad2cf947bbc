// A token bucket that paces instead of refusing: Take() always takes its token and says how
// long the caller should wait before acting on it, so that a client above the rate is
// slowed to it, and one below it (with bursts up to `burst`) never waits. Single-threaded;
// the caller passes the time, so tests need no clock.
#pragma once

#include <algorithm>
#include <chrono>

namespace tophat {

class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;
  // `per_second` > 0 tokens are added each second, up to `burst` (>= 1) held.
  TokenBucket(double per_second, double burst, Clock::time_point now)
      : per_second_(per_second), burst_(burst), tokens_(burst), last_(now) {}

  // A new rate and burst from `now` on: what accrued until now at the old rate stays (at most
  // the new burst), and so does what is owed (negative tokens: callers already told to wait).
  void SetRate(double per_second, double burst, Clock::time_point now) {
    Refill(now);
    per_second_ = per_second;
    burst_ = burst;
    tokens_ = std::min(tokens_, burst_);
  }

  // Takes one token; returns how long to wait before using it (zero when one was there).
  Clock::duration Take(Clock::time_point now) {
    Refill(now);
    tokens_ -= 1;
    if (tokens_ >= 0) return Clock::duration::zero();
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(-tokens_ / per_second_));
  }

 private:
  void Refill(Clock::time_point now) {
    const double elapsed = std::chrono::duration<double>(now - last_).count();
    if (elapsed > 0) {
      tokens_ = std::min(burst_, tokens_ + elapsed * per_second_);
      last_ = now;
    }
  }

  double per_second_;
  double burst_;
  double tokens_;  // negative: tokens promised to waiting callers
  Clock::time_point last_;
};

}  // namespace tophat
