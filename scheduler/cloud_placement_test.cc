#include "scheduler/cloud_placement.h"

#include <map>
#include <vector>

#include <catch2/catch.hpp>

namespace tophat {
namespace {

CloudCandidate Cloud(uint64_t epoch, int64_t running, int64_t waiting = 0,
                     int64_t kv_free = 100, int64_t kv_total = 100) {
  return {.connected = true,
          .epoch = epoch,
          .running_sessions = running,
          .waiting_sessions = waiting,
          .kv_blocks_free = kv_free,
          .kv_blocks_total = kv_total};
}

// How often each cloud is chosen over 3,000 draws.
std::map<size_t, int> Choices(const std::vector<CloudCandidate>& clouds) {
  std::map<size_t, int> chosen;
  for (uint64_t random = 0; random < 3000; ++random) {
    ++chosen[*PlaceRequest(clouds, {.random = random * 2654435761u})];
  }
  return chosen;
}

TEST_CASE("A new request goes to the shorter queue of two clouds drawn", "[placement]") {
  // Of two clouds, always the shorter queue.
  std::vector<CloudCandidate> two = {Cloud(1, 4), Cloud(2, 1, 1)};
  CHECK(Choices(two) == std::map<size_t, int>{{1, 3000}});
  // Of three, the longest queue loses every draw it is in, and the shortest wins every one
  // (two in three draws hold it).
  std::vector<CloudCandidate> three = {Cloud(1, 4), Cloud(2, 1, 1), Cloud(3, 3)};
  std::map<size_t, int> chosen = Choices(three);
  CHECK(chosen[0] == 0);
  CHECK(chosen[1] == Approx(2000).margin(150));
  CHECK(chosen[2] == Approx(1000).margin(150));
  // Waiting sessions count as much as running ones, and this agent's placements since the
  // report too.
  three[1].waiting_sessions = 3;  // 4
  three[2].placed_since_report = 2;  // 5
  chosen = Choices(three);
  CHECK(chosen[2] == 0);
}

TEST_CASE("Equal queues go to the cloud with clearly more of its KV free, else to either",
          "[placement]") {
  std::vector<CloudCandidate> clouds = {Cloud(1, 2, 0, 10, 100), Cloud(2, 2, 0, 50, 100)};
  CHECK(Choices(clouds) == std::map<size_t, int>{{1, 3000}});
  // The share, not the count: 40 of 50 beats 50 of 100.
  clouds[0].kv_blocks_free = 40;
  clouds[0].kv_blocks_total = 50;
  CHECK(Choices(clouds) == std::map<size_t, int>{{0, 3000}});
  // A few points apart is a tie: every agent reads the same reports, and a fine tie-break
  // would send them all to one cloud. Ties spread evenly.
  clouds[0].kv_blocks_free = 27;
  std::map<size_t, int> chosen = Choices(clouds);
  CHECK(chosen[0] == Approx(1500).margin(150));
  CHECK(chosen[1] == Approx(1500).margin(150));
  std::vector<CloudCandidate> equal = {Cloud(1, 0), Cloud(2, 0), Cloud(3, 0)};
  chosen = Choices(equal);
  for (size_t i = 0; i < 3; ++i) CHECK(chosen[i] == Approx(1000).margin(150));
}

TEST_CASE("Disconnected, lost and draining clouds are passed over", "[placement]") {
  std::vector<CloudCandidate> clouds = {Cloud(1, 0), Cloud(2, 5), Cloud(3, 9)};
  clouds[0].connected = false;
  CHECK(PlaceRequest(clouds, {}) == 1u);
  CHECK(PlaceRequest(clouds, {.lost_epoch = 2}) == 2u);
  CHECK(Choices(clouds) == std::map<size_t, int>{{1, 3000}});  // never the disconnected one
  clouds[2].draining = true;
  CHECK(PlaceRequest(clouds, {.lost_epoch = 2}) == 2u);  // draining, but the only one left
  clouds[1].draining = true;
  clouds[2].draining = false;
  CHECK(Choices(clouds) == std::map<size_t, int>{{2, 3000}});  // admitting beats draining
  clouds[2].connected = false;
  clouds[1].connected = false;
  CHECK_FALSE(PlaceRequest(clouds, {}).has_value());
  CHECK_FALSE(PlaceRequest({}, {}).has_value());
}

TEST_CASE("A request whose KV is parked on a cloud stays there while it admits",
          "[placement]") {
  std::vector<CloudCandidate> clouds = {Cloud(1, 0), Cloud(2, 7)};
  CHECK(PlaceRequest(clouds, {.preferred_epoch = 2}) == 1u);
  // Its stream is gone (a newer epoch on the same cloud does not hold the KV): shortest queue.
  clouds[1].epoch = 5;
  CHECK(PlaceRequest(clouds, {.preferred_epoch = 2}) == 0u);
  clouds[1].epoch = 2;
  clouds[1].draining = true;
  CHECK(PlaceRequest(clouds, {.preferred_epoch = 2}) == 0u);
}

}  // namespace
}  // namespace tophat
