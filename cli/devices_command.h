// `tophat devices`: who holds a running tophat-cloud, as a table: its metrics port's
// /devices (the devices whose open sessions count the most KV blocks) read and printed for
// an operator at a terminal, or passed through as JSON.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tophat::cli {

struct DevicesArgs {
  std::string cloud_metrics = "127.0.0.1:9100";  // the cloud's metrics_address
  int64_t limit = 20;                            // devices listed, 1-1,000
  bool json = false;                             // the endpoint's JSON as it came
  double timeout_s = 5;
};

// The table for a /devices body; errors name what in the body is not as the cloud writes it.
absl::StatusOr<std::string> FormatDevicesTable(const std::string& body);

int RunDevices(const DevicesArgs& args);

}  // namespace tophat::cli
