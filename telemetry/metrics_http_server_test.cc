#include "telemetry/metrics_http_server.h"

#include <httplib.h>

#include <chrono>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

namespace tophat {
namespace {

TEST_CASE("The metrics server serves the registry with the process's start time, and an "
          "address it cannot take fails naming metrics_address") {
  auto registry = std::make_shared<prometheus::Registry>();
  auto server = StartConfiguredMetricsServer("127.0.0.1:0", registry);
  REQUIRE(server.ok());
  REQUIRE(*server != nullptr);
  httplib::Client client("127.0.0.1", (*server)->port());
  auto response = client.Get("/metrics");
  REQUIRE(response);
  CHECK(response->status == 200);
  std::istringstream lines(response->body);
  std::string line;
  double started = -1;
  while (std::getline(lines, line)) {
    if (line.rfind("process_start_time_seconds ", 0) == 0) {
      started = std::stod(line.substr(line.find(' ') + 1));
    }
  }
  INFO(response->body);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // Set before main; this test binary has not run for an hour.
  CHECK(started <= now);
  CHECK(started > now - 3600);

  auto taken = StartConfiguredMetricsServer(
      "127.0.0.1:" + std::to_string((*server)->port()), std::make_shared<prometheus::Registry>());
  REQUIRE_FALSE(taken.ok());
  CHECK(taken.status().message().find("metrics_address") != std::string::npos);

  auto off = StartConfiguredMetricsServer("", registry);
  REQUIRE(off.ok());
  CHECK(*off == nullptr);
}

}  // namespace
}  // namespace tophat
