#include "cli/devices_command.h"

#include <catch2/catch.hpp>
#include <string>

namespace tophat::cli {
namespace {

TEST_CASE("tophat devices' table aligns the cloud's report, and shows no control characters") {
  const std::string body = R"({"devices": 2, "streams": 3, "kv_blocks_total": 1000,
      "kv_blocks_allocated": 250, "top": [
      {"device": "device cam-0117", "sessions": 32, "waiting": 16, "kv_blocks": 500,
       "kv_fraction": 0.5, "streams": 2},
      {"device": "device \u001b[2Jx", "sessions": 1, "waiting": 0, "kv_blocks": 4,
       "kv_fraction": 0.004, "streams": 1}]})";
  auto table = FormatDevicesTable(body);
  REQUIRE(table.ok());
  CHECK(*table ==
        "2 device(s) with sessions, 3 stream(s); KV blocks 250 of 1000 in use (25.0%)\n"
        "device           sessions  waiting  kv_blocks  kv_share  streams\n"
        "device cam-0117        32       16        500     50.0%        2\n"
        "device ?[2Jx            1        0          4      0.4%        1\n");
}

TEST_CASE("tophat devices says when no device holds a session") {
  auto table = FormatDevicesTable(
      R"({"devices": 0, "streams": 1, "kv_blocks_total": 64, "kv_blocks_allocated": 0, "top": []})");
  REQUIRE(table.ok());
  CHECK(*table ==
        "0 device(s) with sessions, 1 stream(s); KV blocks 0 of 64 in use (0.0%)\n"
        "no device holds a session\n");
}

TEST_CASE("tophat devices names what in an answer is not a cloud's report") {
  const auto error_of = [](const std::string& body) {
    auto table = FormatDevicesTable(body);
    REQUIRE_FALSE(table.ok());
    return std::string(table.status().message());
  };
  CHECK(error_of("<html>") == "the answer is not a JSON object");
  CHECK(error_of(R"({"devices": 1})") == "the answer has no whole number \"streams\"");
  CHECK(error_of(R"({"devices": 1, "streams": 1, "kv_blocks_total": 8,
                     "kv_blocks_allocated": 1})") == "the answer has no list \"top\"");
  CHECK(error_of(R"({"devices": 1, "streams": 1, "kv_blocks_total": 8, "kv_blocks_allocated": 1,
                     "top": [{"device": "device a", "sessions": "many"}]})") ==
        "top[0] has no whole number \"sessions\"");
}

}  // namespace
}  // namespace tophat::cli
