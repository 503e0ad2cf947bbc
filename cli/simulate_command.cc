#include "cli/simulate_command.h"

#include <chrono>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/workload_runner.h"

namespace tophat::cli {
namespace {

// The default cloud: the engine's step times of a Llama-3-8B-shaped middle (29 layers, bf16)
// measured on an H200 (docs/benchmarks.md, "The CI-built bundle on an H200", commit ac974fc).
const std::vector<sim::StepPoint> kH200Llama8BSteps = {
    {1, 0.008833}, {8, 0.008952}, {32, 0.009503}, {64, 0.014648}, {128, 0.025525},
    {2048, 0.050578}};

// The JSON report on one line after the table, and into `json_path` when given.
int ReportOrFail(const nlohmann::json& report, const std::string& json_path) {
  if (absl::Status s = bench::PrintReport("", report, json_path); !s.ok()) {
    std::fprintf(stderr, "tophat simulate: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

double Percent(double simulated, double measured) {
  return measured > 0 ? 100 * (simulated - measured) / measured : 0;
}

// --replay: each recorded run of the chosen configuration, simulated with its own requests.
int RunReplay(const SimulateArgs& args, bool steps_given) {
  auto recorded = sim::LoadAblationReport(args.replay);
  if (!recorded.ok()) {
    std::fprintf(stderr, "tophat simulate: --replay: %s\n",
                 std::string(recorded.status().message()).c_str());
    return 2;
  }
  std::printf("replaying %s against this simulation (error: simulated vs measured); cloud "
              "step times: %s\n",
              args.replay.c_str(),
              steps_given ? "from the command line"
              : recorded->step_curves.empty()
                  ? "the built-in H200 profile (the report has no curve of its cloud's)"
                  : "the cloud's own curve from the report");
  std::printf("%-12s %-10s %5s %4s | %-23s | %-23s | %-23s | %-23s\n", "config", "dataset",
              "req/s", "dev", "TTFT p50 ms real/sim", "TTFT p90 ms real/sim",
              "TBT p50 ms real/sim", "TBT p90 ms real/sim");
  nlohmann::json cells = nlohmann::json::array();
  std::string config_name = args.replay_config;
  for (const sim::RecordedRun& run : recorded->runs) {
    if (config_name.empty()) config_name = run.config;
    if (run.config != config_name || run.requests.empty()) continue;
    sim::SimConfig c = args.config;
    // The cloud's own curve from the run, unless the command line gave step times.
    if (const auto curve = recorded->step_curves.find(run.config);
        !steps_given && curve != recorded->step_curves.end() && !curve->second.empty()) {
      c.cloud.step_time = curve->second;
    }
    c.devices = static_cast<int64_t>(recorded->links.size());
    c.device_links = recorded->links;
    c.device.one_way_delay_s = recorded->one_way_delay_s;
    c.bytes_per_token = recorded->bytes_per_token;
    c.replay = run.requests;
    if (run.chunk_size > 0) c.prompt_chunk = run.chunk_size;
    c.duration_s = 1;
    for (const sim::ReplayRequest& r : run.requests) c.duration_s = std::max(c.duration_s, r.arrival_s + 1);
    auto simulated = sim::Simulate(c);
    if (!simulated.ok()) {
      std::fprintf(stderr, "tophat simulate: %s\n", std::string(simulated.status().message()).c_str());
      return 2;
    }
    const LatencySummary ttft = Summarize(run.ttft_s);
    const LatencySummary tbt = Summarize(run.mean_tbt_s);
    const LatencySummary& sim_ttft = simulated->ttft_s;
    const LatencySummary& sim_tbt = simulated->request_tbt_s;
    const auto cell = [](double real, double sim) {
      return absl::StrFormat("%7.1f/%7.1f %+5.0f%%", 1e3 * real, 1e3 * sim, Percent(sim, real));
    };
    std::printf("%-12s %-10s %5.2f %4lld | %s | %s | %s | %s\n", run.config.c_str(),
                run.dataset.c_str(), run.rate, static_cast<long long>(c.devices),
                cell(ttft.p50, sim_ttft.p50).c_str(), cell(ttft.p90, sim_ttft.p90).c_str(),
                cell(tbt.p50, sim_tbt.p50).c_str(), cell(tbt.p90, sim_tbt.p90).c_str());
    cells.push_back({{"config", run.config}, {"dataset", run.dataset}, {"rate", run.rate},
                     {"devices", c.devices}, {"requests", run.requests.size()},
                     {"measured", {{"ttft_s", bench::LatencyJson(ttft)},
                                   {"request_tbt_s", bench::LatencyJson(tbt)}}},
                     {"simulated", {{"ttft_s", bench::LatencyJson(sim_ttft)},
                                    {"request_tbt_s", bench::LatencyJson(sim_tbt)}}}});
  }
  if (cells.empty()) {
    std::fprintf(stderr, "tophat simulate: --replay: %s has no runs of configuration '%s'\n",
                 args.replay.c_str(), config_name.c_str());
    return 2;
  }
  const nlohmann::json report = {{"benchmark", "simulate_replay"}, {"report", args.replay},
                                 {"cells", cells}};
  return ReportOrFail(report, args.json_path);
}

}  // namespace

CLI::App* AddSimulateCommand(CLI::App& app, SimulateArgs& args) {
  sim::SimConfig& c = args.config;
  auto* cmd = app.add_subcommand(
      "simulate",
      "Simulate devices, their links and clouds (discrete events; the scheduler's own "
      "decisions): latency percentiles and each cloud's load for a fleet too large to run");
  cmd->add_option("--devices", c.devices, "Devices")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--clouds", c.clouds, "Clouds the agents place requests on")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--duration-s", c.duration_s, "Seconds of arrivals (the run goes on until "
                                                "they finish)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--rate-per-min", args.rate_per_minute,
                  "Requests per device per minute (Poisson)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--prompts", c.workload.prompts,
                  "Prompt lengths: specbench, cnndm, fixed:N, or a file of lengths")
      ->capture_default_str();
  cmd->add_option("--max-prompt-tokens", c.workload.max_prompt_tokens)->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--output-tokens", c.workload.output_tokens, "Tokens generated per request")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--step-profile", args.step_profile,
                  "The cloud's step times from a tophat-bench-engine --json report (default: "
                  "an 8B-shaped middle in bf16 measured on an H200)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--step-time", args.step_points,
                  "A point of the cloud's step time, TOKENS:MS (repeat), instead of a report");
  cmd->add_option("--max-batch-tokens", c.cloud.max_batch_tokens, "The cloud's token budget")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--kv-blocks", c.cloud.kv_blocks, "KV blocks per cloud")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--kv-block-size", c.cloud.kv_block_size)->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--hidden-bytes", c.bytes_per_token,
                  "Bytes of one position's hidden state on the wire (hidden size x dtype)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--chunk", c.prompt_chunk, "Prompt chunk size (0: HAT's, per prompt)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--uplink-mbit", args.uplink_mbit)->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--downlink-mbit", args.downlink_mbit)->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--delay-ms", args.delay_ms, "One-way link delay")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--jitter", c.device.bandwidth_log_sigma,
                  "σ of each transfer's log rate (0: steady links)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--input-ms-per-token", args.input_ms_per_token,
                  "The device's input submodel over a prompt chunk, per position")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--input-decode-ms", args.input_decode_ms)->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--output-ms-per-token", args.output_ms_per_token,
                  "The device's output submodel over a returned chunk, per position")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--output-decode-ms", args.output_decode_ms,
                  "Output layers, head and sampling of one token")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--pacing-lead-ms", args.pacing_lead_ms,
                  "The agents' uplink pacing: a decode message waits behind at most this much "
                  "of the prompt chunks on the link (negative: one FIFO queue)")
      ->capture_default_str();
  cmd->add_option("--device-concurrency", c.device.concurrent_requests,
                  "Requests a device runs at once, sharing its compute and links (0: no limit, "
                  "an agent serving several apps)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--replay", args.replay,
                  "Replay the runs of a `tophat bench --ablation` JSON report (its requests, "
                  "devices, links and chunk size) and compare the simulated TTFT and TBT with "
                  "the measured ones")
      ->check(CLI::ExistingFile);
  cmd->add_option("--replay-config", args.replay_config,
                  "The report's configuration to replay (default: its first)");
  cmd->add_option("--seed", c.seed)->capture_default_str();
  cmd->add_option("--json", args.json_path, "Also write the JSON report here");
  return cmd;
}

