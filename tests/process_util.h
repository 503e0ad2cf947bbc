// The integration tests start real processes with the bench's process control.
#pragma once

#include "bench/process_control.h"

namespace tophat::testing {
using bench::ChildProcess;
using bench::FreePort;
using bench::HttpGet;
using bench::MetricValue;
using bench::WaitForPort;
using bench::WaitUntil;
}  // namespace tophat::testing
