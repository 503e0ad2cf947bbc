#include "device_agent/link_estimator.h"

#include "device_agent/link_emulator.h"

#include <algorithm>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

namespace tophat {
namespace {

// A FIFO link of `bandwidth` with `latency`: a message that enters it at `entered` starts
// crossing once the one before has finished, and arrives `latency` after it has crossed.
std::vector<double> Arrivals(const std::vector<double>& entered, const std::vector<double>& bytes,
                             double bandwidth, double latency) {
  std::vector<double> arrived;
  double link_free = 0;
  for (size_t i = 0; i < entered.size(); ++i) {
    link_free = std::max(link_free, entered[i]) + bytes[i] / bandwidth;
    arrived.push_back(link_free + latency);
  }
  return arrived;
}

struct Sends {
  std::vector<double> sent;
  std::vector<double> bytes;
};

// `count` messages of random sizes in [2 KB, max_bytes), sent `spacing` seconds apart.
Sends RandomSends(int count, double spacing, double max_bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> size(2e3, max_bytes);
  Sends sends;
  for (int i = 0; i < count; ++i) {
    sends.sent.push_back(spacing * i);
    sends.bytes.push_back(size(rng));
  }
  return sends;
}

// Bursts of `per_burst` messages of `bytes`, all sent at once (one engine step's results, a
// prompt's chunks), `period` seconds apart: a run per burst on a link slower than that.
Sends Bursts(int bursts, int per_burst, double bytes, double period) {
  Sends sends;
  for (int b = 0; b < bursts; ++b) {
    for (int i = 0; i < per_burst; ++i) {
      sends.sent.push_back(period * b);
      sends.bytes.push_back(bytes);
    }
  }
  return sends;
}

TEST_CASE("Dispersion finds the bandwidth from runs of queued messages and ignores idle gaps",
          "[link]") {
  // Back to back (busy link): every arrival gap is exactly bytes over bandwidth. The
  // receiver's clock is 1000 s off the sender's: only gaps on one clock are used.
  const auto [sent, bytes] = RandomSends(40, 0.0001, 3e4, 5);
  DispersionEstimator busy;
  const std::vector<double> busy_arrivals = Arrivals(sent, bytes, 2e6, 0.01);
  // Reported a little out of order, as results of different sessions come back.
  for (int i = 0; i + 1 < 40; i += 2) {
    busy.Observe(sent[i + 1], 1000 + busy_arrivals[i + 1], bytes[i + 1]);
    busy.Observe(sent[i], 1000 + busy_arrivals[i], bytes[i]);
  }
  CHECK(busy.bytes_per_second() == Approx(2e6).epsilon(1e-6));
  // Every message but the first queued; a run can only start a pair whose later message is
  // not much smaller than the earlier one, so a few are not counted.
  CHECK(busy.queued_messages() > 30);

  // Far apart (idle link): nothing waited, so there is nothing to measure, and nothing is
  // made up.
  DispersionEstimator idle;
  std::vector<double> spaced;
  for (int i = 0; i < 40; ++i) spaced.push_back(0.1 * i);
  const std::vector<double> idle_arrivals = Arrivals(spaced, bytes, 2e6, 0.01);
  for (int i = 0; i < 40; ++i) idle.Observe(spaced[i], idle_arrivals[i], bytes[i]);
  CHECK(idle.bytes_per_second() == 0);
  CHECK(idle.queued_messages() == 0);
  CHECK(idle.samples() == 40);

  // Decoding alone afterwards (small, spaced messages) queues nothing and leaves the
  // estimate as the bursts made it.
  for (int i = 0; i < 100; ++i) busy.Observe(10 + 0.05 * i, 1010.02 + 0.05 * i, 800);
  CHECK(busy.bytes_per_second() == Approx(2e6).epsilon(1e-6));

  // Mostly idle, some bursts: the bursts give the rate.
  DispersionEstimator mixed;
  std::vector<double> mixed_sent;
  for (int i = 0; i < 40; ++i) mixed_sent.push_back(0.05 * (i / 4) + 0.0001 * (i % 4));
  const std::vector<double> mixed_arrivals = Arrivals(mixed_sent, bytes, 5e5, 0.02);
  for (int i = 0; i < 40; ++i) mixed.Observe(mixed_sent[i], mixed_arrivals[i], bytes[i]);
  CHECK(mixed.bytes_per_second() == Approx(5e5).epsilon(1e-6));
}

TEST_CASE("Dispersion says unknown until three messages queued", "[link]") {
  // Pairs: a run of two is one queued message.
  const Sends pairs = Bursts(3, 2, 1e4, 1.0);
  const std::vector<double> arrived = Arrivals(pairs.sent, pairs.bytes, 1e6, 0.005);
  DispersionEstimator link;
  CHECK(link.bytes_per_second() == 0);
  for (size_t i = 0; i < 4; ++i) link.Observe(pairs.sent[i], arrived[i], pairs.bytes[i]);
  CHECK(link.queued_messages() == 2);
  CHECK(link.bytes_per_second() == 0);
  for (size_t i = 4; i < 6; ++i) link.Observe(pairs.sent[i], arrived[i], pairs.bytes[i]);
  CHECK(link.queued_messages() == 3);
  CHECK(link.bytes_per_second() == Approx(1e6).epsilon(1e-6));
  // Nonsense is ignored.
  link.Observe(1, 2, -5);
  link.Observe(1, NAN, 100);
  CHECK(link.samples() == 6);
}

TEST_CASE("An idle pair whose later message is much smaller is not taken for a queued one",
          "[link]") {
  // 30 KB then 2 KB, 20 ms apart on a 2 MB/s link: the big one takes 15 ms and is done
  // before the small one leaves. Their arrival gap (20 ms + 1 ms - 15 ms = 6 ms) over the
  // small one's bytes would read 0.33 MB/s, and at that rate the big one would still have
  // been crossing when the small one was sent. The small one's size rules the pair out.
  Sends sends;
  for (int i = 0; i < 30; ++i) {
    sends.sent.push_back(0.02 * i);
    sends.bytes.push_back(i % 2 == 0 ? 3e4 : 2e3);
  }
  const std::vector<double> arrived = Arrivals(sends.sent, sends.bytes, 2e6, 0.01);
  DispersionEstimator link;
  for (size_t i = 0; i < arrived.size(); ++i) link.Observe(sends.sent[i], arrived[i], sends.bytes[i]);
  CHECK(link.bytes_per_second() == 0);
}

TEST_CASE("Decode rounds a few milliseconds late at the receiver do not pass for queued pairs",
          "[link]") {
  // What the serving test's agent saw (tests/serving_test.cc, "An agent measures its emulated
  // link"): decode rounds of 895 to 4,099 bytes sent about 30 ms apart on a 0.5 MB/s link,
  // each crossing in 2-8 ms, so the link rests between them, and the cloud stamping each
  // arrival up to 5 ms late. A pair of 1,729 then 895 bytes read with a 36 ms gap reads as
  // 25 KB/s, at which rate the 1,729 bytes would have been crossing for 70 ms: sent 33 ms
  // apart, they passed for queued, and two such runs took a 0.50 MB/s estimate to 0.48.
  const double rate = 5e5;
  const std::vector<double> sizes = {895, 1729, 895, 4099, 1729, 895, 2497, 895};
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> spacing(0.026, 0.045);
  std::uniform_real_distribution<double> lateness(0, 0.005);
  Sends sends;
  double t = 0;
  for (int i = 0; i < 400; ++i) {
    sends.sent.push_back(t);
    sends.bytes.push_back(sizes[static_cast<size_t>(i) % sizes.size()]);
    t += spacing(rng);
  }
  const std::vector<double> arrived = Arrivals(sends.sent, sends.bytes, rate, 0.01);
  DispersionEstimator link;
  for (size_t i = 0; i < arrived.size(); ++i) {
    link.Observe(sends.sent[i], arrived[i] + lateness(rng), sends.bytes[i]);
  }
  CHECK(link.queued_messages() == 0);
  CHECK(link.bytes_per_second() == 0);
}

TEST_CASE("Runs keep the error of late reads to their lateness over the run's span",
          "[link]") {
  // Bursts of 8 results of 49 KB (64 positions of the toy model) on a 12 MB/s downlink: a
  // run spans 7 × 4.1 ms = 28.7 ms. The receiver stamps each arrival up to 1 ms late (a
  // loaded core), so a run's span is off by at most 1 ms: 3.5%.
  const double rate = 12e6;
  const double late = 0.001;
  const Sends sends = Bursts(30, 8, 49152, 0.1);
  const std::vector<double> arrived = Arrivals(sends.sent, sends.bytes, rate, 0.01);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> lateness(0, late);
  DispersionEstimator link;
  for (size_t i = 0; i < arrived.size(); ++i) {
    link.Observe(sends.sent[i], arrived[i] + lateness(rng), sends.bytes[i]);
  }
  const double span = 7 * 49152 / rate;
  INFO("estimated " << link.bytes_per_second() << " for " << rate);
  CHECK(link.bytes_per_second() > rate / (1 + late / span));
  CHECK(link.bytes_per_second() < rate / (1 - late / span));
  CHECK(link.queued_messages() > 150);  // late reads broke few runs
}

TEST_CASE("A sender stamp taken before the message entered the link does not count its idle "
          "time as transmission",
          "[link]") {
  // Every burst's results are stamped at the step's end, but the third one enters the link
  // 20 ms later (the receiving thread was descheduled): the link rests before it. The run
  // ends at the rest; what follows starts a new one.
  const double rate = 6e6;
  Sends sends = Bursts(20, 6, 24576, 0.2);
  std::vector<double> entered = sends.sent;
  for (size_t i = 2; i < entered.size(); i += 6) entered[i] += 0.02;
  const std::vector<double> arrived = Arrivals(entered, sends.bytes, rate, 0.01);
  DispersionEstimator link;
  for (size_t i = 0; i < arrived.size(); ++i) link.Observe(sends.sent[i], arrived[i], sends.bytes[i]);
  CHECK(link.bytes_per_second() == Approx(rate).epsilon(1e-6));

  // Bytes over the whole burst's span would count the rest: 5 × 4.1 ms of transmission in
  // 32 ms, 3.8 MB/s.
  const double whole_burst = 5 * 24576 / (arrived[5] - arrived[0]);
  CHECK(whole_burst < 0.7 * rate);
}

TEST_CASE("The link estimator measures each direction on its own and says unknown without "
          "evidence",
          "[link]") {
  const double up = 3e6;
  const double down = 12e6;
  LinkEstimator link;
  CHECK(link.uplink_bytes_per_second() == 0);
  CHECK(link.downlink_bytes_per_second() == 0);
  // A prompt's chunks (24 KB) queue on the uplink, 8.2 ms each. Each result leaves 1 ms after
  // its chunk arrived and crosses the downlink in 2 ms, so the downlink rests between them:
  // the results' arrival gaps show the uplink's rate, not the downlink's.
  const Sends chunks = Bursts(1, 40, 24576, 1.0);
  const std::vector<double> at_cloud = Arrivals(chunks.sent, chunks.bytes, up, 0.005);
  std::vector<double> results_sent;
  for (double t : at_cloud) results_sent.push_back(t + 0.001);
  const std::vector<double> results_at = Arrivals(results_sent, chunks.bytes, down, 0.005);
  for (size_t i = 0; i < chunks.bytes.size(); ++i) {
    link.ObserveUplink(chunks.sent[i], 100 + at_cloud[i], chunks.bytes[i]);
    link.ObserveDownlink(100 + results_sent[i], results_at[i], chunks.bytes[i]);
  }
  CHECK(link.uplink_bytes_per_second() == Approx(up).epsilon(1e-6));
  // Unknown, not the uplink's rate, a symmetric rate, or a remainder of a round trip.
  CHECK(link.downlink_bytes_per_second() == 0);
  CHECK(link.downlink().samples() == 40);

  // Results that leave together (one engine step, or the pieces of a split chunk) queue on
  // the downlink.
  const Sends results = Bursts(4, 4, 49152, 0.1);
  const std::vector<double> at_agent = Arrivals(results.sent, results.bytes, 9e6, 0.005);
  for (size_t i = 0; i < at_agent.size(); ++i) {
    link.ObserveDownlink(200 + results.sent[i], 50 + at_agent[i], results.bytes[i]);
  }
  CHECK(link.downlink_bytes_per_second() == Approx(9e6).epsilon(1e-6));
  CHECK(link.uplink_bytes_per_second() == Approx(up).epsilon(1e-6));
}

TEST_CASE("Counting what messages occupy on the link keeps small messages from looking slow",
          "[link]") {
  // What a message adds on a TCP link: ~100 bytes, and 66 more per 1,448-byte segment.
  CHECK(OnWireBytes(0) == 5 + 31 + 66);
  CHECK(OnWireBytes(220) == 220 + 5 + 31 + 66);
  CHECK(OnWireBytes(1448 - 36) == 1448 + 66);      // exactly one segment
  CHECK(OnWireBytes(1448 - 35) == 1449 + 2 * 66);  // one byte into the next
  CHECK(OnWireBytes(16384 - 5) == 16384 + 31 + 12 * 66);
  CHECK(OnWireBytes(16384 - 4) == 16385 + 2 * 31 + 12 * 66);

  // A link of 600 KB/s carrying runs of small decode messages (int8: one to four positions
  // of a 192-wide model, ~220-800 bytes) between runs of prompt chunks (16 positions, ~3 KB).
  std::vector<double> sent;
  std::vector<size_t> message_bytes;
  for (int burst = 0; burst < 30; ++burst) {
    const bool prompt = burst % 3 == 0;
    for (int i = 0; i < 6; ++i) {
      sent.push_back(0.1 * burst);
      message_bytes.push_back(prompt ? 16 * 196 + 30 : static_cast<size_t>(1 + i % 4) * 196 + 30);
    }
  }
  std::vector<double> on_wire;
  for (size_t bytes : message_bytes) on_wire.push_back(static_cast<double>(OnWireBytes(bytes)));
  const std::vector<double> arrived = Arrivals(sent, on_wire, 6e5, 0.01);
  DispersionEstimator framed, unframed;
  for (size_t i = 0; i < sent.size(); ++i) {
    framed.Observe(sent[i], arrived[i], on_wire[i]);
    unframed.Observe(sent[i], arrived[i], static_cast<double>(message_bytes[i]));
  }
  CHECK(framed.bytes_per_second() == Approx(6e5).epsilon(1e-6));
  // Counting the protobuf bytes alone, the same link looks about a tenth slower (the decode
  // messages' runs alone, about a sixth: 2,502 of their 3,012 queued bytes are counted).
  INFO("unframed estimate " << unframed.bytes_per_second());
  CHECK(unframed.bytes_per_second() < 0.93 * 6e5);
}

}  // namespace
}  // namespace tophat
