#include "scheduler/device_ledger.h"

#include <catch2/catch.hpp>

namespace tophat {
namespace {

TEST_CASE("DeviceLedger refuses by each per-device limit, naming its config key") {
  DeviceLedger ledger({.max_sessions = 3, .max_waiting = 2, .max_kv_blocks = 10});
  const std::string a = "device a";
  CHECK_FALSE(ledger.QuotaProblem(a, 10).has_value());  // 0 + 10 <= 10
  const std::optional<std::string> too_big = ledger.QuotaProblem(a, 11);
  REQUIRE(too_big.has_value());
  CHECK_THAT(*too_big, Catch::Contains("device a's open sessions hold 0 KV blocks; 11 more") &&
                           Catch::Contains("quota of 10") &&
                           Catch::Contains("limits.max_kv_fraction_per_device"));

  ledger.Open(a, 4);  // sessions 1, waiting 1, blocks 4
  ledger.Open(a, 4);  // sessions 2, waiting 2, blocks 8
  const std::optional<std::string> waiting = ledger.QuotaProblem(a, 1);
  REQUIRE(waiting.has_value());
  CHECK_THAT(*waiting, Catch::Contains("2 sessions waiting for admission") &&
                           Catch::Contains("limits.max_waiting_sessions_per_device"));

  ledger.Admit(a);  // waiting 1: a third may wait, with at most 2 more blocks
  CHECK_FALSE(ledger.QuotaProblem(a, 2).has_value());
  CHECK(ledger.QuotaProblem(a, 3).has_value());  // 8 + 3 > 10
  ledger.Open(a, 2);  // sessions 3, waiting 2, blocks 10
  ledger.Admit(a);
  ledger.Admit(a);  // waiting 0
  const std::optional<std::string> sessions = ledger.QuotaProblem(a, 0);
  REQUIRE(sessions.has_value());
  CHECK_THAT(*sessions, Catch::Contains("device a already has 3 sessions open") &&
                            Catch::Contains("limits.max_sessions_per_device"));

  // Another device counts apart.
  CHECK_FALSE(ledger.QuotaProblem("device b", 10).has_value());
  // Closing gives back what the session counted.
  ledger.Close(a, 4, /*waiting=*/false);  // sessions 2, blocks 6
  CHECK_FALSE(ledger.QuotaProblem(a, 4).has_value());
  CHECK(ledger.QuotaProblem(a, 5).has_value());
  const DeviceLedger::Usage usage = ledger.usage(a);
  CHECK(usage.sessions == 2);
  CHECK(usage.waiting == 0);
  CHECK(usage.blocks == 6);
}

TEST_CASE("DeviceLedger with no limits refuses nothing") {
  DeviceLedger ledger({});
  for (int i = 0; i < 100; ++i) ledger.Open("stream 1", 1000);
  CHECK_FALSE(ledger.QuotaProblem("stream 1", 1 << 30).has_value());
}

TEST_CASE("DeviceLedger re-counts parked and resumed sessions") {
  DeviceLedger ledger({.max_waiting = 1, .max_kv_blocks = 8});
  const std::string a = "device a";
  ledger.Open(a, 8);  // a session that may grow to 8 blocks
  ledger.Admit(a);
  CHECK(ledger.QuotaProblem(a, 1).has_value());  // 8 + 1 > 8
  // Parked holding 3 blocks, it counts 3: 5 more fit.
  ledger.Recount(a, 8, 3);
  CHECK_FALSE(ledger.QuotaProblem(a, 5).has_value());
  CHECK(ledger.QuotaProblem(a, 6).has_value());
  // Resumed for up to 6 blocks, it waits again and counts 6.
  ledger.Recount(a, 3, 6, /*waiting=*/true);
  const DeviceLedger::Usage usage = ledger.usage(a);
  CHECK(usage.waiting == 1);
  CHECK(usage.blocks == 6);
  CHECK(ledger.QuotaProblem(a, 1).has_value());  // one waits already (max_waiting 1)
  ledger.Close(a, 6, /*waiting=*/true);
  CHECK(ledger.num_devices() == 0);
  CHECK(ledger.usage(a).blocks == 0);
}

TEST_CASE("DeviceLedger gives each device a slot and its weight, and reuses freed slots") {
  DeviceLedger ledger({.weights = {{"heavy", 3.0}, {"light", 0.5}}});
  CHECK(ledger.Open("device heavy", 1) == 0);
  CHECK(ledger.Open("stream 7", 1) == 1);
  CHECK(ledger.Open("device light", 1) == 2);
  CHECK(ledger.Open("device heavy", 1) == 0);  // its second session: the same slot
  CHECK(ledger.num_slots() == 3);
  CHECK(ledger.slot_weight(0) == 3.0);
  CHECK(ledger.slot_weight(1) == 1.0);  // plaintext: no identity, no weight
  CHECK(ledger.slot_weight(2) == 0.5);
  CHECK(ledger.slot_weight(5) == 1.0);  // never used

  // "stream 7" leaves; the next new device takes its slot and its own weight.
  ledger.Close("stream 7", 1, /*waiting=*/true);
  CHECK(ledger.num_devices() == 2);
  CHECK(ledger.Open("device light2", 1) == 1);
  CHECK(ledger.slot_weight(1) == 1.0);
  ledger.Close("device light", 1, /*waiting=*/true);
  CHECK(ledger.Open("device heavy2", 1) == 2);
  CHECK(ledger.slot_weight(2) == 1.0);  // "heavy2" is not "heavy": weights match whole names
  CHECK(ledger.num_slots() == 3);
  // A device keeps its slot while any of its sessions is open.
  ledger.Close("device heavy", 1, /*waiting=*/true);
  CHECK(ledger.Open("device new", 1) == 3);
  CHECK(ledger.usage("device heavy").slot == 0);
}

TEST_CASE("DeviceLedger names the devices holding the most KV, then sessions, then by name") {
  DeviceLedger ledger({});
  ledger.Open("device small", 2);
  ledger.Open("device big", 8);
  ledger.Open("device many", 3);
  ledger.Open("device many", 3);
  ledger.Open("device tie", 2);
  ledger.Open("device gone", 5);
  ledger.Close("device gone", 5, /*waiting=*/true);  // no sessions left: not listed
  const auto top = ledger.Top(3);
  REQUIRE(top.size() == 3);
  CHECK(top[0].first == "device big");
  CHECK(top[1].first == "device many");
  CHECK(top[1].second.sessions == 2);
  CHECK(top[1].second.blocks == 6);
  CHECK(top[2].first == "device small");  // 2 blocks, 1 session, as "device tie": by name
  CHECK(ledger.Top(100).size() == 4);
  CHECK(ledger.Top(0).empty());
}

TEST_CASE("DeviceLedger's quotas change while sessions are open, which keep running") {
  DeviceLedger ledger({});
  const std::string a = "device a";
  for (int i = 0; i < 3; ++i) ledger.Open(a, 4);
  CHECK_FALSE(ledger.QuotaProblem(a, 4).has_value());
  ledger.SetLimits({.max_sessions = 2});
  const std::optional<std::string> over = ledger.QuotaProblem(a, 4);
  REQUIRE(over.has_value());
  CHECK_THAT(*over, Catch::Contains("already has 3 sessions open"));
  CHECK(ledger.usage(a).sessions == 3);  // nothing was closed
  ledger.Close(a, 4, /*waiting=*/true);
  ledger.Close(a, 4, /*waiting=*/true);
  CHECK_FALSE(ledger.QuotaProblem(a, 4).has_value());  // under the new quota again
  ledger.SetLimits({.max_kv_blocks = 6});
  CHECK(ledger.QuotaProblem(a, 3).has_value());  // 4 + 3 > 6
  CHECK_FALSE(ledger.QuotaProblem(a, 2).has_value());
}

TEST_CASE("DeviceLedger's weights change for the devices holding slots, and for new ones") {
  DeviceLedger ledger({.weights = {{"a", 3}}});
  const int32_t a = ledger.Open("device a", 1);
  const int32_t b = ledger.Open("device b", 1);
  const int32_t plain = ledger.Open("stream 7", 1);
  CHECK(ledger.slot_weight(a) == 3);
  CHECK(ledger.slot_weight(b) == 1);
  ledger.SetLimits({.weights = {{"b", 0.5}, {"c", 2}}});
  CHECK(ledger.slot_weight(a) == 1);  // no longer listed
  CHECK(ledger.slot_weight(b) == 0.5);
  CHECK(ledger.slot_weight(plain) == 1);
  CHECK(ledger.slot_weight(ledger.Open("device c", 1)) == 2);
  // A freed slot taken by another device carries that device's weight.
  ledger.Close("device b", 1, /*waiting=*/true);
  CHECK(ledger.slot_weight(ledger.Open("device d", 1)) == 1);
}

}  // namespace
}  // namespace tophat
