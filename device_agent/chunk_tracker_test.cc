#include "device_agent/chunk_tracker.h"

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace tophat {
namespace {

using Clock = ChunkTracker::Clock;

struct Sample {
  double sent = 0;
  double arrived = 0;
  double bytes = 0;
};

struct RecordingSink : LinkSampleSink {
  void ObserveChunk(double sent_seconds, double cloud_received_at, double bytes) override {
    uplink.push_back({sent_seconds, cloud_received_at, bytes});
  }
  void ObserveResult(double cloud_sent_at, double received_seconds, double bytes) override {
    downlink.push_back({cloud_sent_at, received_seconds, bytes});
  }
  std::vector<Sample> uplink;
  std::vector<Sample> downlink;
};

ChunkTracker::Chunk Prefill(uint64_t sequence_number, uint64_t epoch, int64_t first,
                            int64_t positions) {
  return {.sequence_number = sequence_number,
          .epoch = epoch,
          .first_position = first,
          .positions = positions,
          .bytes = static_cast<size_t>(positions) * 100,
          .wire_bytes = static_cast<size_t>(positions) * 100 + 150,
          .phase = v1::PHASE_PREFILL,
          .device_seconds = 0.25};
}

// A result piece for `sequence_number`: `positions` of it, `bytes` on the wire, the chunk's
// arrival at the cloud and the piece's departure stamped on the cloud's clock.
v1::ForwardResult Piece(uint64_t sequence_number, uint32_t positions, size_t bytes, bool done) {
  v1::ForwardResult result;
  result.set_sequence_number(sequence_number);
  result.set_chunk_done(done);
  result.mutable_states()->set_num_positions(positions);
  result.mutable_states()->set_data(std::string(bytes, '\0'));
  result.set_received_at_seconds(100.0);
  result.set_sent_at_seconds(100.5);
  result.set_queue_seconds(0.01);
  result.set_compute_seconds(0.02);
  return result;
}

TEST_CASE("A chunk split over results gives one uplink sample and every result a downlink one") {
  RecordingSink sink;
  ChunkTracker tracker(sink, Clock::now(), /*trace=*/false);
  tracker.Sent(Prefill(1, /*epoch=*/1, 0, 8));
  tracker.Answered(Piece(1, 4, 400, /*done=*/false), 1, Clock::now(), 520);
  CHECK(sink.uplink.empty());  // the chunk is not done yet
  tracker.Answered(Piece(1, 4, 400, /*done=*/true), 1, Clock::now(), 520);
  REQUIRE(sink.uplink.size() == 1);
  CHECK(sink.uplink[0].arrived == 100.0);
  CHECK(sink.uplink[0].bytes == 950);  // the chunk's wire bytes, not the piece's
  REQUIRE(sink.downlink.size() == 2);
  CHECK(sink.downlink[1].sent == 100.5);
  CHECK(sink.downlink[1].bytes == 520);  // the message's wire bytes
}

TEST_CASE("A chunk answered on a newer stream than it left on gives no uplink sample") {
  RecordingSink sink;
  ChunkTracker tracker(sink, Clock::now(), /*trace=*/false);
  tracker.Sent(Prefill(1, /*epoch=*/1, 0, 4));
  tracker.Sent(Prefill(2, /*epoch=*/1, 4, 4));
  // Negative control: on its own stream the first one counts.
  tracker.Answered(Piece(1, 4, 400, true), /*epoch=*/1, Clock::now(), 520);
  CHECK(sink.uplink.size() == 1);
  tracker.Answered(Piece(2, 4, 400, true), /*epoch=*/2, Clock::now(), 520);
  CHECK(sink.uplink.size() == 1);
  CHECK(sink.downlink.size() == 2);  // the result itself did cross the new stream
}

TEST_CASE("The trace covers prefill chunks and times those answered in one piece") {
  RecordingSink sink;
  const Clock::time_point arrival = Clock::now() - std::chrono::seconds(1);
  ChunkTracker tracker(sink, arrival, /*trace=*/true);
  tracker.Sent(Prefill(1, 1, 0, 4));
  tracker.Sent(Prefill(2, 1, 4, 8));
  ChunkTracker::Chunk decode = Prefill(3, 1, 12, 3);
  decode.phase = v1::PHASE_DECODE;
  tracker.Sent(decode);
  REQUIRE(tracker.trace().size() == 2);  // decode rounds have their own trace
  CHECK(tracker.trace().Get(0).device_seconds() == 0.25);
  CHECK(tracker.trace().Get(1).first_position() == 4);
  CHECK(tracker.trace().Get(0).sent_at() >= 1.0);

  tracker.Answered(Piece(1, 4, 400, true), 1, Clock::now(), 520);
  CHECK(tracker.trace().Get(0).result_at() >= tracker.trace().Get(0).sent_at());
  CHECK(tracker.trace().Get(0).cloud_compute_seconds() == 0.02);
  // Chunk 2 ends in a piece of 3 of its 8 positions: its round trip is not its alone.
  tracker.Answered(Piece(2, 3, 300, true), 1, Clock::now(), 420);
  CHECK(tracker.trace().Get(1).result_at() == 0);
}

TEST_CASE("A decode chunk answered in one piece reports its time on the links") {
  RecordingSink sink;
  ChunkTracker tracker(sink, Clock::now(), /*trace=*/false);
  const Clock::time_point sent = Clock::now();
  tracker.Sent(Prefill(1, 1, 0, 4));
  ChunkTracker::Chunk decode = Prefill(2, 1, 4, 3);
  decode.phase = v1::PHASE_DECODE;
  tracker.Sent(decode);
  ChunkTracker::Chunk split = Prefill(3, 1, 7, 5);
  split.phase = v1::PHASE_DECODE;
  tracker.Sent(split);
  // A prompt chunk's time is in its trace, not here.
  CHECK_FALSE(tracker.Answered(Piece(1, 4, 400, true), 1, Clock::now(), 520).has_value());
  // Round trip (at least 0.2 s: answered 0.2 s after it was sent) less queue 0.01 and
  // compute 0.02.
  const Clock::time_point answered = Clock::now() + std::chrono::milliseconds(200);
  const std::optional<double> network = tracker.Answered(Piece(2, 3, 300, true), 1, answered, 420);
  REQUIRE(network.has_value());
  const double round_trip = std::chrono::duration<double>(answered - sent).count();
  CHECK(*network <= round_trip - 0.03 + 1e-9);
  CHECK(*network >= 0.2 - 0.03 - 1e-9);
  // Not answered in one piece: its round trip is not its own.
  CHECK_FALSE(tracker.Answered(Piece(3, 2, 200, true), 1, answered, 320).has_value());
}

}  // namespace
}  // namespace tophat
