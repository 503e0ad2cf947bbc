// Where an agent given several clouds places a new request: join the shortest queue (DSD's
// load balancer across verifier servers), from the load each cloud reports (CloudLoad) plus
// the requests this agent placed there since that report, which the report cannot show yet.
// Of two clouds drawn at random, that is: every agent reads the same reports, a few hundred
// milliseconds old, and with a choice among all of them every agent sent its requests to the
// same least-loaded cloud until the next report (48 short requests from 6 agents over 3
// clouds landed 13, 23 and 12). Two random choices keep most of the shortest queue's benefit
// and none of that herding (Mitzenmacher's "power of two choices").
// A request that holds KV on one cloud (a parked conversation) stays there while it can.
// Pure logic.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace tophat {

struct CloudCandidate {
  bool connected = false;
  bool draining = false;  // admits no new sessions
  uint64_t epoch = 0;     // its stream, when connected
  int64_t running_sessions = 0;
  int64_t waiting_sessions = 0;
  int64_t kv_blocks_free = 0;
  int64_t kv_blocks_total = 0;
  int64_t placed_since_report = 0;  // by this agent, after the report above was made
};

struct PlacementRequest {
  // The stream that holds this request's KV (a parked conversation's), 0: none. The cloud
  // on it is chosen while it is connected and not draining: the KV there saves a prefill.
  uint64_t preferred_epoch = 0;
  // A stream this request just lost (0: none): not chosen again even if it still looks
  // connected for a moment.
  uint64_t lost_epoch = 0;
  // Draws the two clouds compared (any value; a fresh random one per request).
  uint64_t random = 0;
};

// The index of the cloud to use: the better of two drawn from the usable clouds (connected,
// not `lost_epoch`'s, admitting; the draining ones only when every usable cloud drains: the
// refusal then says so, and the request waits for a successor as with one cloud). nullopt
// when none is usable.
std::optional<size_t> PlaceRequest(std::span<const CloudCandidate> clouds,
                                   const PlacementRequest& request);

// The queue a candidate is judged by: sessions running and waiting there, and this agent's
// placements not yet in a report.
int64_t QueueLength(const CloudCandidate& cloud);

}  // namespace tophat
