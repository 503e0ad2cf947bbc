#include "cli/simulate_command.h"

#include <time.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/cdf_plot.h"
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

// One recorded run to replay, with what was measured.
struct ReplayCell {
  const sim::RecordedAblation* recorded = nullptr;
  const sim::RecordedRun* run = nullptr;
  LatencySummary ttft;  // measured
  LatencySummary tbt;   // measured, each request's mean TBT
  bool held_out = false;  // a validation cell, not used by --calibrate's fit
};

// The simulation of one recorded run: its own requests, devices, links, delay, chunk size and
// the cloud's own step curve (unless the command line gave step times), on `device`'s compute.
absl::StatusOr<sim::SimResult> SimulateCell(const SimulateArgs& args, bool steps_given,
                                            const ReplayCell& cell,
                                            const sim::DeviceProfile& device) {
  const sim::RecordedAblation& recorded = *cell.recorded;
  const sim::RecordedRun& run = *cell.run;
  sim::SimConfig c = args.config;
  c.device = device;
  if (const auto curve = recorded.step_curves.find(run.config);
      !steps_given && curve != recorded.step_curves.end() && !curve->second.empty()) {
    c.cloud.step_time = curve->second;
  }
  c.devices = static_cast<int64_t>(recorded.links.size());
  c.device_links = recorded.links;
  c.device.one_way_delay_s = recorded.one_way_delay_s;
  c.bytes_per_token = recorded.bytes_per_token;
  c.replay = run.requests;
  if (run.chunk_size > 0) c.prompt_chunk = run.chunk_size;
  c.duration_s = 1;
  for (const sim::ReplayRequest& r : run.requests) c.duration_s = std::max(c.duration_s, r.arrival_s + 1);
  return sim::Simulate(c);
}

// How far a simulation is from its cell: the mean |ln(sim / real)| over the p50 and p90 of
// TTFT and of each request's mean TBT (a symmetric relative error).
double CellError(const ReplayCell& cell, const sim::SimResult& simulated) {
  double sum = 0;
  int n = 0;
  for (const auto& [real, sim] : {std::pair{cell.ttft.p50, simulated.ttft_s.p50},
                                  std::pair{cell.ttft.p90, simulated.ttft_s.p90},
                                  std::pair{cell.tbt.p50, simulated.request_tbt_s.p50},
                                  std::pair{cell.tbt.p90, simulated.request_tbt_s.p90}}) {
    if (real <= 0 || sim <= 0) return 1e9;
    sum += std::abs(std::log(sim / real));
    ++n;
  }
  return sum / n;
}

// --calibrate: the device's compute times that best fit the cells not held out. Two numbers
// are fitted: the device's seconds per prompt position (input and output submodels, split
// evenly) and per decode token (the same). First a grid over four decades each (8 points a
// decade, steps of 33%), then a finer grid (16 points a coarse step, steps of 1.8%) over the
// coarse steps on either side of its best: the coarse steps alone moved some cells by more
// than the 10% the fit is judged by. Everything else is measured in the report (links,
// delay, the cloud's step curve, each request's chunk).
sim::DeviceProfile Calibrate(const SimulateArgs& args, bool steps_given,
                             const std::vector<ReplayCell>& cells, double* best_error) {
  sim::DeviceProfile best = args.config.device;
  *best_error = 1e18;
  double best_prompt_exponent = 0;  // log10 of the seconds
  double best_decode_exponent = 0;
  const auto search = [&](double prompt_from, double decode_from, double step, int steps) {
    for (int i = 0; i < steps; ++i) {
      const double prompt_exponent = prompt_from + i * step;
      for (int j = 0; j < steps; ++j) {
        const double decode_exponent = decode_from + j * step;
        sim::DeviceProfile device = args.config.device;
        device.input_seconds_per_token = device.output_seconds_per_token =
            std::pow(10.0, prompt_exponent) / 2;
        device.input_decode_seconds = device.output_decode_seconds =
            std::pow(10.0, decode_exponent) / 2;
        double error = 0;
        int used = 0;
        for (const ReplayCell& cell : cells) {
          if (cell.held_out) continue;
          auto simulated = SimulateCell(args, steps_given, cell, device);
          error += simulated.ok() ? CellError(cell, *simulated) : 1e9;
          ++used;
        }
        error /= std::max(1, used);
        if (error < *best_error) {
          *best_error = error;
          best = device;
          best_prompt_exponent = prompt_exponent;
          best_decode_exponent = decode_exponent;
        }
      }
    }
  };
  constexpr double kCoarse = 1.0 / 8;
  search(-5, -4, kCoarse, 33);  // 0.01 ms ... 100 ms a position; 0.1 ms ... 1 s a token
  constexpr int kFinePerCoarse = 16;
  search(best_prompt_exponent - kCoarse, best_decode_exponent - kCoarse,
         kCoarse / kFinePerCoarse, 2 * kFinePerCoarse + 1);
  return best;
}

