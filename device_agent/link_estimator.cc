#include "device_agent/link_estimator.h"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace tophat {
namespace {
// Arrival gaps shorter than this are timer and scheduling noise, not transmission.
constexpr double kMinGapSeconds = 100e-6;
// A run's first pair has only its own gap for a rate. A late read of the later message
// stretches that gap and makes the rate look lower, so the later message must have been sent
// within this share of the earlier one's crossing time (counted at most as long as the later
// one's): an idle pair then passes only when its send gap is shorter than the lateness. An
// idle pair can also pass when the later message is much smaller (its own crossing does not
// cover the gap); with the same share of the earlier message's size required, it cannot.
constexpr double kPairMargin = 0.5;
// Later messages are judged against the run's own rate (independent of their own arrival):
// sent before the run's bytes so far, at that rate, could have finished crossing (with this
// margin for the rate's error), and arrived within kIdleFactor of their own crossing time
// after the one before (else the link rested between them: the sender's stamp preceded the
// message's entry into the link).
constexpr double kRunMargin = 0.8;
constexpr double kIdleFactor = 2.0;
// Each queued message weighs the older evidence down by this: about the last 30 queued
// messages count, and they keep counting through phases with no queueing (decoding alone).
constexpr double kForgetting = 0.97;
}  // namespace

void DispersionEstimator::Judge(const Message& m, Run& run, Evidence& evidence) {
  const Message& previous = run.last;
  const double gap = m.arrived - previous.arrived;
  bool queued = false;
  if (run.queued > 0 && run.span() >= kMinGapSeconds) {
    const double rate = run.queued_bytes / run.span();
    queued = m.sent - run.first.sent < kRunMargin * run.bytes / rate &&
             gap <= kIdleFactor * m.bytes / rate;
  } else if (gap >= kMinGapSeconds && m.bytes > kPairMargin * previous.bytes) {
    // If m queued, this is the rate, and at it the earlier message was still crossing when
    // m was sent. Its crossing is counted no longer than m's own (the gap): an idle pair's
    // gap is its send gap plus the lateness, so with an earlier message twice m's size the
    // margin would be spent and any late read would pass.
    const double rate = m.bytes / gap;
    queued = m.sent - previous.sent < kPairMargin * std::min(previous.bytes, m.bytes) / rate;
  }
  if (queued) {
    run.last = m;
    run.bytes += m.bytes;
    run.queued_bytes += m.bytes;
    ++run.queued;
    return;
  }
  Close(run, evidence);
  run = Run{.first = m, .last = m, .bytes = m.bytes};
}

void DispersionEstimator::Close(const Run& run, Evidence& evidence) {
  if (run.queued == 0 || !(run.span() > 0)) return;
  const double fade = std::pow(kForgetting, static_cast<double>(run.queued));
  evidence.bytes = fade * evidence.bytes + run.queued_bytes;
  evidence.seconds = fade * evidence.seconds + run.span();
  evidence.queued += run.queued;
}

void DispersionEstimator::Observe(double sent_seconds, double arrival_seconds, double bytes) {
  if (!std::isfinite(sent_seconds) || !std::isfinite(arrival_seconds) || !(bytes > 0) ||
      !std::isfinite(bytes)) {
    return;
  }
  // Judged already past it: too late to place.
  if (started_ && arrival_seconds < run_.last.arrived) return;
  // Reports come late and out of order (results of different sessions), so messages wait in
  // a short window sorted by arrival and are judged when they leave it.
  auto at = pending_.end();
  while (at != pending_.begin() && std::prev(at)->arrived > arrival_seconds) --at;
  pending_.insert(at, {sent_seconds, arrival_seconds, bytes});
  ++samples_;
  while (pending_.size() > kWindow) {
    const Message m = pending_.front();
    pending_.pop_front();
    if (started_) {
      Judge(m, run_, settled_);
    } else {
      run_ = Run{.first = m, .last = m, .bytes = m.bytes};
      started_ = true;
    }
  }
}

DispersionEstimator::Evidence DispersionEstimator::Current() const {
  Evidence evidence = settled_;
  Run run = run_;
  bool started = started_;
  for (const Message& m : pending_) {
    if (started) {
      Judge(m, run, evidence);
    } else {
      run = Run{.first = m, .last = m, .bytes = m.bytes};
      started = true;
    }
  }
  if (started) Close(run, evidence);
  return evidence;
}

double DispersionEstimator::bytes_per_second() const {
  const Evidence evidence = Current();
  if (evidence.queued < kMinQueued || !(evidence.seconds > 0)) return 0;
  return evidence.bytes / evidence.seconds;
}

int64_t DispersionEstimator::queued_messages() const { return Current().queued; }

}  // namespace tophat
