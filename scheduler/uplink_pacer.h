// When the agent may put its next prompt chunk on the uplink: pacing by the cloud's receipts
// (ChunkReceived, Hello.acknowledges_chunks).
//
// A prompt of a thousand positions is a megabyte on a link of about a megabyte a second. Sent
// all at once it sits in the socket and the link, and a decode round of another request sent
// meanwhile waits behind all of it: measured before this existed, decode chunks spent 150-270
// ms on links with a ~30 ms floor on CNN/DM-like prompts (docs/benchmarks.md), nearly all of
// it on the uplink. So prompt chunks ("bulk") wait here while the link already carries enough
// of them, and decode rounds, truncates and control messages go straight past.
//
// "Enough" is the bulk the cloud has not yet acknowledged, and the rule is:
//   - nothing unacknowledged: the next chunk goes (the link is idle, or about to be);
//   - at most kMaxUnacknowledged chunks unacknowledged (a hard bound, whatever the estimate);
//   - the uplink's bandwidth unknown: the second goes at once, so that it queues behind the
//     first and the link estimator (link_estimator.h) sees a run to measure;
//   - known: the next goes `lead_s` before the chunks in flight should have crossed, by that
//     bandwidth. It then waits behind at most lead_s of the one before, and the link does not
//     idle while the receipt comes back. An estimate that is too low costs at most the
//     receipt's trip per chunk (the receipt releases the next one); one that is too high sends
//     the second chunk early, bounded by kMaxUnacknowledged.
// Estimating the link alone, without receipts, is what an earlier version did: its estimates
// were off by up to 4x and it idled its own link.
//
// Pure logic on the caller's clock; not thread-safe (the agent's CloudConnection's sender owns
// one; `tophat simulate` gives each simulated device one, on simulated time).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

namespace tophat {

class UplinkPacer {
 public:
  using Clock = std::chrono::steady_clock;

  explicit UplinkPacer(double lead_s) : lead_(std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(lead_s))) {}

  // Whether a bulk message may go now, given the uplink's measured bytes per second (0:
  // unknown).
  bool MayRelease(Clock::time_point now, double bytes_per_second) const;
  // When MayRelease turns true without a receipt, or nullopt when only a receipt can do it.
  std::optional<Clock::time_point> ReleaseAt(double bytes_per_second) const;

  // A bulk message of `bytes` (on the wire) went onto the link at `now`.
  void Released(uint64_t session_id, uint64_t sequence_number, size_t bytes,
                Clock::time_point now, double bytes_per_second);
  // The cloud read that message (and, the stream being in order, every one before it).
  // Unknown receipts (a stream's before a Reset) are ignored.
  void Acknowledged(uint64_t session_id, uint64_t sequence_number, Clock::time_point now);
  // The stream is gone: nothing is in flight any more.
  void Reset();

  size_t unacknowledged() const { return in_flight_.size(); }
  size_t unacknowledged_bytes() const { return in_flight_bytes_; }

  static constexpr size_t kMaxUnacknowledged = 2;

 private:
  struct InFlight {
    uint64_t session_id = 0;
    uint64_t sequence_number = 0;
    size_t bytes = 0;
  };
  const Clock::duration lead_;
  std::deque<InFlight> in_flight_;  // in the order they went
  size_t in_flight_bytes_ = 0;
  // When the bulk in flight should have crossed the link, by the estimate at release.
  Clock::time_point drained_at_{};
};

}  // namespace tophat
