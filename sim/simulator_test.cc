#include "sim/simulator.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "base/test_util.h"

namespace tophat::sim {
namespace {

// Seconds a message of `positions` hidden states (1 kB each, framing included) takes up a
// 1 MB/s link and down a 4 MB/s one: the analytic configuration's links.
double Up(int64_t positions) { return MessageWireBytes(positions, 1000) / 1e6; }
double Down(int64_t positions) { return MessageWireBytes(positions, 1000) / 4e6; }

// One device, one request at a time, a flat step time and steady links: every latency is a
// sum that can be written down.
SimConfig Analytic() {
  SimConfig c;
  c.devices = 1;
  c.clouds = 1;
  c.duration_s = 1;
  c.drain_limit_s = 1000;
  c.workload.prompts = "fixed:100";
  c.workload.output_tokens = 5;
  c.workload.requests_per_device_per_second = 1.0;  // the first arrives within the second
  c.cloud.step_time = {{1, 0.010}};                  // 10 ms whatever the batch
  c.cloud.max_batch_tokens = 512;
  c.device = {.input_seconds_per_token = 0.001,
              .input_decode_seconds = 0.002,
              .output_seconds_per_token = 0.0005,
              .output_decode_seconds = 0.003,
              .uplink_bytes_per_second = 1e6,
              .downlink_bytes_per_second = 4e6,
              .one_way_delay_s = 0.02};
  c.bytes_per_token = 1000;
  c.prompt_chunk = 100;  // the whole prompt in one chunk
  return c;
}

// The first seed whose run of `c` has exactly one arrival (with two, the second would queue
// behind the first and the sums below would not be one request's).
SimConfig WithOneArrival(SimConfig c) {
  for (c.seed = 1; c.seed < 100; ++c.seed) {
    auto r = Simulate(c);
    REQUIRE(r.ok());
    if (r->requests_arrived == 1) return c;
  }
  FAIL("no seed below 100 gives one arrival");
  return c;
}

TEST_CASE("One request's TTFT and TBT are the sums of its stages", "[sim]") {
  const SimConfig c = WithOneArrival(Analytic());
  auto r = Simulate(c);
  REQUIRE(r.ok());
  REQUIRE(r->requests_arrived == 1);
  REQUIRE(r->requests_finished == 1);
  // input 100 x 1 ms, up 100 kB at 1 MB/s (~105 ms framed) + 20 ms, one 10 ms step, down
  // 100 kB at 4 MB/s + 20 ms, output 100 x 0.5 ms.
  const double ttft = 0.100 + Up(100) + 0.020 + 0.010 + Down(100) + 0.020 + 0.050;
  CHECK(Up(100) == Approx(0.1048).epsilon(0.001));  // 5% framing on a 100 kB message
  // A decode token: input 2 ms, up 1 kB (~1.1 ms) + 20 ms, step 10 ms, down ~0.28 ms + 20
  // ms, output 3 ms.
  const double tbt = 0.002 + Up(1) + 0.020 + 0.010 + Down(1) + 0.020 + 0.003;
  // The histogram's percentiles are within 1% (its buckets are 1% wide).
  CHECK(r->ttft_s.p50 == Approx(ttft).epsilon(0.01));
  CHECK(r->tbt_s.p50 == Approx(tbt).epsilon(0.01));
  CHECK(r->tbt_s.mean == Approx(tbt).epsilon(1e-9));  // the mean is exact
  CHECK(r->e2e_s.mean == Approx(ttft + 4 * tbt).epsilon(1e-9));
  CHECK(r->generated_tokens == 5);
  CHECK(r->clouds.at(0).steps == 5);  // the prompt in one step, then four decode steps
}

TEST_CASE("A prompt in chunks pipelines them through the device, its link and the cloud",
          "[sim]") {
  const SimConfig whole = WithOneArrival(Analytic());
  SimConfig chunked = whole;
  chunked.prompt_chunk = 25;
  auto a = Simulate(whole);
  auto b = Simulate(chunked);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(b->requests_finished == 1);
  CHECK(b->clouds.at(0).steps == 4 + 4);
  // Chunks overlap the input submodel with the upload and the cloud: the first token comes
  // sooner, though the cloud runs four steps instead of one.
  CHECK(b->ttft_s.mean < a->ttft_s.mean - 0.05);
  CHECK(b->tbt_s.mean == Approx(a->tbt_s.mean).epsilon(1e-9));
}

TEST_CASE("Prompt chunks wait for the agent's pacer: at most two unacknowledged", "[sim]") {
  SimConfig c = WithOneArrival(Analytic());
  c.prompt_chunk = 25;  // 25 ms of input each, ~26 ms on the uplink, 20 ms each way
  c.device.pacing_lead_s = -1;
  auto unpaced = Simulate(c);
  c.device.pacing_lead_s = 0.02;
  auto paced = Simulate(c);
  REQUIRE(unpaced.ok());
  REQUIRE(paced.ok());
  // Unpaced, the four chunks cross back to back. Paced, the third waits for the first's
  // receipt (its crossing, 20 ms to the cloud and 20 back), so the link idles ~14 ms, and the
  // fourth goes when the second's receipt comes: the last chunk reaches the cloud ~14 ms later.
  const double link = Up(25);
  const double third_released = 0.025 + link + 0.020 + Down(0) + 0.020;
  const double idle = third_released - (0.025 + 2 * link);
  CHECK(idle == Approx(0.0137).epsilon(0.05));
  // (Down(0) stands for the receipt, a few bytes smaller: within 1e-4.)
  CHECK(paced->ttft_s.mean == Approx(unpaced->ttft_s.mean + idle).epsilon(1e-4));
  CHECK(paced->tbt_s.mean == Approx(unpaced->tbt_s.mean).epsilon(1e-9));
}

TEST_CASE("Speculative rounds yield their accepted drafts and one more token", "[sim]") {
  SimConfig c = WithOneArrival(Analytic());
  c.workload.output_tokens = 41;  // the first token, then 40 from decode rounds
  auto plain = Simulate(c);
  REQUIRE(plain.ok());
  REQUIRE(plain->clouds.at(0).steps == 41);
  c.device.draft_tokens = 4;
  c.device.draft_step_seconds = 0.001;
  SECTION("every draft accepted: five tokens a round, a round the plain one's time and more") {
    c.device.acceptance = 1;
    auto r = Simulate(c);
    REQUIRE(r.ok());
    CHECK(r->generated_tokens == 41);
    CHECK(r->clouds.at(0).steps == 1 + 8);  // the prompt, then 8 rounds of 5
    // A round: 4 drafts (4 ms) and the input (2 ms), 5 kB up (~5 ms) + 20 ms, the step
    // (10 ms), 5 kB down (~1.3 ms) + 20 ms, the output over 5 positions (15 ms); 5 tokens.
    const double round = 0.004 + 0.002 + Up(5) + 0.020 + 0.010 + Down(5) + 0.020 + 0.015;
    CHECK(r->tbt_s.mean == Approx(round / 5).epsilon(1e-9));
    CHECK(r->tbt_s.mean < 0.4 * plain->tbt_s.mean);
  }
  SECTION("none accepted: one token a round, each dearer than without drafts") {
    c.device.acceptance = 0;
    auto r = Simulate(c);
    REQUIRE(r.ok());
    CHECK(r->generated_tokens == 41);
    CHECK(r->clouds.at(0).steps == 41);
    CHECK(r->tbt_s.mean > plain->tbt_s.mean);
  }
  SECTION("some accepted: between the two, and the same for the same seed") {
    c.device.acceptance = 0.6;
    auto r = Simulate(c);
    auto again = Simulate(c);
    REQUIRE(r.ok());
    REQUIRE(again.ok());
    CHECK(r->generated_tokens == 41);
    CHECK(r->clouds.at(0).steps > 1 + 8);
    CHECK(r->clouds.at(0).steps < 41);
    CHECK(again->tbt_s.mean == r->tbt_s.mean);
  }
  c.device.acceptance = 1.5;
  CHECK_FALSE(Simulate(c).ok());
}

TEST_CASE("Pipeline stages keep several steps in flight, each session in one", "[sim]") {
  // Alone, a request sees the same times: a step still takes g(μ) through all stages.
  SimConfig alone = WithOneArrival(Analytic());
  auto one_stage = Simulate(alone);
  alone.cloud.stages = 2;
  auto two_stages = Simulate(alone);
  REQUIRE(one_stage.ok());
  REQUIRE(two_stages.ok());
  CHECK(two_stages->ttft_s.mean == Approx(one_stage->ttft_s.mean).epsilon(1e-9));
  CHECK(two_stages->tbt_s.mean == Approx(one_stage->tbt_s.mean).epsilon(1e-9));
  // Under load, with a budget of 8 tokens for 16 sessions decoding, one stage gives each a
  // token every other step; two stages start a step every half step.
  SimConfig load;
  load.devices = 16;
  load.duration_s = 1;
  for (int64_t d = 0; d < 16; ++d) {  // one request on each device, all at once
    load.replay.push_back({.arrival_s = 0, .device = d, .prompt_tokens = 4, .output_tokens = 40});
  }
  load.cloud.step_time = {{1, 0.100}};  // 100 ms a step, links and devices next to free
  load.cloud.max_batch_tokens = 8;
  load.device = {.input_seconds_per_token = 0, .input_decode_seconds = 0,
                 .output_seconds_per_token = 0, .output_decode_seconds = 0,
                 .uplink_bytes_per_second = 1e12, .downlink_bytes_per_second = 1e12,
                 .one_way_delay_s = 0};
  load.bytes_per_token = 1;
  load.prompt_chunk = 4;
  load.cloud.decode_step_stretch = 0;  // the steps are the stages' alone, prompts uncapped
  auto serial = Simulate(load);
  load.cloud.stages = 2;
  auto piped = Simulate(load);
  REQUIRE(serial.ok());
  REQUIRE(piped.ok());
  REQUIRE(serial->requests_finished == 16);
  REQUIRE(piped->requests_finished == 16);
  CHECK(piped->generated_tokens == serial->generated_tokens);
  INFO("TBT mean " << serial->tbt_s.mean << " s on one stage, " << piped->tbt_s.mean
                   << " s on two");
  CHECK(serial->tbt_s.mean == Approx(0.2).epsilon(0.05));  // every other 100 ms step
  CHECK(piped->tbt_s.mean < 0.75 * serial->tbt_s.mean);
  CHECK(piped->tbt_s.mean >= 0.1 - 1e-9);  // no session is in two steps at once
  alone.cloud.stages = 0;
  CHECK_FALSE(Simulate(alone).ok());
}

TEST_CASE("Many devices decoding at once share the cloud's steps", "[sim]") {
  // The flat step time makes batching free: 50 devices' tokens per step cost one step.
  SimConfig c = Analytic();
  c.devices = 50;
  c.duration_s = 20;
  c.workload.requests_per_device_per_second = 0.2;
  auto r = Simulate(c);
  REQUIRE(r.ok());
  CHECK(r->requests_finished == r->requests_arrived);
  CHECK(r->requests_arrived > 100);
  const CloudStats& cloud = r->clouds.at(0);
  CHECK(cloud.batched_tokens / static_cast<double>(cloud.steps) > 1.5);
  // A decode token waits at most for the step in progress: TBT stays within one step of the
  // lone device's.
  const double alone = 0.002 + 0.001 + 0.020 + 0.010 + 0.00025 + 0.020 + 0.003;
  CHECK(r->tbt_s.p50 <= alone + 0.010 + 1e-3);
  CHECK(r->tbt_s.p50 >= alone * 0.99);
}

TEST_CASE("A step time that grows with the batch makes TBT grow with the load", "[sim]") {
  SimConfig light = Analytic();
  light.cloud.step_time = {{1, 0.005}, {64, 0.010}, {512, 0.060}};
  light.duration_s = 20;
  light.workload.requests_per_device_per_second = 0.5;
  light.devices = 4;
  SimConfig heavy = light;
  heavy.devices = 200;
  auto a = Simulate(light);
  auto b = Simulate(heavy);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(b->tbt_s.p50 > a->tbt_s.p50 * 1.1);
  CHECK(b->clouds[0].batched_tokens / b->clouds[0].steps >
        a->clouds[0].batched_tokens / a->clouds[0].steps);
}

TEST_CASE("Requests a device runs at once share its compute and links", "[sim]") {
  // Two requests arrive together at one device (rate high, window tiny: seed searched).
  SimConfig c = Analytic();
  c.workload.requests_per_device_per_second = 400;
  c.duration_s = 0.005;
  for (c.seed = 1; c.seed < 200; ++c.seed) {
    auto r = Simulate(c);
    REQUIRE(r.ok());
    if (r->requests_arrived == 2) break;
  }
  REQUIRE(c.seed < 200);
  c.device.concurrent_requests = 1;
  auto one = Simulate(c);
  c.device.concurrent_requests = 0;
  auto both = Simulate(c);
  REQUIRE(one.ok());
  REQUIRE(both.ok());
  REQUIRE(one->requests_finished == 2);
  REQUIRE(both->requests_finished == 2);
  // One at a time: the second starts after the first's last token. Together: they share
  // the device and the cloud's steps, and both end sooner than that.
  CHECK(both->e2e_s.mean < one->e2e_s.mean);
  // Sharing costs the second something: its prompt waits for the first's 100 ms on the
  // device (less the < 5 ms between their arrivals), so the mean TTFT of the two is at least
  // ~47 ms over a lone request's.
  const double lone_ttft = 0.100 + 0.100 + 0.020 + 0.010 + 0.025 + 0.020 + 0.050;
  CHECK(both->ttft_s.mean > lone_ttft + 0.04);
}

// Forty devices at a request every two seconds each, for 10 s: more sessions at once than
// the admission tests' small clouds hold.
SimConfig AdmissionLoad() {
  SimConfig c = Analytic();
  c.devices = 40;
  c.duration_s = 10;
  c.workload.requests_per_device_per_second = 0.5;
  return c;
}

TEST_CASE("KV admission holds sessions back instead of losing them", "[sim]") {
  SimConfig c = AdmissionLoad();
  c.cloud.kv_block_size = 16;
  c.cloud.kv_blocks = 3 * 7;  // three sessions of 105 positions (7 blocks each)
  auto tight = Simulate(c);
  c.cloud.kv_blocks = 4096;
  auto roomy = Simulate(c);
  REQUIRE(tight.ok());
  REQUIRE(roomy.ok());
  CHECK(tight->requests_finished == tight->requests_arrived);
  CHECK(tight->clouds[0].max_waiting > 0);
  CHECK(roomy->clouds[0].max_waiting == 0);
  CHECK(tight->ttft_s.p90 > roomy->ttft_s.p90);
  // A request larger than the whole pool is refused, not held forever.
  c.cloud.kv_blocks = 6;
  auto too_small = Simulate(c);
  REQUIRE(too_small.ok());
  CHECK(too_small->requests_rejected == too_small->requests_arrived);
  CHECK(too_small->requests_finished == 0);
}

TEST_CASE("Running slots hold sessions back, and a full waiting queue refuses them, as the "
          "engine's", "[sim]") {
  SimConfig c = AdmissionLoad();
  c.cloud.kv_blocks = 4096;
  c.cloud.max_waiting_sessions = 1000;
  auto roomy = Simulate(c);
  c.cloud.max_running_sessions = 3;
  auto tight = Simulate(c);
  REQUIRE(roomy.ok());
  REQUIRE(tight.ok());
  CHECK(roomy->clouds[0].max_waiting == 0);
  CHECK(roomy->clouds[0].max_running > 3);
  CHECK(tight->clouds[0].max_running == 3);
  CHECK(tight->clouds[0].max_waiting > 0);
  CHECK(tight->requests_finished == tight->requests_arrived);
  CHECK(tight->requests_refused == 0);
  CHECK(tight->ttft_s.p90 > roomy->ttft_s.p90);
  // With at most two waiting, the rest are refused: they fail, and nothing is left hanging.
  c.cloud.max_waiting_sessions = 2;
  auto refusing = Simulate(c);
  REQUIRE(refusing.ok());
  CHECK(refusing->clouds[0].max_waiting <= 2);
  CHECK(refusing->requests_refused > 0);
  CHECK(refusing->clouds[0].refused == refusing->requests_refused);
  CHECK(refusing->requests_finished + refusing->requests_refused ==
        refusing->requests_arrived);
}

TEST_CASE("Several clouds share the devices' sessions by the agents' placement", "[sim]") {
  SimConfig c = Analytic();
  c.devices = 300;
  c.clouds = 3;
  c.duration_s = 30;
  c.workload.requests_per_device_per_second = 0.2;
  auto r = Simulate(c);
  REQUIRE(r.ok());
  double total = 0;
  for (const CloudStats& cloud : r->clouds) total += cloud.sessions;
  CHECK(total == r->requests_arrived);
  for (const CloudStats& cloud : r->clouds) {
    CHECK(cloud.sessions <= 1.5 * total / 3);
    CHECK(cloud.sessions >= 0.5 * total / 3);
  }
}

TEST_CASE("A cloud that goes down loses nothing: its requests replay on the others, and it "
          "takes new ones when it is back",
          "[sim]") {
  SimConfig c = Analytic();
  c.devices = 300;
  c.clouds = 3;
  c.duration_s = 30;
  c.workload.requests_per_device_per_second = 0.2;
  c.workload.output_tokens = 40;  // long enough that many are mid-decode when it goes
  auto steady = Simulate(c);
  REQUIRE(steady.ok());

  c.outages = {{.cloud = 0, .down_at_s = 10, .up_at_s = 20}};
  c.failover_detect_s = 0.05;
  auto outage = Simulate(c);
  REQUIRE(outage.ok());
  // Every request finishes, the same ones as without the outage (same arrivals).
  CHECK(outage->requests_arrived == steady->requests_arrived);
  CHECK(outage->requests_finished == outage->requests_arrived);
  CHECK(outage->generated_tokens == steady->generated_tokens);
  CHECK(outage->failovers > 0);
  CHECK(outage->failovers == outage->clouds[0].failed_over);
  CHECK(outage->clouds[1].failed_over == 0);
  // Those requests paid for the replay: requests take longer on the whole than without it
  // (the slowest, p99, are the devices' own queues, which the outage may leave as they were).
  CHECK(outage->e2e_s.mean > steady->e2e_s.mean);
  CHECK(outage->e2e_s.p99 >= steady->e2e_s.p99);
  // Cloud 0 took new requests again after it came back: more than the 10 s it ran before
  // going down would have given it, and fewer than its share of all 30 s.
  const double per_second = steady->clouds[0].sessions / 30.0;
  INFO("cloud 0: " << outage->clouds[0].sessions << " sessions, " << per_second
                   << " a second without the outage");
  CHECK(outage->clouds[0].sessions > 12 * per_second);
  CHECK(outage->clouds[0].sessions < steady->clouds[0].sessions);

  // With one cloud and no other to go to, requests wait for it to come back.
  SimConfig one = Analytic();
  one.devices = 50;
  one.duration_s = 10;
  one.workload.requests_per_device_per_second = 0.5;
  one.outages = {{.cloud = 0, .down_at_s = 3, .up_at_s = 6}};
  auto waited = Simulate(one);
  REQUIRE(waited.ok());
  CHECK(waited->requests_finished == waited->requests_arrived);
  CHECK(waited->ttft_s.p99 > 2.0);  // the requests of the outage's start waited ~3 s
  CHECK(waited->failovers > 0);

  one.outages = {{.cloud = 1, .down_at_s = 3}};
  CHECK(std::string(Simulate(one).status().message()).find("outages") != std::string::npos);
  one.outages = {{.cloud = 0, .down_at_s = 3, .up_at_s = 2}};
  CHECK(std::string(Simulate(one).status().message()).find("outages") != std::string::npos);
}

TEST_CASE("Requests arrive at each device's rate, inside the window only", "[sim]") {
  SimConfig c = Analytic();
  c.devices = 2000;
  c.duration_s = 60;
  c.workload.requests_per_device_per_second = 1.0 / 60;
  c.workload.prompts = "fixed:16";
  c.workload.output_tokens = 2;
  auto r = Simulate(c);
  REQUIRE(r.ok());
  // Poisson: 2,000 expected, standard deviation about 45; 5 of them either side.
  CHECK(r->requests_arrived > 2000 - 225);
  CHECK(r->requests_arrived < 2000 + 225);
  // The last finishes shortly after the window: nothing arrives after it.
  CHECK(r->simulated_seconds < 61);
}

TEST_CASE("A simulation is the same for the same seed", "[sim]") {
  SimConfig c = Analytic();
  c.devices = 30;
  c.duration_s = 10;
  c.workload.prompts = "specbench";
  c.prompt_chunk = 0;  // HAT's chunk size
  c.device.bandwidth_log_sigma = 0.3;
  auto a = Simulate(c);
  auto b = Simulate(c);
  c.seed = 2;
  auto other = Simulate(c);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(other.ok());
  CHECK(a->events == b->events);
  CHECK(a->ttft_s.p90 == b->ttft_s.p90);
  CHECK(a->tbt_s.mean == b->tbt_s.mean);
  CHECK(a->ttft_s.mean != other->ttft_s.mean);
}

TEST_CASE("Replayed requests arrive when recorded, on their devices' own links", "[sim]") {
  SimConfig c = Analytic();
  c.devices = 2;
  c.duration_s = 1;
  c.replay = {{.arrival_s = 0.0, .device = 0, .prompt_tokens = 100, .output_tokens = 5},
              {.arrival_s = 0.3, .device = 1, .prompt_tokens = 100, .output_tokens = 5}};
  c.device_links = {{.uplink_bytes_per_second = 1e6, .downlink_bytes_per_second = 4e6},
                    {.uplink_bytes_per_second = 0.5e6, .downlink_bytes_per_second = 4e6}};
  auto r = Simulate(c);
  REQUIRE(r.ok());
  CHECK(r->requests_arrived == 2);
  CHECK(r->requests_finished == 2);
  // Device 0 as in the analytic case; device 1's 100 kB prompt takes twice as long up.
  // The first finishes (at ~0.56 s) before the second's prompt reaches the cloud (~0.63 s).
  const double ttft0 = 0.100 + Up(100) + 0.020 + 0.010 + Down(100) + 0.020 + 0.050;
  CHECK(r->ttft_s.mean == Approx((ttft0 + ttft0 + Up(100)) / 2).epsilon(1e-9));
  CHECK(r->request_tbt_s.mean == Approx(r->tbt_s.mean).epsilon(1e-9));

  c.device_links.pop_back();
  CHECK(std::string(Simulate(c).status().message()).find("device_links") != std::string::npos);
  c.device_links.clear();
  c.replay[1].device = 2;
  CHECK(std::string(Simulate(c).status().message()).find("replay") != std::string::npos);
}

TEST_CASE("An ablation report is read for replay, and a file that is not one is named",
          "[sim]") {
  const testing::TempDir scratch;  // one per process: CTest runs cases side by side
  const std::filesystem::path& dir = scratch.path();
  const std::filesystem::path good = dir / "ablation.json";
  std::ofstream(good) << R"({"output_tokens": 8,
    "step_time_curve": {"+chunk": [[1, 0.001], [21.5, 0.004]]},
    "links": {"one_way_delay_s": 0.01, "bytes_per_token": 768,
              "devices": [{"uplink_bytes_per_second": 5e5, "downlink_bytes_per_second": 1e6}]},
    "runs": [{"config": "+chunk", "dataset": "specbench", "rate": 1.0,
              "chunk_size_by_device": [16.0],
              "cloud_cores": 0.5, "agent_cores": 0.25, "host_cores": 2,
              "per_request": [
                {"ok": true, "arrival_s": 0.5, "device": 0, "prompt_tokens": 40,
                 "generated_tokens": 8, "ttft_s": 0.2, "mean_tbt_s": 0.03,
                 "prompt_chunk_size": 24},
                {"ok": false, "arrival_s": 0.7, "device": 0, "prompt_tokens": 40,
                 "generated_tokens": 0, "ttft_s": 0, "mean_tbt_s": 0}]}]})";
  auto report = LoadAblationReport(good.string());
  REQUIRE(report.ok());
  CHECK(report->one_way_delay_s == 0.01);
  CHECK(report->bytes_per_token == 768);
  REQUIRE(report->links.size() == 1);
  CHECK(report->links[0].uplink_bytes_per_second == 5e5);
  REQUIRE(report->runs.size() == 1);
  const RecordedRun& run = report->runs[0];
  CHECK(run.chunk_size == 16);
  CHECK(run.cloud_cores == 0.5);
  CHECK(run.agent_cores == 0.25);
  CHECK(run.host_cores == 2);
  REQUIRE(run.requests.size() == 1);  // the failed request is not replayed
  CHECK(run.requests[0].arrival_s == 0.5);
  CHECK(run.requests[0].prompt_tokens == 40);
  CHECK(run.requests[0].prompt_chunk == 24);
  CHECK(run.ttft_s == std::vector<double>{0.2});
  REQUIRE(report->step_curves.count("+chunk") == 1);
  const std::vector<StepPoint>& curve = report->step_curves.at("+chunk");
  REQUIRE(curve.size() == 2);
  CHECK(curve[1].tokens == 21.5);
  CHECK(curve[1].seconds == 0.004);

