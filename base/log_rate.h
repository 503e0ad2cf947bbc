// At most `per_second` lines of one kind per second; the rest are counted and reported by the
// next line let through. So one misbehaving client cannot flood the log (a stream opening
// sessions it may not have once wrote ~1,200 warnings a second). Single-threaded.
#pragma once

#include <chrono>
#include <cstdint>

namespace tophat {

class LogRate {
 public:
  using Clock = std::chrono::steady_clock;
  explicit LogRate(int per_second) : per_second_(per_second) {}

  // Whether to write a line now. When it says yes after holding lines back, `*suppressed`
  // holds how many were held back since the last line written (else 0).
  bool Allow(Clock::time_point now, int64_t* suppressed) {
    if (now - window_start_ >= std::chrono::seconds(1)) {
      window_start_ = now;
      in_window_ = 0;
    }
    if (in_window_ >= per_second_) {
      ++held_back_;
      return false;
    }
    ++in_window_;
    *suppressed = held_back_;
    held_back_ = 0;
    return true;
  }

 private:
  int per_second_;
  Clock::time_point window_start_{};
  int in_window_ = 0;
  int64_t held_back_ = 0;
};

}  // namespace tophat
