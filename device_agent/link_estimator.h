// What the agent learns about its link to the cloud from real transfers (HAT's β_i,up and
// β_i,down, DESIGN.md "State monitor"), from two kinds of evidence:
//   - Round trips. Every chunk's round trip, minus the queue and compute time the cloud
//     reports with its result, is network time: a fixed latency plus the bytes over the
//     bandwidth. Hidden states are the same size both ways, so a weighted least-squares line
//     through (payload bytes, network seconds), with older samples fading, gives the
//     round-trip cost per byte, 1/β_up + 1/β_down, and the latency; not the split.
//   - Dispersion (packet pairs). A link delivers in order, so when a message waited behind
//     the one before it, the gap between their arrivals is its bytes over the bandwidth. It
//     waited exactly when it was sent before the earlier one, at that rate, would have
//     finished crossing. Each gap is measured on one clock (the sender's, the receiver's),
//     so no clock sync is needed: the agent's send and
//     the cloud's receive times for the uplink (ForwardResult.received_at_seconds), the
//     cloud's send and the agent's receive times for the downlink. The estimate is the
//     bytes over the time of the queued pairs together, older pairs fading.
// The direction the workload keeps busy (the uplink, during prompt uploads) gets its rate
// from dispersion; the other from its own queued pairs, or else from the round-trip cost
// minus the first. Pure arithmetic; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

namespace tophat {

// Bandwidth of one direction from the arrival times of the messages that crossed it.
class DispersionEstimator {
 public:
  // A message of `bytes` sent at `sent_seconds` (the sender's clock) arrived at
  // `arrival_seconds` (the receiver's clock). Late reports are placed in arrival order.
  void Observe(double sent_seconds, double arrival_seconds, double bytes);
  // Bytes over arrival time of the queued pairs, older pairs fading; 0 with fewer than
  // three such pairs.
  double bytes_per_second() const;
  int64_t samples() const { return samples_seen_; }

  static constexpr size_t kWindow = 16;

 private:
  struct Message {
    double sent = 0;
    double arrived = 0;
    double bytes = 0;
  };
  struct Pair {
    bool queued = false;
    double bytes = 0;
    double seconds = 0;
  };
  static Pair Queued(const Message& earlier, const Message& later);

  std::deque<Message> messages_;  // the last kWindow, sorted by arrival
  double settled_bytes_ = 0;      // faded sums over the queued pairs that left the window
  double settled_seconds_ = 0;
  int64_t settled_pairs_ = 0;
  int64_t samples_seen_ = 0;
};

class LinkEstimator {
 public:
  // `forgetting` in (0, 1]: each new sample multiplies the weight of the old ones by it.
  explicit LinkEstimator(double forgetting = 0.98);

  // One round trip: `bytes_each_way` of hidden states went up and came back down, and the
  // network (not the cloud) took `network_seconds`. Non-positive or non-finite samples are
  // ignored.
  void Observe(double bytes_each_way, double network_seconds);

  // Bytes per second each way, assuming equal rates; 0 until the samples differ enough in
  // size to separate bandwidth from latency (or if they show no cost per byte).
  double symmetric_bytes_per_second() const;

  // Messages for dispersion: a chunk (sent by the agent, received by the cloud) and a result
  // (sent by the cloud, received by the agent); times on the sender's and receiver's clocks.
  void ObserveUplink(double sent, double arrived, double bytes) {
    uplink_.Observe(sent, arrived, bytes);
  }
  void ObserveDownlink(double sent, double arrived, double bytes) {
    downlink_.Observe(sent, arrived, bytes);
  }
  // Per direction, combining both kinds of evidence; 0 while unknown.
  double uplink_bytes_per_second() const;
  double downlink_bytes_per_second() const;
  // The one-way latency; 0 while unknown.
  double one_way_latency_seconds() const;
  int64_t samples() const { return samples_; }

 private:
  // Slope and intercept of network seconds against round-trip bytes; false if unknown.
  bool Fit(double* slope, double* intercept) const;

  // The rates of both directions from the round-trip cost and what dispersion says.
  void Directions(double* up, double* down) const;

  DispersionEstimator uplink_;
  DispersionEstimator downlink_;
  double forgetting_;
  double weight_ = 0, sum_x_ = 0, sum_y_ = 0, sum_xx_ = 0, sum_xy_ = 0;
  int64_t samples_ = 0;
};

}  // namespace tophat
