#include "device_agent/chunk_tracker.h"

#include "base/clock.h"

namespace tophat {
namespace {

// The link estimator compares stamps on one clock at a time; steady_clock's epoch is as good
// as any.
double SecondsSinceEpoch(ChunkTracker::Clock::time_point t) {
  return Seconds(t.time_since_epoch());
}

}  // namespace

ChunkTracker::ChunkTracker(LinkSampleSink& link, Clock::time_point arrival, bool trace)
    : link_(link), arrival_(arrival), trace_enabled_(trace) {}

void ChunkTracker::Sent(const Chunk& chunk) {
  const Clock::time_point now = Clock::now();
  int trace_index = -1;
  if (trace_enabled_ && chunk.phase == v1::PHASE_PREFILL) {
    v1::ChunkTrace* trace = trace_.Add();
    trace->set_first_position(static_cast<uint32_t>(chunk.first_position));
    trace->set_positions(static_cast<uint32_t>(chunk.positions));
    trace->set_device_seconds(chunk.device_seconds);
    trace->set_sent_at(Seconds(now - arrival_));
    trace_index = trace_.size() - 1;
  }
  in_flight_.push_back({.sequence_number = chunk.sequence_number,
                        .epoch = chunk.epoch,
                        .positions = chunk.positions,
                        .wire_bytes = chunk.wire_bytes,
                        .phase = chunk.phase,
                        .sent = now,
                        .sent_stamp = chunk.sent_stamp,
                        .trace_index = trace_index});
  if (in_flight_.size() > kMaxInFlight) in_flight_.pop_front();
}

std::optional<double> ChunkTracker::Answered(const v1::ForwardResult& result, uint64_t epoch,
                                             Clock::time_point received, size_t wire_bytes) {
  if (result.sent_at_seconds() > 0) {
    link_.ObserveResult(result.sent_at_seconds(), SecondsSinceEpoch(received),
                        static_cast<double>(wire_bytes));
  }
  if (!result.chunk_done()) return std::nullopt;
  // Results come in sequence order, so anything older was answered or will never be.
  while (!in_flight_.empty() && in_flight_.front().sequence_number < result.sequence_number()) {
    in_flight_.pop_front();
  }
  if (in_flight_.empty() || in_flight_.front().sequence_number != result.sequence_number()) {
    return std::nullopt;
  }
  InFlight sent = in_flight_.front();
  in_flight_.pop_front();
  if (sent.epoch != epoch) return std::nullopt;
  if (sent.sent_stamp != nullptr) {
    const int64_t ticks = sent.sent_stamp->load();
    if (ticks > 0) sent.sent = Clock::time_point(Clock::duration(ticks));
  }
  // Every piece of a split chunk carries the chunk's arrival; one sample per chunk.
  if (result.received_at_seconds() > 0) {
    link_.ObserveChunk(SecondsSinceEpoch(sent.sent), result.received_at_seconds(),
                       static_cast<double>(sent.wire_bytes));
  }
  // Answered in one piece: the round trip is this chunk's alone.
  if (static_cast<int64_t>(result.states().num_positions()) != sent.positions) return std::nullopt;
  const double network_seconds =
      Seconds(received - sent.sent) - result.queue_seconds() - result.compute_seconds();
  if (sent.trace_index >= 0) {
    v1::ChunkTrace* trace = trace_.Mutable(sent.trace_index);
    trace->set_sent_at(Seconds(sent.sent - arrival_));
    trace->set_result_at(Seconds(received - arrival_));
    trace->set_cloud_queue_seconds(result.queue_seconds());
    trace->set_cloud_compute_seconds(result.compute_seconds());
    trace->set_network_seconds(network_seconds);
  }
  if (sent.phase != v1::PHASE_DECODE) return std::nullopt;
  return network_seconds;
}

}  // namespace tophat