// --replay: each recorded run of the chosen configuration, simulated with its own requests.
int RunReplay(const SimulateArgs& args, bool steps_given) {
  std::vector<sim::RecordedAblation> reports;
  const std::vector<std::string> paths = absl::StrSplit(args.replay, ',', absl::SkipEmpty());
  for (const std::string& path : paths) {
    auto recorded = sim::LoadAblationReport(path);
    if (!recorded.ok()) {
      std::fprintf(stderr, "tophat simulate: --replay: %s\n",
                   std::string(recorded.status().message()).c_str());
      return 2;
    }
    reports.push_back(*std::move(recorded));
  }
  std::vector<ReplayCell> cells;
  std::string config_name = args.replay_config;
  double highest_rate = 0;
  for (const sim::RecordedAblation& recorded : reports) {
    for (const sim::RecordedRun& run : recorded.runs) {
      if (config_name.empty()) config_name = run.config;
      if (run.config != config_name || run.requests.empty()) continue;
      cells.push_back({.recorded = &recorded, .run = &run, .ttft = Summarize(run.ttft_s),
                       .tbt = Summarize(run.mean_tbt_s)});
      highest_rate = std::max(highest_rate, run.rate);
    }
  }
  if (cells.empty()) {
    std::fprintf(stderr, "tophat simulate: --replay: %s has no runs of configuration '%s'\n",
                 args.replay.c_str(), config_name.c_str());
    return 2;
  }
  sim::DeviceProfile device = args.config.device;
  nlohmann::json calibration = nullptr;
  if (args.calibrate) {
    const double hold_out = args.hold_out_rate < 0 ? highest_rate : args.hold_out_rate;
    int fitted_on = 0;
    for (ReplayCell& cell : cells) {
      cell.held_out = std::abs(cell.run->rate - hold_out) < 1e-9;
      fitted_on += cell.held_out ? 0 : 1;
    }
    if (fitted_on == 0) {
      std::fprintf(stderr, "tophat simulate: --calibrate: every run is at %g req/s, the rate "
                   "held out; give --hold-out-rate another (or 0 for none)\n", hold_out);
      return 2;
    }
    double error = 0;
    device = Calibrate(args, steps_given, cells, &error);
    const double prompt_ms = 1e3 * (device.input_seconds_per_token + device.output_seconds_per_token);
    const double decode_ms = 1e3 * (device.input_decode_seconds + device.output_decode_seconds);
    const std::string held_out =
        hold_out > 0 ? absl::StrFormat("held out: those at %g req/s", hold_out) : "none held out";
    std::printf("calibrated on %d run(s) (%s): the device takes %.3f ms per prompt position and "
                "%.3f ms per decode token (input and output submodels together); mean "
                "|ln(sim/real)| %.3f\n",
                fitted_on, held_out.c_str(), prompt_ms, decode_ms, error);
    calibration = {{"fitted_runs", fitted_on},
                   {"held_out_rate", hold_out},
                   {"device_ms_per_prompt_position", prompt_ms},
                   {"device_ms_per_decode_token", decode_ms},
                   {"mean_abs_log_error", error}};
  }
  std::printf("replaying %s against this simulation (error: simulated vs measured); cloud "
              "step times: %s\n",
              args.replay.c_str(),
              steps_given ? "from the command line"
              : reports.front().step_curves.empty()
                  ? "the built-in H200 profile (the report has no curve of its cloud's)"
                  : "the cloud's own curve from the report");
  std::printf("%-12s %-10s %5s %4s %-8s | %-23s | %-23s | %-23s | %-23s | %s\n", "config",
              "dataset", "req/s", "dev", "use", "TTFT p50 ms real/sim", "TTFT p90 ms real/sim",
              "TBT p50 ms real/sim", "TBT p90 ms real/sim", "cores: cloud+agents/host");
  nlohmann::json out = nlohmann::json::array();
  // Cells within 10% of the measured value, of all, for fitted and held-out runs.
  int within[2] = {0, 0};
  int counted[2] = {0, 0};
  for (const ReplayCell& cell : cells) {
    const sim::RecordedRun& run = *cell.run;
    auto simulated = SimulateCell(args, steps_given, cell, device);
    if (!simulated.ok()) {
      std::fprintf(stderr, "tophat simulate: %s\n", std::string(simulated.status().message()).c_str());
      return 2;
    }
    const LatencySummary& sim_ttft = simulated->ttft_s;
    const LatencySummary& sim_tbt = simulated->request_tbt_s;
    for (const auto& [real, sim] : {std::pair{cell.ttft.p50, sim_ttft.p50},
                                    std::pair{cell.ttft.p90, sim_ttft.p90},
                                    std::pair{cell.tbt.p50, sim_tbt.p50},
                                    std::pair{cell.tbt.p90, sim_tbt.p90}}) {
      within[cell.held_out] += std::abs(Percent(sim, real)) <= 10 ? 1 : 0;
      ++counted[cell.held_out];
    }
    const auto show = [](double real, double sim) {
      return absl::StrFormat("%7.1f/%7.1f %+5.0f%%", 1e3 * real, 1e3 * sim, Percent(sim, real));
    };
    const char* use = !args.calibrate ? "-" : cell.held_out ? "held out" : "fitted";
    const std::string cores =
        run.host_cores > 0 ? absl::StrFormat("%.2f+%.2f/%.0f", run.cloud_cores, run.agent_cores,
                                             run.host_cores)
                           : "-";
    std::printf("%-12s %-10s %5.2f %4zu %-8s | %s | %s | %s | %s | %s\n", run.config.c_str(),
                run.dataset.c_str(), run.rate, cell.recorded->links.size(), use,
                show(cell.ttft.p50, sim_ttft.p50).c_str(), show(cell.ttft.p90, sim_ttft.p90).c_str(),
                show(cell.tbt.p50, sim_tbt.p50).c_str(), show(cell.tbt.p90, sim_tbt.p90).c_str(),
                cores.c_str());
    out.push_back({{"config", run.config}, {"dataset", run.dataset}, {"rate", run.rate},
                   {"devices", cell.recorded->links.size()}, {"requests", run.requests.size()},
                   {"held_out", cell.held_out},
                   {"cores", {{"cloud", run.cloud_cores}, {"agents", run.agent_cores},
                              {"host", run.host_cores}}},
                   {"measured", {{"ttft_s", bench::LatencyJson(cell.ttft)},
                                 {"request_tbt_s", bench::LatencyJson(cell.tbt)}}},
                   {"simulated", {{"ttft_s", bench::LatencyJson(sim_ttft)},
                                  {"request_tbt_s", bench::LatencyJson(sim_tbt)}}}});
  }
  std::printf("within 10%%: %d of %d percentiles%s", within[0], counted[0],
              args.calibrate ? " of the fitted runs" : "");
  if (counted[1] > 0) std::printf(", %d of %d of the held-out runs", within[1], counted[1]);
  std::printf("\n");
  const nlohmann::json report = {{"benchmark", "simulate_replay"},
                                 {"report", args.replay},
                                 {"calibration", calibration},
                                 {"within_10_percent",
                                  {{"fitted", within[0]}, {"fitted_of", counted[0]},
                                   {"held_out", within[1]}, {"held_out_of", counted[1]}}},
                                 {"cells", out}};
  return ReportOrFail(report, args.json_path);
}

