#include "cli/devices_command.h"

#include <httplib.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "configs/config_checks.h"

namespace tophat::cli {

absl::StatusOr<std::string> FormatDevicesTable(const std::string& body) {
  const nlohmann::json report = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (report.is_discarded() || !report.is_object()) {
    return absl::InvalidArgumentError("the answer is not a JSON object");
  }
  for (const char* key : {"devices", "streams", "kv_blocks_total", "kv_blocks_allocated"}) {
    if (!report.contains(key) || !report[key].is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the answer has no whole number \"", key, "\""));
    }
  }
  if (!report.contains("top") || !report["top"].is_array()) {
    return absl::InvalidArgumentError("the answer has no list \"top\"");
  }
  const int64_t total = report["kv_blocks_total"].get<int64_t>();
  const int64_t allocated = report["kv_blocks_allocated"].get<int64_t>();
  std::string text = absl::StrFormat(
      "%d device(s) with sessions, %d stream(s); KV blocks %d of %d in use (%.1f%%)\n",
      report["devices"].get<int64_t>(), report["streams"].get<int64_t>(), allocated, total,
      total > 0 ? 100.0 * static_cast<double>(allocated) / static_cast<double>(total) : 0.0);
  // The device column as wide as its longest name (names are whatever a certificate gives).
  struct Row {
    std::string device;
    int64_t sessions, waiting, kv_blocks, streams;
    double kv_fraction;
  };
  std::vector<Row> rows;
  size_t width = std::string("device").size();
  for (size_t i = 0; i < report["top"].size(); ++i) {
    const nlohmann::json& entry = report["top"][i];
    Row row{};
    if (!entry.is_object() || !entry.contains("device") || !entry["device"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("top[", i, "] has no string \"device\""));
    }
    // Printed to a terminal: control characters (escape sequences) shown as '?', whatever a
    // certificate's name holds.
    row.device = entry["device"].get<std::string>();
    for (char& c : row.device) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    }
    for (auto [key, field] : {std::pair{"sessions", &row.sessions},
                              {"waiting", &row.waiting},
                              {"kv_blocks", &row.kv_blocks},
                              {"streams", &row.streams}}) {
      if (!entry.contains(key) || !entry[key].is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat("top[", i, "] has no whole number \"", key, "\""));
      }
      *field = entry[key].get<int64_t>();
    }
    if (!entry.contains("kv_fraction") || !entry["kv_fraction"].is_number()) {
      return absl::InvalidArgumentError(absl::StrCat("top[", i, "] has no number \"kv_fraction\""));
    }
    row.kv_fraction = entry["kv_fraction"].get<double>();
    width = std::max(width, row.device.size());
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return text + "no device holds a session\n";
  const int w = static_cast<int>(width);
  absl::StrAppend(&text, absl::StrFormat("%-*s %9s %8s %10s %9s %8s\n", w, "device", "sessions",
                                         "waiting", "kv_blocks", "kv_share", "streams"));
  for (const Row& row : rows) {
    absl::StrAppend(
        &text, absl::StrFormat("%-*s %9d %8d %10d %8.1f%% %8d\n", w, row.device, row.sessions,
                               row.waiting, row.kv_blocks, 100.0 * row.kv_fraction, row.streams));
  }
  return text;
}

int RunDevices(const DevicesArgs& args) {
  const std::optional<HostPort> address = SplitHostPort(args.cloud_metrics);
  if (!address.has_value() || address->port == 0) {
    std::fprintf(stderr, "tophat devices: --cloud-metrics: expected HOST:PORT, got \"%s\"\n",
                 args.cloud_metrics.c_str());
    return 2;
  }
  httplib::Client client(address->host, address->port);
  const auto seconds = static_cast<time_t>(args.timeout_s);
  const auto micros = static_cast<time_t>((args.timeout_s - static_cast<double>(seconds)) * 1e6);
  client.set_connection_timeout(seconds, micros);
  client.set_read_timeout(seconds, micros);
  const std::string path = absl::StrCat("/devices?limit=", args.limit);
  const httplib::Result response = client.Get(path.c_str());
  if (!response) {
    std::fprintf(stderr,
                 "tophat devices: cannot reach the cloud's metrics port at %s (%s error); is "
                 "tophat-cloud running, and is this its metrics_address?\n",
                 args.cloud_metrics.c_str(), httplib::to_string(response.error()).c_str());
    return 1;
  }
  if (response->status != 200) {
    // The cloud's errors are {"error": "..."}; anything else is printed as it came.
    const nlohmann::json error =
        nlohmann::json::parse(response->body, nullptr, /*allow_exceptions=*/false);
    const std::string message = !error.is_discarded() && error.is_object() &&
                                        error.contains("error") && error["error"].is_string()
                                    ? error["error"].get<std::string>()
                                    : response->body;
    std::fprintf(stderr, "tophat devices: %s answered %d: %s\n", args.cloud_metrics.c_str(),
                 response->status, message.c_str());
    return 1;
  }
  if (args.json) {
    std::printf("%s\n", response->body.c_str());
    return 0;
  }
  absl::StatusOr<std::string> table = FormatDevicesTable(response->body);
  if (!table.ok()) {
    std::fprintf(stderr, "tophat devices: %s/devices: %s (is it a tophat-cloud?)\n",
                 args.cloud_metrics.c_str(), std::string(table.status().message()).c_str());
    return 1;
  }
  std::fputs(table->c_str(), stdout);
  return 0;
}

}  // namespace tophat::cli