int RunSimulate(SimulateArgs args) {
  sim::SimConfig& c = args.config;
  c.workload.requests_per_device_per_second = args.rate_per_minute / 60;
  c.device.uplink_bytes_per_second = args.uplink_mbit * 1e6 / 8;
  c.device.downlink_bytes_per_second = args.downlink_mbit * 1e6 / 8;
  c.device.one_way_delay_s = args.delay_ms / 1e3;
  c.device.pacing_lead_s = args.pacing_lead_ms < 0 ? -1 : args.pacing_lead_ms / 1e3;
  c.device.input_seconds_per_token = args.input_ms_per_token / 1e3;
  c.device.input_decode_seconds = args.input_decode_ms / 1e3;
  c.device.output_seconds_per_token = args.output_ms_per_token / 1e3;
  c.device.output_decode_seconds = args.output_decode_ms / 1e3;
  std::string step_source = "an 8B-shaped middle in bf16 on an H200 (built in)";
  if (!args.step_profile.empty() && !args.step_points.empty()) {
    std::fprintf(stderr, "tophat simulate: give --step-profile or --step-time, not both\n");
    return 2;
  }
  if (!args.step_profile.empty()) {
    auto points = sim::StepPointsFromEngineReport(args.step_profile);
    if (!points.ok()) {
      std::fprintf(stderr, "tophat simulate: --step-profile: %s\n",
                   std::string(points.status().message()).c_str());
      return 2;
    }
    c.cloud.step_time = *points;
    step_source = args.step_profile;
  } else if (!args.step_points.empty()) {
    for (const std::string& point : args.step_points) {
      const std::vector<std::string> parts = absl::StrSplit(point, ':');
      double tokens = 0;
      double ms = 0;
      if (parts.size() != 2 || !absl::SimpleAtod(parts[0], &tokens) ||
          !absl::SimpleAtod(parts[1], &ms)) {
        std::fprintf(stderr, "tophat simulate: --step-time '%s': expected TOKENS:MS\n",
                     point.c_str());
        return 2;
      }
      c.cloud.step_time.push_back({tokens, ms / 1e3});
    }
    step_source = "--step-time";
  } else {
    c.cloud.step_time = kH200Llama8BSteps;
  }

  if (!args.replay.empty()) {
    return RunReplay(args, !args.step_profile.empty() || !args.step_points.empty());
  }

  const auto t0 = std::chrono::steady_clock::now();
  auto result = sim::Simulate(c);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!result.ok()) {
    std::fprintf(stderr, "tophat %s\n", std::string(result.status().message()).c_str());
    return 2;
  }
  const sim::SimResult& r = *result;
  std::printf("tophat simulate: %lld devices, %lld cloud(s), %.0f s of arrivals at %.2f/min "
              "per device, %s prompts, %lld output tokens\n",
              static_cast<long long>(c.devices), static_cast<long long>(c.clouds), c.duration_s,
              args.rate_per_minute, c.workload.prompts.c_str(),
              static_cast<long long>(c.workload.output_tokens));
  std::printf("cloud step times: %s; links %.1f/%.1f Mbit/s up/down, %.1f ms one way\n",
              step_source.c_str(), args.uplink_mbit, args.downlink_mbit, args.delay_ms);
  std::printf("requests: %lld arrived, %lld finished, %lld refused (larger than a cloud's KV)\n",
              static_cast<long long>(r.requests_arrived),
              static_cast<long long>(r.requests_finished),
              static_cast<long long>(r.requests_rejected));
  std::printf("%-8s | %9s | %9s | %9s | %9s\n", "latency", "mean", "p50", "p90", "p99");
  const auto row = [](const char* name, const LatencySummary& s, double scale) {
    std::printf("%-8s | %9.3f | %9.3f | %9.3f | %9.3f\n", name, s.mean * scale, s.p50 * scale,
                s.p90 * scale, s.p99 * scale);
  };
  row("TTFT s", r.ttft_s, 1);
  row("TBT ms", r.tbt_s, 1e3);
  row("e2e s", r.e2e_s, 1);
  std::printf("%-8s | %9s | %9s | %9s | %10s | %11s\n", "cloud", "sessions", "steps", "busy",
              "mean batch", "max waiting");
  nlohmann::json clouds = nlohmann::json::array();
  for (size_t i = 0; i < r.clouds.size(); ++i) {
    const sim::CloudStats& s = r.clouds[i];
    const double busy = r.simulated_seconds > 0 ? s.busy_seconds / r.simulated_seconds : 0;
    const double batch = s.steps > 0 ? s.batched_tokens / static_cast<double>(s.steps) : 0;
    std::printf("%-8zu | %9lld | %9lld | %8.1f%% | %10.1f | %11lld\n", i,
                static_cast<long long>(s.sessions), static_cast<long long>(s.steps), 100 * busy,
                batch, static_cast<long long>(s.max_waiting));
    clouds.push_back({{"sessions", s.sessions}, {"steps", s.steps}, {"busy_fraction", busy},
                      {"mean_batch_tokens", batch}, {"max_waiting", s.max_waiting}});
  }
  std::printf("simulated %.1f s (%lld events) in %.2f s of wall time; %.0f tokens/s generated\n",
              r.simulated_seconds, static_cast<long long>(r.events), wall,
              r.simulated_seconds > 0 ? r.generated_tokens / r.simulated_seconds : 0.0);
  const nlohmann::json report = {
      {"benchmark", "simulate"},
      {"devices", c.devices},
      {"clouds", c.clouds},
      {"duration_s", c.duration_s},
      {"rate_per_minute", args.rate_per_minute},
      {"prompts", c.workload.prompts},
      {"output_tokens", c.workload.output_tokens},
      {"step_time_source", step_source},
      {"requests", {{"arrived", r.requests_arrived}, {"finished", r.requests_finished},
                    {"refused", r.requests_rejected}}},
      {"ttft_s", bench::LatencyJson(r.ttft_s)},
      {"tbt_s", bench::LatencyJson(r.tbt_s)},
      {"e2e_s", bench::LatencyJson(r.e2e_s)},
      {"generated_tokens", r.generated_tokens},
      {"simulated_seconds", r.simulated_seconds},
      {"events", r.events},
      {"wall_seconds", wall},
      {"per_cloud", clouds}};
  return ReportOrFail(report, args.json_path);
}

}  // namespace tophat::cli