// --sweep-devices: the same fleet at each size, one table row and one point of the plot each.
int RunSweep(const SimulateArgs& args, const std::string& step_source) {
  std::printf("tophat simulate: %lld cloud(s), %.0f s of arrivals at %.2f/min per device, %s "
              "prompts, %lld output tokens; cloud step times: %s; each cloud runs %lld "
              "sessions at once, %lld waiting\n",
              static_cast<long long>(args.config.clouds), args.config.duration_s,
              args.rate_per_minute, args.config.workload.prompts.c_str(),
              static_cast<long long>(args.config.workload.output_tokens), step_source.c_str(),
              static_cast<long long>(args.config.cloud.max_running_sessions),
              static_cast<long long>(args.config.cloud.max_waiting_sessions));
  std::printf("%8s | %10s | %10s | %10s | %10s | %9s | %17s | %8s\n", "devices", "TTFT p50 s",
              "TTFT p90 s", "TBT p50 ms", "TBT p90 ms", "busiest", "finished/arrived",
              "refused");
  nlohmann::json rows = nlohmann::json::array();
  bench::LinePanel ttft{"TTFT by fleet size", "devices", "TTFT (s)", /*log_y=*/true,
                        {{"p50", {}}, {"p90", {}}}};
  bench::LinePanel tbt{"TBT by fleet size", "devices", "TBT (ms)", /*log_y=*/false,
                       {{"p50", {}}, {"p90", {}}}};
  for (const int64_t devices : args.sweep_devices) {
    sim::SimConfig c = args.config;
    c.devices = devices;
    auto result = sim::Simulate(c);
    if (!result.ok()) {
      std::fprintf(stderr, "tophat simulate: %lld devices: %s\n", static_cast<long long>(devices),
                   std::string(result.status().message()).c_str());
      return 2;
    }
    const sim::SimResult& r = *result;
    double busiest = 0;
    for (const sim::CloudStats& cloud : r.clouds) {
      busiest = std::max(busiest, r.simulated_seconds > 0 ? cloud.busy_seconds / r.simulated_seconds : 0);
    }
    std::printf("%8lld | %10.2f | %10.2f | %10.1f | %10.1f | %8.0f%% | %8lld/%-8lld | %8lld\n",
                static_cast<long long>(devices), r.ttft_s.p50, r.ttft_s.p90, 1e3 * r.tbt_s.p50,
                1e3 * r.tbt_s.p90, 100 * busiest, static_cast<long long>(r.requests_finished),
                static_cast<long long>(r.requests_arrived),
                static_cast<long long>(r.requests_rejected + r.requests_refused));
    const double n = static_cast<double>(devices);
    if (r.requests_finished > 0) {
      ttft.series[0].points.push_back({n, r.ttft_s.p50});
      ttft.series[1].points.push_back({n, r.ttft_s.p90});
      tbt.series[0].points.push_back({n, 1e3 * r.tbt_s.p50});
      tbt.series[1].points.push_back({n, 1e3 * r.tbt_s.p90});
    }
    rows.push_back({{"devices", devices},
                    {"ttft_s", bench::LatencyJson(r.ttft_s)},
                    {"tbt_s", bench::LatencyJson(r.tbt_s)},
                    {"busiest_cloud_busy_fraction", busiest},
                    {"requests", {{"arrived", r.requests_arrived},
                                  {"finished", r.requests_finished},
                                  {"refused", r.requests_rejected},
                                  {"refused_waiting_full", r.requests_refused}}}});
  }
  if (!args.plot_path.empty()) {
    const std::vector<bench::LinePanel> panels = {ttft, tbt};
    if (absl::Status s = bench::WriteLinePlotPng(args.plot_path, panels); !s.ok()) {
      std::fprintf(stderr, "tophat simulate: --plot: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    std::printf("plot: %s\n", args.plot_path.c_str());
  }
  const nlohmann::json report = {{"benchmark", "simulate_sweep"},
                                 {"clouds", args.config.clouds},
                                 {"duration_s", args.config.duration_s},
                                 {"rate_per_minute", args.rate_per_minute},
                                 {"prompts", args.config.workload.prompts},
                                 {"step_time_source", step_source},
                                 {"max_running_sessions", args.config.cloud.max_running_sessions},
                                 {"max_waiting_sessions", args.config.cloud.max_waiting_sessions},
                                 {"sweep", rows}};
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
  cmd->add_option("--stages", c.cloud.stages,
                  "Pipeline stages of each cloud (even; up to this many steps in flight)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--max-batch-tokens", c.cloud.max_batch_tokens, "The cloud's token budget")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--max-running-sessions", c.cloud.max_running_sessions,
                  "scheduler.max_running_sessions: sessions a cloud runs at once (and puts into "
                  "one step); more wait for admission")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--max-waiting-sessions", c.cloud.max_waiting_sessions,
                  "scheduler.max_waiting_sessions: sessions that may wait for admission; an "
                  "open beyond them is refused and its request fails")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--decode-step-stretch", c.cloud.decode_step_stretch,
                  "scheduler.decode_step_stretch: while another device decodes, a device's "
                  "prompts may make a step at most this many times the decode work's (0: no cap)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
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
  cmd->add_option("--draft-tokens", c.device.draft_tokens,
                  "Speculative decoding: drafts per decode round (0: off)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--acceptance", c.device.acceptance,
                  "Speculative decoding: the probability that a draft is accepted (each, up to "
                  "the first that is not)")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--draft-ms", args.draft_ms, "Speculative decoding: the drafter's time a draft")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--pacing-lead-ms", args.pacing_lead_ms,
                  "The agents' uplink pacing (uplink_pacing.lead_s, the agent's own pacer): "
                  "prompt chunks wait on the device for the cloud's receipts, at most two "
                  "unacknowledged, the second going this long before the first should have "
                  "crossed; decode messages pass the held ones (negative: no pacing, one FIFO "
                  "queue)")
      ->capture_default_str();
  cmd->add_option("--device-concurrency", c.device.concurrent_requests,
                  "Requests a device runs at once, sharing its compute and links (0: no limit, "
                  "an agent serving several apps)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--host-cores", c.host_cores,
                  "Model a shared host: every device computes on these cores, beside the "
                  "clouds, sharing them equally (as the agents and the cloud of a test on one "
                  "machine; 0: each device on a CPU of its own)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--host-cloud-cores", c.host_cloud_cores,
                  "With --host-cores: the cores a cloud takes while a step of its is in flight")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--cloud-outage", args.outages,
                  "CLOUD@DOWN_S or CLOUD@DOWN_S-UP_S (repeat): that cloud stops at DOWN_S, its "
                  "requests replaying on the others, and comes back empty at UP_S");
  cmd->add_option("--failover-detect-ms", args.failover_detect_ms,
                  "How long the agents take to notice a cloud is gone (a killed process: 0)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--replay", args.replay,
                  "Replay the runs of `tophat bench --ablation` JSON reports (comma-separated; "
                  "their requests, devices, links and chunk sizes) and compare the simulated "
                  "TTFT and TBT with the measured ones");
  cmd->add_flag("--calibrate", args.calibrate,
                "With --replay: first fit the device's compute times (per prompt position, per "
                "decode token) to the runs not held out, then replay all with them");
  cmd->add_option("--hold-out-rate", args.hold_out_rate,
                  "With --calibrate: the runs at this request rate are validation, left out of "
                  "the fit (default: the highest rate; 0: none)");
  cmd->add_option("--replay-config", args.replay_config,
                  "The report's configuration to replay (default: its first)");
  cmd->add_option("--sweep-devices", args.sweep_devices,
                  "Simulate the fleet at each of these sizes (comma-separated) instead of "
                  "--devices: a row each, and with --plot, TTFT and TBT against the size")
      ->delimiter(',')->check(CLI::PositiveNumber);
  cmd->add_option("--plot", args.plot_path, "With --sweep-devices: write the plot here (PNG)");
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
  c.device.draft_step_seconds = args.draft_ms / 1e3;
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

  c.failover_detect_s = args.failover_detect_ms / 1e3;
  for (const std::string& outage : args.outages) {
    // CLOUD@DOWN_S or CLOUD@DOWN_S-UP_S
    const std::vector<std::string> at = absl::StrSplit(outage, '@');
    sim::CloudOutage o;
    bool ok = at.size() == 2 && absl::SimpleAtoi(at[0], &o.cloud);
    if (ok) {
      const std::vector<std::string> times = absl::StrSplit(at[1], '-');
      ok = (times.size() == 1 || times.size() == 2) && absl::SimpleAtod(times[0], &o.down_at_s) &&
           (times.size() == 1 || absl::SimpleAtod(times[1], &o.up_at_s));
    }
    if (!ok) {
      std::fprintf(stderr, "tophat simulate: --cloud-outage '%s': expected CLOUD@DOWN_S or "
                   "CLOUD@DOWN_S-UP_S\n", outage.c_str());
      return 2;
    }
    c.outages.push_back(o);
  }
  if (!args.replay.empty()) {
    return RunReplay(args, !args.step_profile.empty() || !args.step_points.empty());
  }
  if (!args.sweep_devices.empty()) return RunSweep(args, step_source);

  // The simulator runs on this thread alone: its CPU time is the cost of the run, and unlike
  // the wall time it does not grow when other processes share the core.
  const auto thread_cpu_seconds = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = thread_cpu_seconds();
  auto result = sim::Simulate(c);
  const double cpu = thread_cpu_seconds() - cpu0;
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
  std::printf("cloud step times: %s; each cloud runs %lld sessions at once, %lld waiting; "
              "links %.1f/%.1f Mbit/s up/down, %.1f ms one way\n",
              step_source.c_str(), static_cast<long long>(c.cloud.max_running_sessions),
              static_cast<long long>(c.cloud.max_waiting_sessions), args.uplink_mbit,
              args.downlink_mbit, args.delay_ms);
  std::printf("requests: %lld arrived, %lld finished, %lld refused (larger than a cloud's KV), "
              "%lld refused (a cloud's waiting sessions full), %lld failed over\n",
              static_cast<long long>(r.requests_arrived),
              static_cast<long long>(r.requests_finished),
              static_cast<long long>(r.requests_rejected),
              static_cast<long long>(r.requests_refused), static_cast<long long>(r.failovers));
  std::printf("%-8s | %9s | %9s | %9s | %9s\n", "latency", "mean", "p50", "p90", "p99");
  const auto row = [](const char* name, const LatencySummary& s, double scale) {
    std::printf("%-8s | %9.3f | %9.3f | %9.3f | %9.3f\n", name, s.mean * scale, s.p50 * scale,
                s.p90 * scale, s.p99 * scale);
  };
  row("TTFT s", r.ttft_s, 1);
  row("TBT ms", r.tbt_s, 1e3);
  row("e2e s", r.e2e_s, 1);
  std::printf("%-8s | %9s | %9s | %9s | %10s | %11s | %11s | %9s | %11s\n", "cloud",
              "sessions", "steps", "busy", "mean batch", "max running", "max waiting",
              "refused", "failed over");
  nlohmann::json clouds = nlohmann::json::array();
  for (size_t i = 0; i < r.clouds.size(); ++i) {
    const sim::CloudStats& s = r.clouds[i];
    const double busy = r.simulated_seconds > 0 ? s.busy_seconds / r.simulated_seconds : 0;
    const double batch = s.steps > 0 ? s.batched_tokens / static_cast<double>(s.steps) : 0;
    std::printf("%-8zu | %9lld | %9lld | %8.1f%% | %10.1f | %11lld | %11lld | %9lld | %11lld\n",
                i, static_cast<long long>(s.sessions), static_cast<long long>(s.steps),
                100 * busy, batch, static_cast<long long>(s.max_running),
                static_cast<long long>(s.max_waiting), static_cast<long long>(s.refused),
                static_cast<long long>(s.failed_over));
    clouds.push_back({{"sessions", s.sessions}, {"steps", s.steps}, {"busy_fraction", busy},
                      {"mean_batch_tokens", batch}, {"max_running", s.max_running},
                      {"max_waiting", s.max_waiting},
                      {"refused", s.refused}, {"failed_over", s.failed_over}});
  }
  std::printf("simulated %.1f s (%lld events) in %.2f s of wall time (%.2f s of CPU); %.0f "
              "tokens/s generated\n",
              r.simulated_seconds, static_cast<long long>(r.events), wall, cpu,
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
      {"max_running_sessions", c.cloud.max_running_sessions},
      {"max_waiting_sessions", c.cloud.max_waiting_sessions},
      {"requests", {{"arrived", r.requests_arrived}, {"finished", r.requests_finished},
                    {"refused", r.requests_rejected}, {"refused_waiting_full", r.requests_refused},
                    {"failed_over", r.failovers}}},
      {"ttft_s", bench::LatencyJson(r.ttft_s)},
      {"tbt_s", bench::LatencyJson(r.tbt_s)},
      {"e2e_s", bench::LatencyJson(r.e2e_s)},
      {"generated_tokens", r.generated_tokens},
      {"simulated_seconds", r.simulated_seconds},
      {"events", r.events},
      {"wall_seconds", wall},
      {"cpu_seconds", cpu},
      {"per_cloud", clouds}};
  return ReportOrFail(report, args.json_path);
}

}  // namespace tophat::cli
