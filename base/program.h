// Helpers for the main() of tophat's programs.
#pragma once

#include <spdlog/spdlog.h>

#include "absl/status/status.h"

namespace tophat {

// Logs `status` as an error and returns the exit code of a run that failed (1).
inline int Fail(const absl::Status& status) {
  spdlog::error("{}", status.ToString());
  return 1;
}

}  // namespace tophat
