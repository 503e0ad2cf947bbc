// The chunks a request has sent and the cloud has not yet answered, and what their answers
// teach: link samples for the agent's LinkEstimator (link_estimator.h) and, with
// GenerateRequest.trace, the per-chunk trace (RequestStats.chunks).
//
// Each result is a downlink sample (the cloud's send stamp, this clock's arrival). The result
// that completes a chunk is that chunk's uplink sample (this clock's send time, the cloud's
// receive stamp), once per chunk however many pieces the cloud split it into, and only on the
// stream the chunk went out on: a replayed chunk's old send time says nothing about the new
// stream.
//
// Not thread-safe: one request thread owns a tracker.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

#include "device_agent/sent_stamp.h"
#include "tophat/v1/agent.pb.h"
#include "tophat/v1/cloud.pb.h"

namespace tophat {

// Where link samples go: the agent's LinkEstimator, behind the agent's lock.
class LinkSampleSink {
 public:
  // A chunk of `bytes` left at `sent_seconds` (this clock) and reached the cloud at
  // `cloud_received_at` (the cloud's clock): the uplink's dispersion.
  virtual void ObserveChunk(double sent_seconds, double cloud_received_at, double bytes) = 0;
  // A result of `bytes`, sent by the cloud at `cloud_sent_at` (its clock) and received here
  // at `received_seconds` (this clock): the downlink's dispersion.
  virtual void ObserveResult(double cloud_sent_at, double received_seconds, double bytes) = 0;

 protected:
  ~LinkSampleSink() = default;
};

class ChunkTracker {
 public:
  using Clock = std::chrono::steady_clock;

  // `link` outlives the tracker. Trace times are seconds since `arrival` (the request's).
  // `trace`: GenerateRequest.trace.
  ChunkTracker(LinkSampleSink& link, Clock::time_point arrival, bool trace);

  // One ForwardChunk message, as it goes on the wire.
  struct Chunk {
    uint64_t sequence_number = 0;
    uint64_t epoch = 0;  // the stream it goes out on
    int64_t first_position = 0;
    int64_t positions = 0;
    size_t bytes = 0;       // the packed hidden states
    size_t wire_bytes = 0;  // what the whole message occupies on the link (OnWireBytes)
    v1::Phase phase = v1::PHASE_PREFILL;
    // The input submodel's time on it: a prompt chunk's first message carries it, the rest 0.
    double device_seconds = 0;
    // Set by the connection when the chunk goes onto the link (it may wait for the uplink
    // pacer); null or 0: it went when Sent() was called.
    SentStamp sent_stamp;
  };
  // `chunk` is being sent now. The trace covers prefill messages (the prompt's, and a
  // replay's), not decode rounds, which have their own trace (RequestStats.rounds).
  void Sent(const Chunk& chunk);

  // `result` arrived at `received` on stream `epoch`: feeds the link samples and fills the
  // answered chunk's trace.
  // `wire_bytes`: what the CloudMessage that carried it occupied on the link (OnWireBytes).
  // Returns the network seconds (round trip less the cloud's queue and compute) of a decode
  // chunk answered in one piece, nothing otherwise.
  std::optional<double> Answered(const v1::ForwardResult& result, uint64_t epoch,
                                 Clock::time_point received, size_t wire_bytes);

  const google::protobuf::RepeatedPtrField<v1::ChunkTrace>& trace() const { return trace_; }

  // At most this many unanswered chunks are kept, the oldest dropped first: memory stays
  // bounded whatever the cloud answers.
  static constexpr size_t kMaxInFlight = 256;

 private:
  struct InFlight {
    uint64_t sequence_number = 0;
    uint64_t epoch = 0;
    int64_t positions = 0;
    size_t wire_bytes = 0;
    v1::Phase phase = v1::PHASE_PREFILL;
    Clock::time_point sent;
    SentStamp sent_stamp;
    int trace_index = -1;  // into trace_; -1 when not traced
  };

  LinkSampleSink& link_;
  const Clock::time_point arrival_;
  const bool trace_enabled_;
  std::deque<InFlight> in_flight_;  // oldest first
  google::protobuf::RepeatedPtrField<v1::ChunkTrace> trace_;
};

}  // namespace tophat
