// What the agent learns about its link to the cloud from real transfers (HAT's β_i,up and
// β_i,down, DESIGN.md "State monitor"), each direction measured on its own, by dispersion.
//
// A link delivers in order. A message sent while the one before it is still crossing waits
// behind it, and then arrives exactly its own bytes over the bandwidth after it. A *run* is a
// message followed by messages that each queued behind the one before: across a run the link
// never rested, so the bytes after the first message over the time from the first arrival to
// the last is the bandwidth. A receiver that reads one message late stretches one gap and
// shrinks the next; the run's span only moves by the lateness of its two ends, so the error
// of a run is at most that lateness over its span, and longer runs are better evidence.
//
// Each gap is taken on one clock, so no clock sync is needed: for the uplink the agent's
// send times and the cloud's receive times (ForwardResult.received_at_seconds), for the
// downlink the cloud's send times (ForwardResult.sent_at_seconds: the results of an engine
// step, or the pieces of a chunk split over steps, leave back to back) and the agent's
// receive times.
//
// A direction whose messages never queue has no runs, and its rate is unknown (0). Nothing is
// derived from the other direction or from round trips: a round trip's cost cannot be split
// between the directions, and a remainder of it is not a measurement.
// Pure arithmetic; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

namespace tophat {

// Bandwidth of one direction from the runs of queued messages that crossed it.
class DispersionEstimator {
 public:
  // A message of `bytes` sent at `sent_seconds` (the sender's clock) arrived at
  // `arrival_seconds` (the receiver's clock). Late reports are put back in arrival order
  // (up to kWindow messages late; later ones are dropped).
  void Observe(double sent_seconds, double arrival_seconds, double bytes);

  // Bytes over seconds of the runs, older runs fading; 0 (unknown) until the runs hold
  // kMinQueued queued messages.
  double bytes_per_second() const;
  // Queued messages seen (the evidence behind bytes_per_second), and messages observed.
  int64_t queued_messages() const;
  int64_t samples() const { return samples_; }

  static constexpr size_t kWindow = 16;
  static constexpr int64_t kMinQueued = 3;

 private:
  struct Message {
    double sent = 0;
    double arrived = 0;
    double bytes = 0;
  };
  struct Run {
    Message first;
    Message last;
    double bytes = 0;         // every message's, the first's included: what kept the link busy
    double queued_bytes = 0;  // the messages after the first
    int64_t queued = 0;
    double span() const { return last.arrived - first.arrived; }
  };
  struct Evidence {
    double bytes = 0;    // faded sums over the closed runs
    double seconds = 0;
    int64_t queued = 0;  // not faded
  };
  // Judges `m`, the next message by arrival: it extends `run` if it queued behind it, else
  // `run` is closed into `evidence` and a new one starts at `m`.
  static void Judge(const Message& m, Run& run, Evidence& evidence);
  static void Close(const Run& run, Evidence& evidence);
  // The runs so far with the pending messages judged and the open run closed.
  Evidence Current() const;

  std::deque<Message> pending_;  // the last kWindow, sorted by arrival, not judged yet
  bool started_ = false;         // whether run_ holds a message
  Run run_;                      // the run the judged messages end with
  Evidence settled_;
  int64_t samples_ = 0;
};

// Both directions of the agent's link to the cloud.
class LinkEstimator {
 public:
  // A chunk (sent by the agent, received by the cloud) and a result (sent by the cloud,
  // received by the agent); times on the sender's and receiver's clocks.
  void ObserveUplink(double sent, double arrived, double bytes) {
    uplink_.Observe(sent, arrived, bytes);
  }
  void ObserveDownlink(double sent, double arrived, double bytes) {
    downlink_.Observe(sent, arrived, bytes);
  }
  // Bytes per second; 0 while that direction is unknown.
  double uplink_bytes_per_second() const { return uplink_.bytes_per_second(); }
  double downlink_bytes_per_second() const { return downlink_.bytes_per_second(); }
  const DispersionEstimator& uplink() const { return uplink_; }
  const DispersionEstimator& downlink() const { return downlink_; }

 private:
  DispersionEstimator uplink_;
  DispersionEstimator downlink_;
};

}  // namespace tophat
