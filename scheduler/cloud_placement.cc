#include "scheduler/cloud_placement.h"

#include <vector>

namespace tophat {
namespace {

// How much larger a share of free KV breaks a tie between equal queues.
constexpr double kClearlyMoreKvFree = 0.1;

// Whether `a` is a better place than `b`: the shorter queue, then a clearly larger share of
// its KV free (equal queues on clouds of different sizes, or holding sessions of different
// lengths). Small differences are ties, which the first of the two random draws wins: every
// agent sees the same reports, and a fine tie-break would send all of them to the same cloud
// until the next report.
bool Better(const CloudCandidate& a, const CloudCandidate& b) {
  const int64_t qa = QueueLength(a);
  const int64_t qb = QueueLength(b);
  if (qa != qb) return qa < qb;
  if (a.kv_blocks_total <= 0 || b.kv_blocks_total <= 0) return false;  // nothing known
  const double free_a = static_cast<double>(a.kv_blocks_free) / static_cast<double>(a.kv_blocks_total);
  const double free_b = static_cast<double>(b.kv_blocks_free) / static_cast<double>(b.kv_blocks_total);
  return free_a > free_b + kClearlyMoreKvFree;
}

}  // namespace

int64_t QueueLength(const CloudCandidate& cloud) {
  return cloud.running_sessions + cloud.waiting_sessions + cloud.placed_since_report;
}

std::optional<size_t> PlaceRequest(std::span<const CloudCandidate> clouds,
                                   const PlacementRequest& request) {
  const auto usable = [&](const CloudCandidate& cloud) {
    return cloud.connected && (request.lost_epoch == 0 || cloud.epoch != request.lost_epoch);
  };
  if (request.preferred_epoch != 0) {
    for (size_t i = 0; i < clouds.size(); ++i) {
      const CloudCandidate& cloud = clouds[i];
      if (usable(cloud) && !cloud.draining && cloud.epoch == request.preferred_epoch) return i;
    }
  }
  std::vector<size_t> admitting;
  std::vector<size_t> draining;
  for (size_t i = 0; i < clouds.size(); ++i) {
    if (!usable(clouds[i])) continue;
    (clouds[i].draining ? draining : admitting).push_back(i);
  }
  const std::vector<size_t>& pool = admitting.empty() ? draining : admitting;
  if (pool.empty()) return std::nullopt;
  if (pool.size() == 1) return pool.front();
  // Two distinct draws; the first wins a tie.
  const size_t n = pool.size();
  const size_t first = request.random % n;
  const size_t second = (first + 1 + (request.random / n) % (n - 1)) % n;
  return Better(clouds[pool[second]], clouds[pool[first]]) ? pool[second] : pool[first];
}

}  // namespace tophat
