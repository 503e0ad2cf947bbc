#include "scheduler/uplink_pacer.h"

#include <algorithm>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

namespace tophat {
namespace {

using Clock = UplinkPacer::Clock;

Clock::time_point At(double seconds) {
  return Clock::time_point(
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds + 1000)));
}

double SecondsOf(Clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count() - 1000;
}

TEST_CASE("UplinkPacer: one chunk goes at once, the next as the first drains") {
  UplinkPacer pacer(/*lead_s=*/0.02);
  const double bandwidth = 1e6;
  CHECK(pacer.MayRelease(At(0), bandwidth));
  pacer.Released(1, 1, 100'000, At(0), bandwidth);  // crosses in 0.1 s
  CHECK_FALSE(pacer.MayRelease(At(0.05), bandwidth));
  REQUIRE(pacer.ReleaseAt(bandwidth).has_value());
  CHECK(SecondsOf(*pacer.ReleaseAt(bandwidth)) == Approx(0.08).margin(1e-6));
  CHECK(pacer.MayRelease(At(0.081), bandwidth));
  pacer.Released(1, 2, 100'000, At(0.081), bandwidth);
  // Two unacknowledged: nothing more, whatever the clock says.
  CHECK_FALSE(pacer.MayRelease(At(10), bandwidth));
  CHECK_FALSE(pacer.ReleaseAt(bandwidth).has_value());
  CHECK(pacer.unacknowledged() == 2);
  CHECK(pacer.unacknowledged_bytes() == 200'000);
}

TEST_CASE("UplinkPacer: a receipt covers its chunk and those before it") {
  UplinkPacer pacer(0.02);
  pacer.Released(1, 1, 1000, At(0), 0);
  pacer.Released(2, 7, 2000, At(0), 0);
  CHECK_FALSE(pacer.MayRelease(At(0), 0));
  pacer.Acknowledged(9, 9, At(0.01));  // not one of ours (an older stream's): ignored
  CHECK(pacer.unacknowledged() == 2);
  pacer.Acknowledged(2, 7, At(0.01));
  CHECK(pacer.unacknowledged() == 0);
  CHECK(pacer.unacknowledged_bytes() == 0);
  CHECK(pacer.MayRelease(At(0.01), 0));
}

TEST_CASE("UplinkPacer: an unknown bandwidth sends pairs, so the estimator sees runs") {
  UplinkPacer pacer(0.02);
  pacer.Released(1, 1, 1000, At(0), 0);
  CHECK(pacer.MayRelease(At(0), 0));  // the second queues behind the first
  pacer.Released(1, 2, 1000, At(0), 0);
  CHECK_FALSE(pacer.MayRelease(At(0), 0));
  pacer.Acknowledged(1, 1, At(0.01));
  CHECK(pacer.MayRelease(At(0.01), 0));
  pacer.Reset();
  CHECK(pacer.unacknowledged() == 0);
  CHECK(pacer.MayRelease(At(0.01), 1e6));
}

// A FIFO uplink of `bandwidth` and `delay` each way, an idle downlink (receipts take `delay`),
// a prompt of `chunks` chunks of `chunk_bytes` handed over at t = 0 and one decode message
// handed over at `decode_at`. The pacer believes the uplink runs at `estimate`.
struct Outcome {
  double prompt_arrived = 0;  // the last chunk's arrival at the cloud
  double decode_wait = 0;     // the decode message's arrival less its handing over and delay
};

Outcome Simulate(bool paced, double bandwidth, double estimate, double delay, int chunks,
                 double chunk_bytes, double decode_at, double lead_s) {
  UplinkPacer pacer(lead_s);
  double link_free = 0;
  const auto enter = [&](double t, double bytes) {
    link_free = std::max(link_free, t) + bytes / bandwidth;
    return link_free + delay;
  };
  Outcome outcome;
  std::vector<std::pair<double, int>> receipts;  // (time at the agent, sequence number)
  int next_chunk = 0;
  bool decode_sent = false;
  double t = 0;
  while (next_chunk < chunks || !decode_sent) {
    // Receipts that have come back by now.
    std::sort(receipts.begin(), receipts.end());
    while (!receipts.empty() && receipts.front().first <= t) {
      pacer.Acknowledged(1, receipts.front().second, At(t));
      receipts.erase(receipts.begin());
    }
    // The decode message goes past any held chunk.
    if (!decode_sent && t >= decode_at) {
      outcome.decode_wait = enter(t, 300) - t - delay;
      decode_sent = true;
    }
    while (next_chunk < chunks && (!paced || pacer.MayRelease(At(t), estimate))) {
      const double arrived = enter(t, chunk_bytes);
      outcome.prompt_arrived = arrived;
      pacer.Released(1, next_chunk, static_cast<size_t>(chunk_bytes), At(t), estimate);
      receipts.push_back({arrived + delay, next_chunk});
      ++next_chunk;
    }
    double next = std::numeric_limits<double>::infinity();
    if (!decode_sent) next = decode_at;
    if (!receipts.empty()) {
      next = std::min(next, std::min_element(receipts.begin(), receipts.end())->first);
    }
    if (auto at = pacer.ReleaseAt(estimate); at && next_chunk < chunks) {
      next = std::min(next, std::max(t, SecondsOf(*at)));
    }
    REQUIRE(next < std::numeric_limits<double>::infinity());  // never stuck
    t = std::max(t, next);
  }
  return outcome;
}

TEST_CASE("UplinkPacer: a decode round waits behind about one chunk, and the prompt is no later") {
  // A 1,000-position float32 prompt of dim 256 in 8 chunks on a 1 MB/s link, 10 ms each way;
  // a decode round handed over 0.3 s in.
  const double bandwidth = 1e6, delay = 0.01, chunk = 128'000, decode_at = 0.3;
  const Outcome unpaced = Simulate(false, bandwidth, bandwidth, delay, 8, chunk, decode_at, 0.02);
  const Outcome paced = Simulate(true, bandwidth, bandwidth, delay, 8, chunk, decode_at, 0.02);
  // Unpaced, it waits for the rest of the prompt: 1.024 s of it less 0.3 s.
  CHECK(unpaced.decode_wait == Approx(8 * chunk / bandwidth - decode_at + 300 / bandwidth));
  // Paced, for the rest of the chunk crossing (and at most lead_s of the next) and itself.
  CHECK(paced.decode_wait <= (chunk + 300) / bandwidth + 0.02 + 1e-6);
  // The link never idles: the prompt arrives when it would have (plus the decode's 300 B).
  CHECK(paced.prompt_arrived <= unpaced.prompt_arrived + 300 / bandwidth + 1e-6);
}

TEST_CASE("UplinkPacer: a wrong estimate costs a little, never a stall") {
  const double bandwidth = 1e6, delay = 0.01, chunk = 128'000, decode_at = 0.3;
  const Outcome unpaced = Simulate(false, bandwidth, bandwidth, delay, 8, chunk, decode_at, 0.02);
  // Too slow by 2x: each chunk goes on its receipt; the link rests one round trip per chunk.
  const Outcome slow = Simulate(true, bandwidth, bandwidth / 2, delay, 8, chunk, decode_at, 0.02);
  CHECK(slow.prompt_arrived <= unpaced.prompt_arrived + 8 * 2 * delay + 1e-3);
  CHECK(slow.decode_wait <= (chunk + 300) / bandwidth + 1e-6);
  // Too fast by 2x: never more than two chunks ahead of a decode round.
  const Outcome fast = Simulate(true, bandwidth, bandwidth * 2, delay, 8, chunk, decode_at, 0.02);
  CHECK(fast.decode_wait <= (2 * chunk + 300) / bandwidth + 1e-6);
  CHECK(fast.prompt_arrived <= unpaced.prompt_arrived + 300 / bandwidth + 1e-6);
  // Unknown: pairs.
  const Outcome unknown = Simulate(true, bandwidth, 0, delay, 8, chunk, decode_at, 0.02);
  CHECK(unknown.decode_wait <= (2 * chunk + 300) / bandwidth + 1e-6);
}

}  // namespace
}  // namespace tophat
