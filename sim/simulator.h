// A discrete-event simulator of tophat at scale (issue 33, DSD's DSD-Sim): devices that run
// their input and output submodels, edge links, clouds that batch every device's work under
// a token budget with KV admission, and the agents' load balancing between clouds. Its
// decisions are the serving system's own pure code (scheduler/: the batch planner, the step
// time predictor g(μ), HAT's chunk size, the clouds' placement), and its inputs are measured
// profiles: the cloud's step times (a tophat-bench-engine report, or points given), the
// device's compute rates and its links.
//
// What it models and what it leaves out (docs/scale.md): a bounded number of requests at a
// time per device,
// prompt chunks pipelined through the device, its uplink, the cloud and back (every position's
// result returns for the output layers' KV); decode one token per round trip; clouds that go
// down and their requests' failover by replay. Not yet: conversations kept between turns,
// transfers between the cloud's stages. Speculative decoding's acceptance is one probability
// per draft (no drafter in the loop).
// Single-threaded and deterministic for a seed.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/workload.h"

namespace tophat::sim {

// One point of the cloud's step time g(μ): a step of `tokens` positions took `seconds`.
struct StepPoint {
  double tokens = 0;
  double seconds = 0;
};

struct DeviceProfile {
  double input_seconds_per_token = 0.0005;   // input submodel over a prompt chunk, per position
  double input_decode_seconds = 0.002;       // ... over one decode position
  double output_seconds_per_token = 0.0005;  // output submodel over a returned chunk, per position
  double output_decode_seconds = 0.004;      // last layers, norm, head and sampling: one token
  double uplink_bytes_per_second = 1.25e6;   // 10 Mbit/s
  double downlink_bytes_per_second = 5e6;    // 40 Mbit/s
  double one_way_delay_s = 0.02;
  // Each transfer's rate is multiplied by exp(N(0, σ)) with this σ (0: a steady link).
  double bandwidth_log_sigma = 0;
  // Requests a device runs at once (they share its compute and links, first come first
  // served); more wait in its queue. 0: no limit (an agent serving several apps).
  int64_t concurrent_requests = 1;
  // The agent's uplink pacing (uplink_pacing.lead_s), by the agent's own UplinkPacer: prompt
  // chunks are held on the device until the cloud's receipts release them (at most two
  // unacknowledged; the second `lead` before the first should have crossed), and a decode
  // message goes past the held ones, behind those already on the link. < 0: no pacing, one
  // first-come-first-served queue.
  double pacing_lead_s = 0.02;
  // Decode positions (input and output submodels) compute beside prompt chunks instead of
  // queueing behind them (the agent's request threads on a multi-core device).
  bool decode_beside_prefill = true;
  // Speculative decoding (0: off): each decode round the drafter proposes this many tokens
  // (draft_step_seconds each, on the decode lane), the round carries them with the last token
  // (draft_tokens + 1 positions up, through the cloud's step and back, and through the output
  // submodel), and each draft is accepted with probability `acceptance` until the first that
  // is not; the round yields the accepted drafts and one more token.
  int64_t draft_tokens = 0;
  double acceptance = 0.7;
  double draft_step_seconds = 0.002;
};

struct WorkloadSpec {
  std::string prompts = "specbench";  // PromptLengthSampler: specbench, cnndm, fixed:N, a file
  int64_t max_prompt_tokens = 2048;
  int64_t output_tokens = 128;
  double requests_per_device_per_second = 1.0 / 60;  // Poisson arrivals at each device
};

struct CloudSpec {
  std::vector<StepPoint> step_time;  // g(μ); at least one point
  int64_t max_batch_tokens = 512;
  // scheduler.max_running_sessions and max_waiting_sessions, the engine's defaults: a
  // session is admitted when fewer than max_running_sessions run and its KV fits (at most
  // that many go into one step); others wait first come first served, and an open that
  // finds max_waiting_sessions already waiting is refused (RESOURCE_EXHAUSTED: the agent
  // fails the request).
  int64_t max_running_sessions = 64;
  int64_t max_waiting_sessions = 64;
  // scheduler.decode_step_stretch, as the engine plans (DecodeStretchStepTokens): while
  // another device decodes, a device's prompt work may make a step at most this many times
  // the decode work's predicted time (0: no cap).
  double decode_step_stretch = 2;
  // An 8B-shaped middle's KV (29 layers x 8 heads x 128 x K and V in bf16: 118 KB a
  // position) in what an H200 has left after its 12.65 GB of weights: about a million
  // positions, 65,536 blocks of 16.
  int64_t kv_blocks = 65536;
  int64_t kv_block_size = 16;
  double load_report_interval_s = 0.2;  // as the engine's ReportLoad
  // Pipeline stages (pipeline.layer_boundaries), even: each runs 1/stages of g(μ), and up to
  // `stages` steps are in flight, a session in at most one (the engine's Launch/Complete).
  // Transfers between stages are not modelled.
  int64_t stages = 1;
};

// A request of a recorded run, replayed instead of drawn (calibration against real runs).
struct ReplayRequest {
  double arrival_s = 0;
  int64_t device = 0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t prompt_chunk = 0;  // the chunk size it used (0: the simulation's own choice)
};

// One device's own link rates, where devices differ (bytes per second).
struct DeviceLinkRates {
  double uplink_bytes_per_second = 0;
  double downlink_bytes_per_second = 0;
};

// A cloud that stops at `down_at_s`, losing its sessions as a killed process does, and
// comes back empty at `up_at_s` (infinity: never).
struct CloudOutage {
  int64_t cloud = 0;
  double down_at_s = 0;
  double up_at_s = std::numeric_limits<double>::infinity();
};

struct SimConfig {
  int64_t devices = 8;
  int64_t clouds = 1;
  double duration_s = 60;  // requests arrive until then; the run ends when all have finished
  double drain_limit_s = 600;  // ... or this long after, the rest counted unfinished
  WorkloadSpec workload;
  DeviceProfile device;
  CloudSpec cloud;
  double bytes_per_token = 8192;  // A: one position's hidden state on the wire
  // 0: HAT's chunk size for each prompt (ChooseChunkSize, from the device's uplink and g at
  // the mean batch); else this fixed size.
  int64_t prompt_chunk = 0;
  int64_t min_chunk = 16;
  int64_t max_chunk = 1024;
  double max_step_seconds = 0;  // scheduler.max_step_seconds
  uint64_t seed = 1;
  // When not empty: exactly these requests (devices must be > every one's device), no
  // Poisson arrivals and no drawn prompt lengths.
  std::vector<ReplayRequest> replay;
  // When not empty: device i's links (one entry per device), instead of `device`'s rates.
  std::vector<DeviceLinkRates> device_links;
  // A shared host (0: off, each device computes on a CPU of its own, as in a deployment).
  // Else every device's compute shares this many cores with the clouds, as when the cloud
  // and the agents of a test run on one machine: the devices' jobs in progress (the head of
  // each device's prompt and decode lanes) share what the clouds leave equally (processor
  // sharing), at most one core each, and a cloud takes `host_cloud_cores` of them while a
  // step of its is in flight. The cloud's own step times are not slowed: its measured curve
  // already has the contention of the run it came from.
  double host_cores = 0;
  double host_cloud_cores = 1;
  // Failover (the agent's replay path): when a cloud goes down, each of its requests is
  // placed on a live cloud `failover_detect_s` later (the agent noticing the stream is gone;
  // a killed process's connection breaks at once) and replays: the device sends again the
  // hidden states of every position the lost cloud had been sent (it keeps them: no device
  // compute), the new cloud computes them as a prompt, and their results come back; then the
  // request goes on where it was. With no cloud alive, requests wait for one to come back.
  std::vector<CloudOutage> outages;
  double failover_detect_s = 0;
};

struct CloudStats {
  int64_t sessions = 0;  // requests placed on it
  int64_t steps = 0;
  double busy_seconds = 0;
  double batched_tokens = 0;  // over all steps
  int64_t max_running = 0;    // most sessions ever admitted at once
  int64_t max_waiting = 0;    // most sessions ever waiting for admission at once
  int64_t refused = 0;        // opens refused with max_waiting_sessions waiting
  int64_t failed_over = 0;    // requests that left it when it went down
};

struct SimResult {
  int64_t requests_arrived = 0;
  int64_t requests_finished = 0;
  int64_t requests_rejected = 0;  // need more KV than a cloud has
  int64_t requests_refused = 0;   // found a cloud's waiting queue full (CloudStats::refused)
  int64_t failovers = 0;          // requests moved to another cloud (or the same, back up)
  LatencySummary ttft_s;          // arrival at the device to the first token
  LatencySummary tbt_s;           // between a request's successive tokens
  LatencySummary request_tbt_s;   // each request's mean TBT (as `tophat bench` reports it)
  LatencySummary e2e_s;           // arrival to the last token
  double generated_tokens = 0;
  double simulated_seconds = 0;   // when the last event happened
  std::vector<CloudStats> clouds;
  int64_t events = 0;
};

// What a message carrying `positions` hidden states of `bytes_per_token` each occupies on a
// link, as the agent counts it (OnWireBytes: gRPC, HTTP/2, TLS and TCP/IP framing, about 5%
// on a prompt chunk) with the message's other fields: every simulated transfer's size.
double MessageWireBytes(int64_t positions, double bytes_per_token);

// Runs the simulation. Errors name the configuration field that cannot be used.
absl::StatusOr<SimResult> Simulate(const SimConfig& config);

// The step-time points of a tophat-bench-engine JSON report (each case's tokens and engine
// milliseconds): the cloud profile of a real run.
absl::StatusOr<std::vector<StepPoint>> StepPointsFromEngineReport(const std::string& path);

// The requests, devices and links of one configuration's runs in a `tophat bench --ablation`
// JSON report (each run: its per-request arrivals, devices and prompt lengths), for replay.
struct RecordedRun {
  std::string config;
  std::string dataset;
  double rate = 0;
  std::vector<ReplayRequest> requests;
  std::vector<double> ttft_s;      // as measured, per request
  std::vector<double> mean_tbt_s;  // as measured, per request
  int64_t chunk_size = 0;          // the cloud's choice (the first device's)
  // Cores the cloud and the agents used during the run, of the host's (0: not recorded).
  // The simulated devices have CPUs of their own, so a run on a busy shared host is not one
  // the simulator should match.
  double cloud_cores = 0;
  double agent_cores = 0;
  double host_cores = 0;
};
struct RecordedAblation {
  std::vector<RecordedRun> runs;
  // The cloud's own step-time curve at the end of each configuration (its metrics'
  // tophat_scheduler_step_curve_*), by configuration name; empty in older reports.
  std::map<std::string, std::vector<StepPoint>> step_curves;
  std::vector<DeviceLinkRates> links;
  double one_way_delay_s = 0;
  double bytes_per_token = 0;
  int64_t output_tokens = 0;
};
absl::StatusOr<RecordedAblation> LoadAblationReport(const std::string& path);

}  // namespace tophat::sim
