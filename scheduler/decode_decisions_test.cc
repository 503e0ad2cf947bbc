#include "scheduler/decode_decisions.h"

#include <cmath>
#include <random>
#include <vector>

#include "scheduler/state_monitor.h"
#include "scheduler/step_time_predictor.h"

#include <catch2/catch.hpp>

namespace tophat {
namespace {

// A cloud whose step takes 4 ms + 0.05 ms per batched token.
StepTimePredictor AffineCloud(double fixed = 0.004, double per_token = 0.00005) {
  StepTimePredictor g(8192);
  for (int64_t tokens : {1, 3, 8, 20, 50, 120, 300, 700, 1500, 3000}) {
    g.Observe(tokens, fixed + per_token * static_cast<double>(tokens));
  }
  return g;
}

TEST_CASE("The step-time predictor converges on noisy synthetic step timings", "[scheduler]") {
  StepTimePredictor g(4096, 0.8);
  CHECK_FALSE(g.has_data());
  CHECK(g.Predict(100) == 0);
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> tokens(1, 2048);
  std::normal_distribution<double> noise(1.0, 0.05);
  auto truth = [](double x) { return 0.003 + 0.00002 * x; };
  for (int i = 0; i < 4000; ++i) {
    const int64_t x = tokens(rng);
    g.Observe(x, truth(static_cast<double>(x)) * noise(rng));
  }
  for (double x : {1.0, 8.0, 64.0, 256.0, 1000.0, 2048.0}) {
    INFO("tokens " << x << ": predicted " << g.Predict(x) << ", true " << truth(x));
    CHECK(std::abs(g.Predict(x) - truth(x)) / truth(x) < 0.08);
  }
  // The curve follows a change of machine speed (moving averages, alpha 0.8).
  for (int i = 0; i < 4000; ++i) {
    const int64_t x = tokens(rng);
    g.Observe(x, 2 * truth(static_cast<double>(x)));
  }
  CHECK(std::abs(g.Predict(500) - 2 * truth(500)) / (2 * truth(500)) < 0.05);
}

TEST_CASE("The step-time predictor is flat with one bucket and never decreasing",
          "[scheduler]") {
  StepTimePredictor g(1024);
  g.Observe(10, 0.01);
  CHECK(g.Predict(1) == Approx(0.01));
  CHECK(g.Predict(1000) == Approx(0.01));
  g.Observe(100, 0.005);  // noise: a bigger step measured faster
  CHECK(g.Predict(100) >= g.Predict(10));
  g.Observe(0, 1.0);      // ignored
  g.Observe(5, -1.0);     // ignored
  CHECK(g.observations() == 2);
}

TEST_CASE("The step-time predictor inverts: the most tokens a step may batch within a time",
          "[scheduler]") {
  StepTimePredictor g(1024);
  CHECK(g.MaxTokensWithin(1.0, 512) == 512);  // no data: every step is predicted free
  // g(mu) = 1 ms + 0.1 ms per token.
  for (int64_t tokens : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512}) {
    g.Observe(tokens, 1e-3 + 1e-4 * static_cast<double>(tokens));
  }
  CHECK(g.MaxTokensWithin(2.15e-3, 512) == 11);  // 1 + 0.1 * 11 = 2.1 ms; 12 take 2.2
  CHECK(g.MaxTokensWithin(1.0, 512) == 512);
  CHECK(g.MaxTokensWithin(0.5e-3, 512) == 0);
  CHECK(g.MaxTokensWithin(1.0, 0) == 0);
}

TEST_CASE("The state monitor keeps moving averages of load and of each device", "[scheduler]") {
  StateMonitor monitor(1024, 0.8);
  monitor.ObserveStep(100, 0.01);
  CHECK(monitor.mean_batched_tokens() == 100);
  monitor.ObserveStep(200, 0.02);
  CHECK(monitor.mean_batched_tokens() == Approx(0.8 * 100 + 0.2 * 200));
  CHECK_FALSE(monitor.device(3).has_value());
  monitor.ObserveDevice(3, {.uplink_bytes_per_second = 5e6, .draft_step_seconds = 0.02});
  monitor.ObserveDevice(3, {.uplink_bytes_per_second = 10e6, .downlink_bytes_per_second = 12e6});
  const DeviceEstimate d = *monitor.device(3);
  CHECK(d.uplink_bytes_per_second == Approx(0.8 * 5e6 + 0.2 * 10e6));
  CHECK(d.downlink_bytes_per_second == 12e6);  // first measurement taken as is
  CHECK(d.draft_step_seconds == 0.02);         // an unmeasured report leaves it
  monitor.ForgetDevice(3);
  CHECK_FALSE(monitor.device(3).has_value());
}

TEST_CASE("The chunk size balances upload against cloud compute", "[scheduler]") {
  const StepTimePredictor g = AffineCloud();
  const double bytes_per_token = 8192;  // Vicuna-7B at fp16
  // Falls as the uplink slows.
  std::vector<int64_t> by_bandwidth;
  for (double uplink : {40e6, 20e6, 10e6, 5e6, 2e6}) {
    ChunkSizeInputs in{.prompt_tokens = 4000, .bytes_per_token = bytes_per_token,
                       .uplink_bytes_per_second = uplink, .mean_batched_tokens = 64,
                       .min_chunk = 8, .max_chunk = 2048};
    const int64_t x = ChooseChunkSize(in, g);
    by_bandwidth.push_back(x);
    // At the solution the upload of X just covers the cloud's share of the overlap.
    const double upload = static_cast<double>(x) * bytes_per_token / uplink;
    const double compute = g.Predict(64) + g.Predict(64 + static_cast<double>(x));
    INFO("uplink " << uplink << ": chunk " << x);
    if (x > 8 && x < 2048) {
      CHECK(upload >= compute);
      CHECK(static_cast<double>(x - 1) * bytes_per_token / uplink <
            g.Predict(64) + g.Predict(64 + static_cast<double>(x - 1)));
    }
  }
  for (size_t i = 1; i < by_bandwidth.size(); ++i) CHECK(by_bandwidth[i] < by_bandwidth[i - 1]);

  // Under a step-time cap the chunk falls as the cloud's load rises (a fast link, where the
  // balance alone would take the largest chunk).
  std::vector<int64_t> by_load;
  for (double mu : {16.0, 128.0, 256.0, 400.0}) {
    ChunkSizeInputs in{.prompt_tokens = 4000, .bytes_per_token = bytes_per_token,
                       .uplink_bytes_per_second = 400e6, .mean_batched_tokens = mu,
                       .min_chunk = 8, .max_chunk = 2048, .max_step_seconds = 0.030};
    by_load.push_back(ChooseChunkSize(in, g));
    CHECK(g.Predict(mu + static_cast<double>(by_load.back())) <= 0.030 + 1e-12);
  }
  for (size_t i = 1; i < by_load.size(); ++i) CHECK(by_load[i] < by_load[i - 1]);

  // More pipeline stages share the compute: smaller chunks suffice.
  ChunkSizeInputs one{.prompt_tokens = 4000, .bytes_per_token = bytes_per_token,
                      .uplink_bytes_per_second = 10e6, .mean_batched_tokens = 64,
                      .pipeline_stages = 1, .min_chunk = 8, .max_chunk = 2048};
  ChunkSizeInputs four = one;
  four.pipeline_stages = 4;
  CHECK(ChooseChunkSize(four, g) < ChooseChunkSize(one, g));
}

TEST_CASE("With a model per pipeline stage, the chunk balances against the slowest stage",
          "[scheduler]") {
  // The whole pipeline takes 4 ms + 0.05 ms per token; split evenly over two stages the beat
  // is half of that. Split unevenly (stage 1 three times stage 0's time), the beat is stage
  // 1's: 3 ms + 0.0375 ms per token, and the upload has longer to run: a larger chunk.
  const StepTimePredictor g = AffineCloud();
  const std::vector<StepTimePredictor> even = {AffineCloud(0.002, 0.000025),
                                               AffineCloud(0.002, 0.000025)};
  const std::vector<StepTimePredictor> uneven = {AffineCloud(0.001, 0.0000125),
                                                 AffineCloud(0.003, 0.0000375)};
  ChunkSizeInputs in{.prompt_tokens = 4000, .bytes_per_token = 8192,
                     .uplink_bytes_per_second = 10e6, .mean_batched_tokens = 64,
                     .pipeline_stages = 2, .min_chunk = 8, .max_chunk = 2048};
  const int64_t by_g = ChooseChunkSize(in, g);
  in.stage_step_times = even;
  CHECK(ChooseChunkSize(in, g) == by_g);  // even stages: the same as g / P
  in.stage_step_times = uneven;
  const int64_t by_slowest = ChooseChunkSize(in, g);
  CHECK(by_slowest > by_g);
  // At the solution the upload just covers the slowest stage's two steps.
  const double upload = static_cast<double>(by_slowest) * 8192 / 10e6;
  CHECK(upload >= uneven[1].Predict(64) + uneven[1].Predict(64 + static_cast<double>(by_slowest)));
  CHECK(static_cast<double>(by_slowest - 1) * 8192 / 10e6 <
        uneven[1].Predict(64) + uneven[1].Predict(64 + static_cast<double>(by_slowest - 1)));
  // Until every stage has timings, g / P stands.
  const std::vector<StepTimePredictor> partial = {AffineCloud(0.001, 0.0000125),
                                                  StepTimePredictor(8192)};
  in.stage_step_times = partial;
  CHECK(ChooseChunkSize(in, g) == by_g);

  // The state monitor keeps the per-stage models the engine feeds.
  StateMonitor monitor(1024, 0.8, /*pipeline_stages=*/2);
  REQUIRE(monitor.stage_step_times().size() == 2);
  monitor.ObserveStageStep(1, 100, 0.03);
  monitor.ObserveStageStep(5, 100, 0.03);  // no such stage: ignored
  CHECK_FALSE(monitor.stage_step_times()[0].has_data());
  CHECK(monitor.stage_step_times()[1].Predict(100) == Approx(0.03));
  CHECK(StateMonitor(1024, 0.8).stage_step_times().empty());
}

TEST_CASE("Short prompts and unknown links are not chunked", "[scheduler]") {
  const StepTimePredictor g = AffineCloud();
  ChunkSizeInputs in{.prompt_tokens = 12, .bytes_per_token = 8192, .uplink_bytes_per_second = 1e6,
                     .mean_batched_tokens = 64, .min_chunk = 16, .max_chunk = 512};
  CHECK(ChooseChunkSize(in, g) == 12);
  in.prompt_tokens = 300;
  in.uplink_bytes_per_second = 0;  // not measured yet
  CHECK(ChooseChunkSize(in, g) == 300);
  in.prompt_tokens = 3000;
  CHECK(ChooseChunkSize(in, g) == 512);
  in.uplink_bytes_per_second = 1e6;
  CHECK(ChooseChunkSize(in, StepTimePredictor()) == 512);  // no step timings yet
}

TEST_CASE("Parallel-drafting steps follow HAT's equation 6", "[scheduler]") {
  struct Row {
    double draft_tokens, uplink, downlink, step, gamma;
    int64_t expected;
  };
  const double a = 8192;
  const std::vector<Row> rows = {
      // (3·8192/5e6 + 0.030 + 3·8192/10e6) / 0.010 = (4.9152 + 30 + 2.4576) ms / 10 ms = 3.7
      {3, 5e6, 10e6, 0.030, 0.010, 3},
      {3, 5e6, 10e6, 0.030, 0.005, 7},
      {3, 5e6, 10e6, 0.030, 0.002, 8},   // clamped to max_steps
      {3, 50e6, 100e6, 0.004, 0.010, 0}, // the trip is shorter than one draft step
      {6, 2e6, 4e6, 0.030, 0.020, 3},    // (24.576 + 30 + 12.288) / 20 = 3.3
      {3, 5e6, 10e6, 0.030, 0, 0},       // drafting speed unknown
  };
  for (const Row& r : rows) {
    INFO("mu_i " << r.draft_tokens << " up " << r.uplink << " down " << r.downlink << " g "
                 << r.step << " gamma " << r.gamma);
    CHECK(ParallelDraftSteps({.draft_tokens = r.draft_tokens, .bytes_per_token = a,
                              .uplink_bytes_per_second = r.uplink,
                              .downlink_bytes_per_second = r.downlink, .step_seconds = r.step,
                              .draft_step_seconds = r.gamma, .max_steps = 8}) == r.expected);
  }
}

TEST_CASE("A device's control uses its measurements only where they are known, else the "
          "configured defaults",
          "[scheduler]") {
  // g(μ) = 4 ms + 0.05 ms per token, μ = 64: g(64) = 7.2 ms. A = 8192 bytes per position.
  const StepTimePredictor g = AffineCloud();
  const DeviceControlOptions options{.default_prompt_chunk = 128, .default_draft_steps = 2,
                                     .min_chunk = 16, .max_chunk = 1024, .max_draft_steps = 8};
  // X at 40 MB/s up: X·0.2048 ms ≥ g(64) + g(64 + X) = 14.4 ms + 0.05 ms·X, so X ≥ 93.02: 94.
  // λ at 40 MB/s up, 10 MB/s down, μ_i = 3, γ = 2 ms:
  //   (3·8192/40e6 + 7.2 ms + 3·8192/10e6) / 2 ms = (0.6144 + 7.2 + 2.4576) / 2 = 5.1: 5.
  const double nan = std::nan("");
  struct Row {
    const char* what;
    double up, down, gamma, mu_i;
    bool step_timings;
    DeviceControl expected;
  };
  const std::vector<Row> rows = {
      {"nothing measured", 0, 0, 0, 0, true, {128, false, 2, false}},
      {"uplink only", 40e6, 0, 0, 0, true, {94, true, 2, false}},
      // The issue-11 case: a drafter and an uplink, no downlink evidence. λ needs the
      // downlink, so it stays the default rather than use a made-up rate.
      {"downlink unknown", 40e6, 0, 0.002, 3, true, {94, true, 2, false}},
      {"drafter speed unknown", 40e6, 10e6, 0, 3, true, {94, true, 2, false}},
      {"round length unknown", 40e6, 10e6, 0.002, 0, true, {94, true, 2, false}},
      {"uplink unknown", 0, 10e6, 0.002, 3, true, {128, false, 2, false}},
      {"not a number is unknown", nan, 10e6, 0.002, 3, true, {128, false, 2, false}},
      {"everything known", 40e6, 10e6, 0.002, 3, true, {94, true, 5, true}},
      {"no step timings yet", 40e6, 10e6, 0.002, 3, false, {128, false, 2, false}},
  };
  for (const Row& r : rows) {
    INFO(r.what);
    const DeviceEstimate device{.uplink_bytes_per_second = r.up,
                                .downlink_bytes_per_second = r.down,
                                .draft_step_seconds = r.gamma,
                                .draft_tokens_per_round = r.mu_i};
    const DeviceControl got = DecideDeviceControl(device, 8192, 64,
                                                  r.step_timings ? g : StepTimePredictor(), options);
    CHECK(got.prompt_chunk_size == r.expected.prompt_chunk_size);
    CHECK(got.chunk_size_measured == r.expected.chunk_size_measured);
    CHECK(got.draft_steps == r.expected.draft_steps);
    CHECK(got.draft_steps_measured == r.expected.draft_steps_measured);
  }
  // Two pipeline stages work on two micro-batches at once, so the upload need only cover
  // half of the two steps: X·0.2048 ms ≥ (14.4 ms + 0.05 ms·X) / 2, X ≥ 40.04: 41.
  DeviceControlOptions piped = options;
  piped.pipeline_stages = 2;
  CHECK(DecideDeviceControl({.uplink_bytes_per_second = 40e6}, 8192, 64, g, piped)
            .prompt_chunk_size == 41);
}

TEST_CASE("The wire dtype is the widest whose upload keeps up with the cloud, else the narrowest",
          "[scheduler]") {
  // g(μ) = 4 ms + 0.05 ms per token, μ = 64, X_max = 1024: the cloud spends
  // g(64) + g(1088) = 7.2 + 58.4 = 65.6 ms on the two steps a largest chunk's upload overlaps.
  // A hidden size of 2048: float32 8192, float16 4096, int8 2048 + 4 bytes per position. A
  // largest chunk keeps up at 1024·A / 65.6 ms: float32 from 127.88 MB/s, float16 from
  // 63.94 MB/s, int8 from 32.03 MB/s.
  const StepTimePredictor g = AffineCloud();
  const std::vector<double> wires = {8192, 4096, 2052};
  const auto choose = [&](double uplink, int64_t stages = 1) {
    return ChooseWireDtype({.bytes_per_position = wires, .uplink_bytes_per_second = uplink,
                            .mean_batched_tokens = 64, .max_chunk = 1024,
                            .pipeline_stages = stages},
                           g);
  };
  CHECK(choose(1e9) == 0);
  CHECK(choose(128e6) == 0);
  CHECK(choose(127.7e6) == 1);
  CHECK(choose(64e6) == 1);
  CHECK(choose(63.8e6) == 2);
  CHECK(choose(32.1e6) == 2);
  CHECK(choose(1e6) == 2);  // nothing keeps up: the narrowest
  // Two pipeline stages give the upload half the time: float32 now needs twice the rate.
  CHECK(choose(128e6, 2) == 1);
  CHECK(choose(256e6, 2) == 0);
  // Nothing to go on, or nothing to choose from.
  CHECK(choose(0) == -1);
  CHECK(choose(std::nan("")) == -1);
  CHECK(ChooseWireDtype({.bytes_per_position = wires, .uplink_bytes_per_second = 1e9},
                        StepTimePredictor()) == -1);
  CHECK(ChooseWireDtype({.uplink_bytes_per_second = 1e9}, g) == -1);

  // In a device's control: the narrowest until the uplink is measured, then the choice.
  const DeviceControlOptions options{.max_chunk = 1024, .wire_bytes_per_position = wires};
  const DeviceControl unmeasured = DecideDeviceControl({}, 8192, 64, g, options);
  CHECK(unmeasured.wire_dtype == 2);
  CHECK_FALSE(unmeasured.wire_dtype_measured);
  const DeviceControl fast =
      DecideDeviceControl({.uplink_bytes_per_second = 200e6}, 8192, 64, g, options);
  CHECK(fast.wire_dtype == 0);
  CHECK(fast.wire_dtype_measured);
  CHECK(DecideDeviceControl({.uplink_bytes_per_second = 200e6}, 8192, 64, StepTimePredictor(),
                            options)
            .wire_dtype_measured == false);
  CHECK(DecideDeviceControl({.uplink_bytes_per_second = 200e6}, 8192, 64, g, {}).wire_dtype == -1);
}

TEST_CASE("The adaptive draft window clamps and smooths its prediction", "[scheduler]") {
  AdaptiveDraftWindow window({.min_window = 1, .max_window = 12, .smoothing = 0.4});
  const DraftWindowSignals good{.acceptance_rate = 0.9, .rtt_seconds = 0.040,
                                .target_step_seconds = 0.010, .draft_step_seconds = 0.002};
  const auto best = window.Predict(good);
  CHECK(best.window == 12);  // cheap drafts, long trips, good acceptance: as long as allowed
  CHECK(best.speedup > 3);
  CHECK(window.Update(good) == 12);

  // Poor acceptance wants a short window; smoothing moves there over several rounds.
  const DraftWindowSignals poor{.acceptance_rate = 0.3, .rtt_seconds = 0.040,
                                .target_step_seconds = 0.010, .draft_step_seconds = 0.010};
  const double target = window.Predict(poor).window;
  CHECK(target <= 2);
  const int64_t first = window.Update(poor);
  CHECK(first < 12);
  CHECK(first > target);  // 0.4 · target + 0.6 · 12: not there in one step
  int64_t last = first;
  for (int i = 0; i < 20; ++i) last = window.Update(poor);
  CHECK(last == std::llround(target));
  CHECK(window.smoothed() == Approx(target).margin(0.01));
}

TEST_CASE("The adaptive draft window stops drafting only after sustained loss, and resumes",
          "[scheduler]") {
  AdaptiveDraftWindow window({.hysteresis_steps = 2, .min_gain = 1.05});
  const DraftWindowSignals loss{.acceptance_rate = 0.05, .rtt_seconds = 0.002,
                                .target_step_seconds = 0.002, .draft_step_seconds = 0.020};
  CHECK(window.Predict(loss).speedup < 1.0);
  const DraftWindowSignals gain{.acceptance_rate = 0.8, .rtt_seconds = 0.030,
                                .target_step_seconds = 0.010, .draft_step_seconds = 0.002};
  CHECK(window.Update(gain) > 0);
  CHECK(window.Update(loss) > 0);  // one bad round: sticky
  CHECK(window.Update(loss) == 0); // two in a row: no drafting
  CHECK(window.Update(loss) == 0);
  CHECK(window.Update(gain) > 0);  // a gain again: drafting resumes at once
  // A queued cloud lengthens each verification, which makes drafting worth more per trip.
  DraftWindowSignals queued = gain;
  queued.queue_utilization = 1.0;
  CHECK(window.Predict(queued).speedup > window.Predict(gain).speedup);
}

}  // namespace
}  // namespace tophat
