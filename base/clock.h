// Time helpers shared across the project.
#pragma once

#include <chrono>

namespace tophat {

// A duration in seconds, as a double (metrics, logs and protocol fields are in seconds).
template <class Rep, class Period>
double Seconds(std::chrono::duration<Rep, Period> d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace tophat
