#include "scheduler/uplink_pacer.h"

#include <algorithm>

namespace tophat {

bool UplinkPacer::MayRelease(Clock::time_point now, double bytes_per_second) const {
  if (in_flight_.empty()) return true;
  if (in_flight_.size() >= kMaxUnacknowledged) return false;
  if (bytes_per_second <= 0) return true;  // a pair, for the link estimator's runs
  return now >= drained_at_ - lead_;
}

std::optional<UplinkPacer::Clock::time_point> UplinkPacer::ReleaseAt(
    double bytes_per_second) const {
  if (in_flight_.empty() || bytes_per_second <= 0) return std::nullopt;
  if (in_flight_.size() >= kMaxUnacknowledged) return std::nullopt;
  return drained_at_ - lead_;
}

void UplinkPacer::Released(uint64_t session_id, uint64_t sequence_number, size_t bytes,
                           Clock::time_point now, double bytes_per_second) {
  in_flight_.push_back({session_id, sequence_number, bytes});
  in_flight_bytes_ += bytes;
  const Clock::time_point start = std::max(drained_at_, now);
  drained_at_ = bytes_per_second > 0
                    ? start + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(bytes / bytes_per_second))
                    : start;
}

void UplinkPacer::Acknowledged(uint64_t session_id, uint64_t sequence_number,
                               Clock::time_point now) {
  const auto it = std::find_if(in_flight_.begin(), in_flight_.end(), [&](const InFlight& m) {
    return m.session_id == session_id && m.sequence_number == sequence_number;
  });
  if (it == in_flight_.end()) return;
  // The stream is in order: whatever went before this one has been read too.
  for (auto m = in_flight_.begin(); m != it + 1; ++m) in_flight_bytes_ -= m->bytes;
  in_flight_.erase(in_flight_.begin(), it + 1);
  // Nothing in flight: the next chunk's crossing starts when it goes, whatever an estimate
  // that was too slow still had the link busy with.
  if (in_flight_.empty()) drained_at_ = std::min(drained_at_, now);
}

void UplinkPacer::Reset() {
  in_flight_.clear();
  in_flight_bytes_ = 0;
  drained_at_ = {};
}

}  // namespace tophat
