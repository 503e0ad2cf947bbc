#include "device_agent/link_estimator.h"

#include <algorithm>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

namespace tophat {
namespace {

TEST_CASE("The link estimator separates bandwidth from latency", "[link]") {
  struct Row {
    double bandwidth, latency;
  };
  for (const Row& row : {Row{5e6, 0.010}, Row{20e6, 0.002}, Row{1e9, 0.0001}}) {
    INFO("bandwidth " << row.bandwidth << " latency " << row.latency);
    LinkEstimator link;
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> bytes(1e3, 2e5);
    std::normal_distribution<double> jitter(0, 0.02 * row.latency);
    for (int i = 0; i < 200; ++i) {
      const double b = bytes(rng);
      link.Observe(b, 2 * row.latency + 2 * b / row.bandwidth + jitter(rng));
    }
    CHECK(link.symmetric_bytes_per_second() == Approx(row.bandwidth).epsilon(0.1));
    CHECK(link.one_way_latency_seconds() == Approx(row.latency).epsilon(0.1));
  }
}

TEST_CASE("The link estimator says nothing until sizes differ", "[link]") {
  LinkEstimator link;
  CHECK(link.symmetric_bytes_per_second() == 0);
  for (int i = 0; i < 20; ++i) link.Observe(1000, 0.01);
  CHECK(link.symmetric_bytes_per_second() == 0);  // one size: latency and bandwidth mix
  link.Observe(-5, 0.01);
  link.Observe(1000, -1);
  CHECK(link.samples() == 20);
  // A slow link followed by a fast one: old samples fade.
  LinkEstimator moving(0.9);
  for (int i = 0; i < 100; ++i) moving.Observe(1000.0 * (1 + i % 10), 0.002 + 2 * 1000.0 * (1 + i % 10) / 1e6);
  for (int i = 0; i < 100; ++i) moving.Observe(1000.0 * (1 + i % 10), 0.002 + 2 * 1000.0 * (1 + i % 10) / 1e7);
  CHECK(moving.symmetric_bytes_per_second() == Approx(1e7).epsilon(0.05));
}

// A FIFO link of `bandwidth` with `latency`: messages sent at `sent` arrive in order, each
// after the previous one has finished crossing.
std::vector<double> Arrivals(const std::vector<double>& sent, const std::vector<double>& bytes,
                             double bandwidth, double latency) {
  std::vector<double> arrived;
  double link_free = 0;
  for (size_t i = 0; i < sent.size(); ++i) {
    link_free = std::max(link_free, sent[i]) + bytes[i] / bandwidth;
    arrived.push_back(link_free + latency);
  }
  return arrived;
}

// `count` messages of random sizes in [2 KB, max_bytes), sent `spacing` seconds apart.
struct Sends {
  std::vector<double> sent;
  std::vector<double> bytes;
};
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

TEST_CASE("Dispersion finds the bandwidth from queued pairs and ignores idle gaps", "[link]") {
  // Back to back (busy link): every arrival gap is exactly bytes over bandwidth. The
  // receiver's clock is 1000 s off the sender's: only gaps matter.
  const auto [sent, bytes] = RandomSends(40, 0.0001, 3e4, 5);
  DispersionEstimator busy;
  const std::vector<double> busy_arrivals = Arrivals(sent, bytes, 2e6, 0.01);
  // Reported a little out of order, as results of different sessions come back.
  for (int i = 0; i + 1 < 40; i += 2) {
    busy.Observe(sent[i + 1], 1000 + busy_arrivals[i + 1], bytes[i + 1]);
    busy.Observe(sent[i], 1000 + busy_arrivals[i], bytes[i]);
  }
  CHECK(busy.bytes_per_second() == Approx(2e6).epsilon(0.02));

  // Far apart (idle link): no message waited, so there is nothing to measure.
  DispersionEstimator idle;
  std::vector<double> spaced;
  for (int i = 0; i < 40; ++i) spaced.push_back(0.1 * i);
  const std::vector<double> idle_arrivals = Arrivals(spaced, bytes, 2e6, 0.01);
  for (int i = 0; i < 40; ++i) idle.Observe(spaced[i], idle_arrivals[i], bytes[i]);
  CHECK(idle.bytes_per_second() == 0);

  // Decoding alone afterwards (small, spaced messages) queues nothing and leaves the
  // estimate as the bursts made it.
  for (int i = 0; i < 100; ++i) busy.Observe(10 + 0.05 * i, 1010.02 + 0.05 * i, 800);
  CHECK(busy.bytes_per_second() == Approx(2e6).epsilon(0.02));

  // Mostly idle, some bursts: the bursts give the rate.
  DispersionEstimator mixed;
  std::vector<double> mixed_sent;
  for (int i = 0; i < 40; ++i) mixed_sent.push_back(0.05 * (i / 4) + 0.0001 * (i % 4));
  const std::vector<double> mixed_arrivals = Arrivals(mixed_sent, bytes, 5e5, 0.02);
  for (int i = 0; i < 40; ++i) mixed.Observe(mixed_sent[i], mixed_arrivals[i], bytes[i]);
  CHECK(mixed.bytes_per_second() == Approx(5e5).epsilon(0.02));
}

TEST_CASE("The link estimator splits the round-trip cost into uplink and downlink", "[link]") {
  const double up = 3e6;
  const double down = 12e6;
  LinkEstimator link;
  const auto [sent, bytes] = RandomSends(60, 0.0005, 5e4, 7);
  // Uploads back to back: they queue on the uplink, whose rate the arrivals show.
  const std::vector<double> at_cloud = Arrivals(sent, bytes, up, 0.005);
  for (size_t i = 0; i < bytes.size(); ++i) {
    link.Observe(bytes[i], 0.01 + bytes[i] / up + bytes[i] / down);
    link.ObserveUplink(sent[i], 100 + at_cloud[i], bytes[i]);
  }
  // Without downlink pairs, the downlink is the rest of the round trip's cost.
  CHECK(link.uplink_bytes_per_second() == Approx(up).epsilon(0.03));
  CHECK(link.downlink_bytes_per_second() == Approx(down).epsilon(0.1));
  CHECK(link.symmetric_bytes_per_second() == Approx(2 / (1 / up + 1 / down)).epsilon(0.03));
  // Results sent together (one engine step) queue on the downlink.
  const std::vector<double> results_sent(8, 50.0);
  const std::vector<double> result_bytes(8, 4000.0);
  const std::vector<double> at_agent = Arrivals(results_sent, result_bytes, 9e6, 0.005);
  for (size_t i = 0; i < at_agent.size(); ++i) {
    link.ObserveDownlink(results_sent[i], at_agent[i] - 40, result_bytes[i]);
  }
  CHECK(link.downlink_bytes_per_second() == Approx(9e6).epsilon(0.02));

  // Round trips alone: both directions get the symmetric rate.
  LinkEstimator round_trips_only;
  for (size_t i = 0; i < bytes.size(); ++i) {
    round_trips_only.Observe(bytes[i], 0.01 + bytes[i] / up + bytes[i] / down);
  }
  CHECK(round_trips_only.uplink_bytes_per_second() ==
        Approx(round_trips_only.symmetric_bytes_per_second()));
  CHECK(round_trips_only.downlink_bytes_per_second() ==
        Approx(round_trips_only.symmetric_bytes_per_second()));
  CHECK(LinkEstimator().uplink_bytes_per_second() == 0);
}

}  // namespace
}  // namespace tophat
