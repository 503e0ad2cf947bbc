// Drives a workload through running agents with the client SDK and summarises it: the core
// of `tophat bench`, shared by a single run and by the ablation, which repeats the same
// seeded workload under each configuration.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/workload.h"
#include "sdk/client.h"

namespace tophat::bench {

struct WorkloadSpec {
  // With prompts: one request per prompt, all at once. Otherwise `requests` prompts of random
  // ids with lengths from `prompt_lengths`, arriving as a Poisson process at `rate`.
  std::vector<std::string> prompts;
  int64_t requests = 32;
  double rate = 4;  // requests/s; 0 = all at once
  std::string prompt_lengths = "specbench";
  int64_t output_tokens = 64;
  uint64_t seed = 0;
  // When set, each generated prompt is a window of this token stream at a seeded offset, so
  // the model sees text like its own (drafting then accepts as it would in use); otherwise
  // random ids from the vocabulary.
  std::vector<int32_t> text_tokens;
  // Ask each request for its per-chunk trace (GenerateRequest.trace): OutcomeJson then
  // breaks each TTFT into the prompt's time on the device, the uplink and the cloud.
  bool trace = false;
};

struct RequestOutcome {
  size_t agent = 0;  // index into the agents the workload ran on
  double arrival_s = 0;
  absl::Status status;
  GenerateResult result;
  double e2e_s = 0;
};

struct WorkloadRun {
  std::vector<RequestOutcome> outcomes;
  double wall_seconds = 0;
};

// Requests go round-robin over `agents` (host:port). The same spec and seed give the same
// prompts and arrival times whatever the agents do, so configurations compare like for like.
absl::StatusOr<WorkloadRun> RunWorkload(const std::vector<std::string>& agents,
                                        const WorkloadSpec& spec);

struct SlaTargets {
  double ttft_s = 1.0;
  double tbt_s = 0.1;
};

struct WorkloadSummary {
  LatencySummary ttft;
  LatencySummary tbt;  // of each request's mean time between tokens
  LatencySummary e2e;
  int64_t requests = 0;
  int64_t failed = 0;
  int64_t generated_tokens = 0;
  double output_tokens_per_second = 0;
  double sla_compliance = 0;  // share of all requests meeting both targets
};
WorkloadSummary SummarizeRun(const WorkloadRun& run, const SlaTargets& sla);

// One request's outcome (`tophat bench --json` and the ablation both write these); the
// caller adds which agent served it. With a trace, `prompt_path` says where its TTFT went.
nlohmann::json OutcomeJson(const RequestOutcome& outcome);
nlohmann::json LatencyJson(const LatencySummary& summary);
nlohmann::json SummaryJson(const WorkloadSummary& summary);

}  // namespace tophat::bench