  const std::filesystem::path bad = dir / "engine.json";
  std::ofstream(bad) << R"({"cases": []})";
  auto refused = LoadAblationReport(bad.string());
  CHECK(std::string(refused.status().message()).find("not a tophat bench --ablation report") !=
        std::string::npos);
}

TEST_CASE("On a shared host the devices' compute shares its cores, and the cloud takes its share",
          "[sim]") {
  SimConfig c = Analytic();
  c.devices = 2;
  c.device.output_seconds_per_token = 0;
  c.replay = {{.arrival_s = 0.0, .device = 0, .prompt_tokens = 100, .output_tokens = 5},
              {.arrival_s = 0.0, .device = 1, .prompt_tokens = 100, .output_tokens = 5}};
  auto own = Simulate(c);
  REQUIRE(own.ok());
  REQUIRE(own->requests_finished == 2);
  // Each on its own CPU: input 100 ms, up ~105 ms + 20 ms, the first one's step (10 ms) and
  // the second's after it (it arrived while the first ran), down ~26 + 20 ms.
  CHECK(own->ttft_s.mean ==
        Approx(0.100 + Up(100) + 0.020 + 0.015 + Down(100) + 0.020).epsilon(1e-9));

  c.host_cores = 1;
  c.host_cloud_cores = 0;
  auto one_core = Simulate(c);
  REQUIRE(one_core.ok());
  // Both prompts on one core at once: each input takes 200 ms.
  CHECK(one_core->ttft_s.mean == Approx(own->ttft_s.mean + 0.100).epsilon(1e-9));

  c.host_cores = 2;
  auto two_cores = Simulate(c);
  REQUIRE(two_cores.ok());
  CHECK(two_cores->ttft_s.mean == Approx(own->ttft_s.mean).epsilon(1e-9));
  CHECK(two_cores->tbt_s.mean == Approx(own->tbt_s.mean).epsilon(1e-9));

  // The cloud's steps take cores too: with a decode position's input submodel (30 ms) longer
  // than a step and the devices out of phase, each device's decode work overlaps the other's
  // steps, and slows.
  c.device.input_decode_seconds = 0.030;
  c.replay[1].arrival_s = 0.040;
  c.host_cores = 1;
  c.host_cloud_cores = 0;
  auto cloud_free = Simulate(c);
  c.host_cloud_cores = 0.9;
  auto cloud_busy = Simulate(c);
  REQUIRE(cloud_free.ok());
  REQUIRE(cloud_busy.ok());
  CHECK(cloud_busy->e2e_s.mean > cloud_free->e2e_s.mean + 0.001);

  c.host_cloud_cores = 1;
  CHECK(std::string(Simulate(c).status().message()).find("host_cloud_cores") !=
        std::string::npos);
}

TEST_CASE("A configuration the simulator cannot use is refused by field", "[sim]") {
  SimConfig c = Analytic();
  c.cloud.step_time.clear();
  CHECK(std::string(Simulate(c).status().message()).find("cloud.step_time") !=
        std::string::npos);
  c = Analytic();
  c.device.uplink_bytes_per_second = 0;
  CHECK(std::string(Simulate(c).status().message()).find("device") != std::string::npos);
  c = Analytic();
  c.workload.prompts = "nosuch";
  CHECK(std::string(Simulate(c).status().message()).find("workload.prompts") !=
        std::string::npos);
  CHECK(StepPointsFromEngineReport("/nonexistent/report.json").status().code() ==
        absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tophat::sim
