#include "bench/ablation.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/cdf_plot.h"
#include "bench/edge_links.h"
#include "bench/process_control.h"
#include "base/status_macros.h"

namespace tophat::bench {
namespace fs = std::filesystem;

std::vector<AblationConfig> AblationConfigs() {
  return {
      {.name = "U-shape",
       .description = "device/cloud split, whole prompt in one piece, no drafting"},
      {.name = "+spec",
       .description = "speculative decoding with the on-device drafter",
       .speculative = true},
      {.name = "+chunk",
       .description = "pipelined prompt chunks sized per device by the cloud",
       .chunking = ChunkMode::kAdaptive},
      {.name = "+spec+chunk",
       .description = "both, no parallel drafting",
       .speculative = true,
       .chunking = ChunkMode::kAdaptive},
      {.name = "+parallel",
       .description = "everything on (HAT): both plus parallel drafting",
       .speculative = true,
       .parallel_drafting = true,
       .chunking = ChunkMode::kAdaptive},
      {.name = "+pipeinfer",
       .description = "+parallel, and the best branch drafted ahead sent before its "
                      "verification returns (PipeInfer: max_runs_in_flight 2)",
       .speculative = true,
       .parallel_drafting = true,
       .chunking = ChunkMode::kAdaptive,
       .runs_in_flight = 2},
      {.name = "U-Sarathi-128",
       .description = "fixed 128-token chunks, each answered before the next is sent",
       .chunking = ChunkMode::kFixed,
       .fixed_chunk = 128,
       .pipeline_chunks = false},
      {.name = "U-Sarathi-256",
       .description = "fixed 256-token chunks, each answered before the next is sent",
       .chunking = ChunkMode::kFixed,
       .fixed_chunk = 256,
       .pipeline_chunks = false},
      {.name = "+jupiter",
       .description = "+chunk with chunks of unequal length, planned by Jupiter's DP over each "
                      "pipeline stage's measured cost (prompt_chunk_plan: jupiter)",
       .chunking = ChunkMode::kAdaptive,
       .chunk_plan = "jupiter"},
  };
}

absl::StatusOr<std::vector<AblationConfig>> SelectAblationConfigs(const std::string& names) {
  const std::vector<AblationConfig> all = AblationConfigs();
  if (names.empty() || names == "all") return all;
  std::vector<AblationConfig> chosen;
  for (absl::string_view name : absl::StrSplit(names, ',', absl::SkipEmpty())) {
    auto it = std::find_if(all.begin(), all.end(),
                           [&](const AblationConfig& c) { return c.name == name; });
    if (it == all.end()) {
      std::vector<std::string> known;
      for (const AblationConfig& c : all) known.push_back(c.name);
      return absl::InvalidArgumentError(absl::StrCat("--configs: unknown configuration \"",
                                                     std::string(name), "\"; known: ",
                                                     absl::StrJoin(known, ", ")));
    }
    chosen.push_back(*it);
  }
  if (chosen.empty()) return absl::InvalidArgumentError("--configs: none given");
  return chosen;
}

DeviceLink DeviceLinkAt(int index, int devices, const BandwidthRange& uplink,
                        const BandwidthRange& downlink, double draw_up, double draw_down,
                        double scale) {
  const auto at = [&](const BandwidthRange& range, double draw) {
    const double slice = (range.max_bytes_per_second - range.min_bytes_per_second) /
                         std::max(1, devices);
    return scale * (range.min_bytes_per_second + slice * (index + std::clamp(draw, 0.0, 1.0)));
  };
  return {.uplink_bytes_per_second = at(uplink, draw_up),
          .downlink_bytes_per_second = at(downlink, draw_down)};
}

std::string AgentYaml(const AblationConfig& config, const AblationOptions& options,
                      const AgentSlot& slot) {
  int64_t chunk = 0;
  switch (config.chunking) {
    case ChunkMode::kWholePrompt:
      chunk = options.max_context;
      break;
    case ChunkMode::kAdaptive:
      chunk = 0;
      break;
    case ChunkMode::kFixed:
      chunk = config.fixed_chunk;
      break;
  }
  return absl::StrFormat(
      "# %s (device %d): %s\n"
      "listen_address: \"%s\"\n"
      "allow_remote_apps: %s\n"
      "cloud_address: \"%s\"\n"
      "bundle: \"%s\"\n"
      "cloud_tls:\n  insecure: true\n"
      "max_context: %d\n"
      "prompt_chunk_size: %d\n"
      "pipeline_prompt_chunks: %s\n"
      "prompt_chunk_plan: %s\n"
      "wire_dtype: %s\n"
      "max_concurrent_requests: 256\n"
      "default_max_new_tokens: %d\n"
      "speculative:\n"
      "  enabled: %s\n"
      "  parallel_drafting: %s\n"
      "  max_runs_in_flight: %d\n"
      "uplink_pacing:\n"
      "  enabled: %s\n"
      // Every rate and dataset reuses the seed's prompts: kept conversations would answer
      // the second run's from the first's KV and measure the cache, not HAT's mechanisms.
      "conversation_cache:\n"
      "  enabled: false\n"
      "link_emulation:\n"
      "  one_way_delay_s: %.6f\n"
      "  uplink_bytes_per_second: %.0f\n"
      "  downlink_bytes_per_second: %.0f\n"
      "metrics_address: \"%s\"\n",
      config.name, slot.index, config.description, slot.listen_address,
      // Over emulated links each agent listens on its namespace's address, where the
      // benchmark's client reaches it from the host namespace.
      slot.listen_address.rfind("127.", 0) == 0 ? "false" : "true", slot.cloud_address,
      fs::absolute(options.device_bundle).string(), options.max_context, chunk,
      config.pipeline_chunks ? "true" : "false", config.chunk_plan, options.wire_dtype, std::min<int64_t>(128, options.max_context - 1),
      config.speculative ? "true" : "false", config.parallel_drafting ? "true" : "false",
      config.runs_in_flight, options.uplink_pacing ? "true" : "false", slot.one_way_delay_s, slot.uplink_bytes_per_second, slot.downlink_bytes_per_second,
      slot.metrics_address);
}

std::vector<int64_t> EvenStageBoundaries(int64_t begin, int64_t end, int stages) {
  std::vector<int64_t> boundaries = {begin};
  const int64_t layers = end - begin;
  for (int i = 0; i < stages; ++i) {
    boundaries.push_back(boundaries.back() + layers / stages + (i < layers % stages ? 1 : 0));
  }
  return boundaries;
}

std::string CloudYaml(const AblationOptions& options, const std::string& listen_address,
                      const std::string& metrics_address, const std::string& rendezvous_address) {
  std::string yaml = absl::StrFormat(
      "listen_address: \"%s\"\n"
      "bundle: \"%s\"\n"
      "tls:\n  insecure: true\n"
      "max_context: %d\n"
      "kv_cache:\n"
      "  memory_bytes: 1GiB\n"
      "scheduler:\n"
      "  max_running_sessions: 256\n"
      "  max_waiting_sessions: 256\n"
      "limits:\n"
      "  max_chunk_tokens: %d\n"
      "metrics_address: \"%s\"\n",
      listen_address, fs::absolute(options.cloud_bundle).string(), options.max_context,
      options.max_context, metrics_address);
  if (options.cloud_stages > 1) {
    // The stages share this host: each computes on its share of the cores, so that the
    // pipeline has the one cloud's cores, not more.
    const int64_t threads = std::max<int64_t>(
        1, static_cast<int64_t>(std::thread::hardware_concurrency()) / options.cloud_stages);
    absl::StrAppend(&yaml, "pipeline:\n  rendezvous_address: \"", rendezvous_address,
                    "\"\n  layer_boundaries: [",
                    absl::StrJoin(EvenStageBoundaries(options.middle_begin, options.middle_end,
                                                      options.cloud_stages),
                                  ", "),
                    "]\n  compute_threads: [",
                    absl::StrJoin(std::vector<int64_t>(options.cloud_stages, threads), ", "),
                    "]\n");
  }
  return yaml;
}

namespace {

using Clock = std::chrono::steady_clock;

std::string LogTail(const ChildProcess& process) {
  std::string log = process.Log();
  if (log.size() > 2000) log = log.substr(log.size() - 2000);
  return log;
}

// The processes of one configuration; the destructor stops them (SIGTERM, then SIGKILL).
struct Deployment {
  std::unique_ptr<ChildProcess> cloud;
  std::vector<std::unique_ptr<ChildProcess>> cloud_stages;  // stages 1.. of a pipeline
  std::vector<std::unique_ptr<ChildProcess>> agents;
  std::vector<std::string> agent_addresses;
  std::vector<std::pair<std::string, int>> agent_metrics;  // host, port
  int cloud_metrics_port = 0;

  // CPU seconds the cloud's processes and the agents have used so far.
  std::pair<double, double> CpuSecondsSoFar() const {
    double cloud_seconds = cloud ? CpuSeconds(cloud->pid()) : 0;
    for (const auto& stage : cloud_stages) cloud_seconds += CpuSeconds(stage->pid());
    double agent_seconds = 0;
    for (const auto& agent : agents) agent_seconds += CpuSeconds(agent->pid());
    return {cloud_seconds, agent_seconds};
  }

  ~Deployment() {
    for (auto& agent : agents) agent->Signal(SIGTERM);
    for (auto& agent : agents) agent->Wait(std::chrono::seconds(10));
    if (cloud) {
      cloud->Signal(SIGTERM);
      cloud->Wait(std::chrono::seconds(10));
    }
    for (auto& stage : cloud_stages) stage->Signal(SIGTERM);
    for (auto& stage : cloud_stages) stage->Wait(std::chrono::seconds(10));
  }
};

struct LinkPlan {
  EdgeLinks* edge = nullptr;  // null: in-process shaping on loopback
  bool kernel_delay = false;
  double scale = 1;
  std::vector<DeviceLink> middle;  // each device's link at the middle of its slice
};

absl::StatusOr<std::unique_ptr<Deployment>> Deploy(const AblationConfig& config,
                                                   const AblationOptions& options,
                                                   const LinkPlan& links, const fs::path& dir) {
  fs::create_directories(dir);
  auto deployment = std::make_unique<Deployment>();
  const int cloud_port = FreePort();
  deployment->cloud_metrics_port = FreePort();
  const std::string cloud_listen =
      absl::StrCat(links.edge != nullptr ? "0.0.0.0" : "127.0.0.1", ":", cloud_port);
  TOPHAT_RETURN_IF_ERROR(WriteTextFile(
      dir / "cloud.yaml",
      CloudYaml(options, cloud_listen, absl::StrCat("127.0.0.1:", deployment->cloud_metrics_port),
                absl::StrCat("127.0.0.1:", FreePort()))));
  deployment->cloud = std::make_unique<ChildProcess>(
      std::vector<std::string>{(options.bin_dir / "tophat-cloud").string(), "--config",
                               (dir / "cloud.yaml").string()},
      dir / "cloud.log");
  for (int stage = 1; stage < options.cloud_stages; ++stage) {
    deployment->cloud_stages.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{(options.bin_dir / "tophat-cloud").string(), "--config",
                                 (dir / "cloud.yaml").string(), "--stage",
                                 std::to_string(stage)},
        dir / absl::StrCat("cloud-stage", stage, ".log")));
  }
  if (!WaitForPort(cloud_port, std::chrono::seconds(120))) {
    std::string logs = absl::StrCat((dir / "cloud.log").string(), ":\n", LogTail(*deployment->cloud));
    for (size_t i = 0; i < deployment->cloud_stages.size(); ++i) {
      absl::StrAppend(&logs, "\n", (dir / absl::StrCat("cloud-stage", i + 1, ".log")).string(),
                      ":\n", LogTail(*deployment->cloud_stages[i]));
    }
    return absl::UnavailableError(absl::StrCat("tophat-cloud did not start; ", logs));
  }
  for (int i = 0; i < options.devices; ++i) {
    AgentSlot slot{.index = i};
    std::vector<std::string> argv;
    std::string host = "127.0.0.1";
    int port = 0;
    int metrics_port = 0;
    if (links.edge != nullptr) {
      host = EdgeLinks::DeviceAddress(i);
      port = 7200;
      metrics_port = 9200;
      slot.cloud_address = absl::StrCat(EdgeLinks::HostAddress(i), ":", cloud_port);
      slot.one_way_delay_s = links.kernel_delay ? 0 : options.one_way_delay_s;
      argv = EdgeLinks::ExecPrefix(i);
    } else {
      port = FreePort();
      metrics_port = FreePort();
      slot.cloud_address = absl::StrCat("127.0.0.1:", cloud_port);
      slot.one_way_delay_s = options.one_way_delay_s;
      slot.uplink_bytes_per_second = links.middle[i].uplink_bytes_per_second;
      slot.downlink_bytes_per_second = links.middle[i].downlink_bytes_per_second;
    }
    slot.listen_address = absl::StrCat(host, ":", port);
    slot.metrics_address = absl::StrCat(host, ":", metrics_port);
    deployment->agent_metrics.emplace_back(host, metrics_port);
    const fs::path yaml = dir / absl::StrCat("agent-", i, ".yaml");
    TOPHAT_RETURN_IF_ERROR(WriteTextFile(yaml, AgentYaml(config, options, slot)));
    argv.push_back((options.bin_dir / "tophat-agent").string());
    argv.push_back("--config");
    argv.push_back(yaml.string());
    deployment->agents.push_back(
        std::make_unique<ChildProcess>(argv, dir / absl::StrCat("agent-", i, ".log")));
    deployment->agent_addresses.push_back(slot.listen_address);
    if (!WaitForPort(port, std::chrono::seconds(120), host)) {
      return absl::UnavailableError(absl::StrCat("tophat-agent ", i, " did not start; ",
                                                 (dir / absl::StrCat("agent-", i, ".log")).string(),
                                                 ":\n", LogTail(*deployment->agents.back())));
    }
  }
  return deployment;
}

// Share of the step-time predictions within 15% of the measured time, and the interpolated
// median error, from the cloud's error histogram.
struct PredictionFit {
  double observations = 0;
  double within_15_percent = 0;
  double median_error = 0;
};
PredictionFit ReadPredictionFit(int metrics_port) {
  PredictionFit fit;
  const std::string text = HttpGet(metrics_port, "/metrics");
  const std::string name = "tophat_scheduler_step_prediction_error_ratio";
  fit.observations = MetricValue(text, name + "_count").value_or(0);
  const std::vector<std::pair<double, double>> buckets = HistogramBuckets(text, name);
  if (fit.observations <= 0 || buckets.empty()) return fit;
  double below = 0;
  double lower_bound = 0;
  bool median_found = false;
  for (const auto& [bound, count] : buckets) {
    if (std::abs(bound - 0.15) < 1e-9) fit.within_15_percent = count / fit.observations;
    if (!median_found && count >= fit.observations / 2) {
      const double in_bucket = std::max(1e-9, count - below);
      fit.median_error =
          lower_bound + (bound - lower_bound) * (fit.observations / 2 - below) / in_bucket;
      median_found = true;
    }
    below = count;
    lower_bound = bound;
  }
  if (!median_found) fit.median_error = buckets.back().first;
  return fit;
}

// The cloud's step-time curve g(μ) as its metrics export it: (tokens, seconds) per bucket of
// batch sizes with data, by increasing tokens. `tophat simulate --replay` takes it as the
// cloud's step times.
nlohmann::json ReadStepCurve(int metrics_port) {
  const std::string text = HttpGet(metrics_port, "/metrics");
  nlohmann::json points = nlohmann::json::array();
  for (int64_t bucket = 1; bucket <= (int64_t{1} << 20); bucket *= 2) {
    const std::string label = absl::StrCat("bucket=\"", bucket, "\"");
    const std::optional<double> tokens =
        MetricValue(text, "tophat_scheduler_step_curve_tokens", label);
    const std::optional<double> seconds =
        MetricValue(text, "tophat_scheduler_step_curve_seconds", label);
    if (tokens && seconds && *tokens > 0 && *seconds > 0) points.push_back({*tokens, *seconds});
  }
  return points;
}

struct RunRecord {
  std::string config;
  std::string dataset;
  double rate = 0;
  WorkloadSummary summary;
  // TTFT per 128 prompt tokens (HAT's prefill SLA), prompts under 128 counting as 128.
  std::vector<double> prefill_ms_per_128;
  std::vector<double> decode_ms_per_10;    // delay per 10 generated tokens (decode SLA)
  std::vector<double> chunk_by_device;     // mean chunk size each device used
  double tokens_per_round = 0;
  // Decode chunks' time on the links (round trip less the cloud's queue and compute), pooled
  // over every request, and the median over requests of each one's slowest: far above twice
  // the one-way delay, decode rounds wait behind prompt chunks on the links.
  double decode_network_ms_mean = 0;
  double decode_network_max_ms_p50 = 0;
  nlohmann::json per_request = nlohmann::json::array();
  // Cores the cloud (its stages included) and the agents used on average during the run,
  // and the host's: on a host they share, how loaded it was (the simulator gives each device
  // a CPU of its own; docs/scale.md).
  double cloud_cores = 0;
  double agent_cores = 0;
  unsigned host_cores = 0;
};

RunRecord Record(const AblationConfig& config, const std::string& dataset, double rate,
                 const WorkloadRun& run, const AblationOptions& options) {
  RunRecord record{.config = config.name, .dataset = dataset, .rate = rate};
  record.summary = SummarizeRun(run, options.sla);
  std::vector<double> chunk_sum(options.devices, 0);
  std::vector<double> chunk_count(options.devices, 0);
  double rounds = 0;
  double decoded = 0;
  double network_seconds = 0;
  double network_chunks = 0;
  std::vector<double> network_max_ms;
  for (const RequestOutcome& outcome : run.outcomes) {
    const GenerateResult& r = outcome.result;
    const double ttft = r.time_to_first_token_seconds();
    const double tbt = r.mean_inter_token_seconds();
    nlohmann::json request = OutcomeJson(outcome);
    request["device"] = outcome.agent;
    record.per_request.push_back(std::move(request));
    if (!outcome.status.ok()) continue;
    // A prompt shorter than 128 tokens counts as one unit of 128: scaled up, its fixed
    // costs (two link latencies) would swamp the plot.
    const double prompt = std::max<uint32_t>(128, r.stats.prompt_tokens());
    record.prefill_ms_per_128.push_back(ttft * 1e3 * 128.0 / prompt);
    if (r.token_ids.size() > 1) record.decode_ms_per_10.push_back(tbt * 1e3 * 10.0);
    if (outcome.agent < chunk_sum.size()) {
      chunk_sum[outcome.agent] += r.stats.prompt_chunk_size();
      chunk_count[outcome.agent] += 1;
    }
    rounds += r.stats.decode_rounds();
    network_seconds += r.stats.decode_network_seconds();
    network_chunks += r.stats.decode_network_chunks();
    if (r.stats.decode_network_chunks() > 0) {
      network_max_ms.push_back(r.stats.decode_network_max_seconds() * 1e3);
    }
    decoded += r.token_ids.size() > 0 ? static_cast<double>(r.token_ids.size() - 1) : 0.0;
  }
  for (int i = 0; i < options.devices; ++i) {
    record.chunk_by_device.push_back(chunk_count[i] > 0 ? chunk_sum[i] / chunk_count[i] : 0);
  }
  record.tokens_per_round = rounds > 0 ? decoded / rounds : 0;
  record.decode_network_ms_mean = network_chunks > 0 ? network_seconds * 1e3 / network_chunks : 0;
  record.decode_network_max_ms_p50 = Summarize(network_max_ms).p50;
  return record;
}

const RunRecord* Find(const std::vector<RunRecord>& records, const std::string& config,
                      const std::string& dataset, double rate) {
  for (const RunRecord& r : records) {
    if (r.config == config && r.dataset == dataset && r.rate == rate) return &r;
  }
  return nullptr;
}

// Bandwidth that changes over time, as on HAT's testbed: every period each netns link gets a
// new point in its device's slice of the ranges.
class LinkVariation {
 public:
  LinkVariation(EdgeLinks* edge, const AblationOptions& options, double scale)
      : edge_(edge), options_(options), scale_(scale), rng_(options.seed ^ 0x11c0ffee) {
    if (edge_ == nullptr || options_.link_period_s <= 0) return;
    thread_ = std::thread([this] { Run(); });
  }
  ~LinkVariation() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    std::uniform_real_distribution<double> draw(0, 1);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!cv_.wait_for(lock, std::chrono::duration<double>(options_.link_period_s),
                         [&] { return stopping_; })) {
      for (int i = 0; i < edge_->devices(); ++i) {
        const DeviceLink link = DeviceLinkAt(i, edge_->devices(), options_.uplink,
                                             options_.downlink, draw(rng_), draw(rng_), scale_);
        auto shaped = edge_->Shape(i, link.uplink_bytes_per_second,
                                   link.downlink_bytes_per_second, options_.one_way_delay_s);
        if (!shaped.ok()) spdlog::warn("link variation: {}", shaped.status().ToString());
      }
    }
  }

  EdgeLinks* edge_;
  const AblationOptions& options_;
  double scale_;
  std::mt19937_64 rng_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

std::string DatasetLabel(const std::string& dataset) {
  if (dataset == "specbench") return "SpecBench-like";
  if (dataset == "cnndm") return "CNN/DM-like";
  return dataset;
}

void PrintTable(const std::vector<RunRecord>& records, const AblationOptions& options,
                const std::string& dataset, double rate) {
  std::printf("\n%s prompts, %.2f req/s, %lld requests x %lld tokens\n",
              DatasetLabel(dataset).c_str(), rate, static_cast<long long>(options.requests),
              static_cast<long long>(options.output_tokens));
  std::printf("%-14s %27s   %27s %6s %7s %6s %13s  %s\n", "", "TTFT ms (mean / p50 / p90)",
              "TBT ms (mean / p50 / p90)", "SLA %", "tok/s", "tok/rd", "net ms (max)",
              "chunk by device");
  for (const AblationConfig& config : options.configs) {
    const RunRecord* r = Find(records, config.name, dataset, rate);
    if (r == nullptr) continue;
    const WorkloadSummary& s = r->summary;
    std::vector<std::string> chunks;
    for (double c : r->chunk_by_device) chunks.push_back(absl::StrFormat("%.0f", c));
    std::printf("%-14s %9.1f %8.1f %8.1f   %9.2f %8.2f %8.2f %6.1f %7.1f %6.2f %6.1f %6.0f  %s%s\n",
                config.name.c_str(), s.ttft.mean * 1e3, s.ttft.p50 * 1e3, s.ttft.p90 * 1e3,
                s.tbt.mean * 1e3, s.tbt.p50 * 1e3, s.tbt.p90 * 1e3, s.sla_compliance * 100,
                s.output_tokens_per_second, r->tokens_per_round, r->decode_network_ms_mean,
                r->decode_network_max_ms_p50,
                absl::StrJoin(chunks, " / ").c_str(),
                s.failed > 0 ? absl::StrCat("  (", s.failed, " failed)").c_str() : "");
  }
}

// The goals as same-run ratios against U-shape (and U-Sarathi).
nlohmann::json Goals(const std::vector<RunRecord>& records, const AblationOptions& options) {
  nlohmann::json goals = nlohmann::json::array();
  for (const std::string& dataset : options.datasets) {
    for (double rate : options.rates) {
      const RunRecord* base = Find(records, "U-shape", dataset, rate);
      if (base == nullptr || base->summary.ttft.mean <= 0) continue;
      nlohmann::json row = {{"dataset", dataset}, {"rate", rate}};
      const auto reduction = [](double base_value, double value) {
        return base_value > 0 ? 1.0 - value / base_value : 0.0;
      };
      if (const RunRecord* chunk = Find(records, "+chunk", dataset, rate)) {
        row["ttft_reduction_chunking"] =
            reduction(base->summary.ttft.mean, chunk->summary.ttft.mean);
      }
      if (const RunRecord* jupiter = Find(records, "+jupiter", dataset, rate)) {
        row["ttft_reduction_jupiter"] =
            reduction(base->summary.ttft.mean, jupiter->summary.ttft.mean);
        if (const RunRecord* chunk = Find(records, "+chunk", dataset, rate)) {
          row["ttft_jupiter_vs_chunk"] =
              reduction(chunk->summary.ttft.mean, jupiter->summary.ttft.mean);
        }
      }
      if (const RunRecord* all = Find(records, "+parallel", dataset, rate)) {
        row["ttft_reduction_all_on"] = reduction(base->summary.ttft.mean, all->summary.ttft.mean);
        row["tbt_reduction_all_on"] = reduction(base->summary.tbt.mean, all->summary.tbt.mean);
        for (const char* sarathi : {"U-Sarathi-128", "U-Sarathi-256"}) {
          if (const RunRecord* s = Find(records, sarathi, dataset, rate)) {
            row[absl::StrCat("ttft_vs_", sarathi)] =
                reduction(s->summary.ttft.mean, all->summary.ttft.mean);
          }
        }
      }
      if (const RunRecord* ahead = Find(records, "+pipeinfer", dataset, rate)) {
        row["ttft_reduction_pipeinfer"] =
            reduction(base->summary.ttft.mean, ahead->summary.ttft.mean);
        row["tbt_reduction_pipeinfer"] = reduction(base->summary.tbt.mean, ahead->summary.tbt.mean);
      }
      goals.push_back(row);
    }
  }
  return goals;
}

void PrintGoals(const nlohmann::json& goals) {
  std::printf("\nSame-run ratios (reduction of the mean; goals: TTFT -41%% with chunking, "
              "TBT -49.5%% all on, TTFT below U-Sarathi)\n");
  std::printf("%-16s %6s %14s %14s %14s %14s %14s %14s %14s %16s\n", "dataset", "req/s",
              "TTFT +chunk", "TTFT all-on", "TBT all-on", "vs Sarathi128", "vs Sarathi256",
              "TBT pipeinfer", "TTFT +jupiter", "jupiter vs chunk");
  for (const nlohmann::json& row : goals) {
    const auto cell = [&](const char* key) {
      return row.contains(key) ? absl::StrFormat("%+.1f%%", -100.0 * row[key].get<double>())
                               : std::string("-");
    };
    std::printf("%-16s %6.2f %14s %14s %14s %14s %14s %14s %14s %16s\n",
                DatasetLabel(row["dataset"].get<std::string>()).c_str(),
                row["rate"].get<double>(), cell("ttft_reduction_chunking").c_str(),
                cell("ttft_reduction_all_on").c_str(), cell("tbt_reduction_all_on").c_str(),
                cell("ttft_vs_U-Sarathi-128").c_str(), cell("ttft_vs_U-Sarathi-256").c_str(),
                cell("tbt_reduction_pipeinfer").c_str(), cell("ttft_reduction_jupiter").c_str(),
                cell("ttft_jupiter_vs_chunk").c_str());
  }
}

}  // namespace

absl::StatusOr<nlohmann::json> RunAblation(const AblationOptions& options) {
  if (options.devices < 1 || options.devices > 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices ", options.devices, ": must be in [1, 32]"));
  }
  if (options.configs.empty()) return absl::InvalidArgumentError("--configs: none selected");
  if (options.rates.empty() || options.datasets.empty()) {
    return absl::InvalidArgumentError("--rates and --datasets need at least one value each");
  }
  for (const std::string& dataset : options.datasets) {
    if (auto sampler = PromptLengthSampler::FromSpec(dataset); !sampler.ok()) {
      return sampler.status();
    }
  }
  for (const fs::path& binary :
       {options.bin_dir / "tophat-cloud", options.bin_dir / "tophat-agent"}) {
    if (!fs::exists(binary)) {
      return absl::NotFoundError(absl::StrCat(binary.string(), ": not built"));
    }
  }
  fs::create_directories(options.work_dir);

  LinkPlan links;
  links.scale = options.bytes_per_token > 0
                    ? options.bytes_per_token / options.reference_bytes_per_token
                    : 1.0;
  for (int i = 0; i < options.devices; ++i) {
    links.middle.push_back(DeviceLinkAt(i, options.devices, options.uplink, options.downlink,
                                        0.5, 0.5, links.scale));
  }
  std::unique_ptr<EdgeLinks> edge;
  std::string links_note;
  if (options.links == "netns" || options.links == "auto") {
    auto made = EdgeLinks::Create(options.links_script, options.devices);
    if (made.ok()) {
      edge = *std::move(made);
      for (int i = 0; i < options.devices; ++i) {
        const DeviceLink& link = links.middle[i];
        auto kernel_delay = edge->Shape(i, link.uplink_bytes_per_second,
                                        link.downlink_bytes_per_second, options.one_way_delay_s);
        if (!kernel_delay.ok()) return kernel_delay.status();
        links.kernel_delay = *kernel_delay;
      }
      links.edge = edge.get();
      links_note = absl::StrCat(
          "network namespaces + tc (", options.links_script.string(), "), bandwidth redrawn every ",
          options.link_period_s, " s; delay ",
          links.kernel_delay ? "in the kernel (netem)" : "in the agent (this kernel has no netem)");
    } else if (options.links == "netns") {
      return made.status();
    } else {
      links_note = absl::StrCat("in-process shaper in each agent (no network namespaces: ",
                                made.status().message(), ")");
    }
  } else if (options.links == "emulated") {
    links_note = "in-process shaper in each agent (--links emulated)";
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--links \"", options.links, "\": expected auto, netns or emulated"));
  }
  spdlog::info("ablation: links: {}", links_note);
  nlohmann::json device_links = nlohmann::json::array();
  for (int i = 0; i < options.devices; ++i) {
    const DeviceLink& link = links.middle[i];
    device_links.push_back({{"device", i},
                            {"uplink_bytes_per_second", link.uplink_bytes_per_second},
                            {"downlink_bytes_per_second", link.downlink_bytes_per_second}});
    spdlog::info("ablation: device {}: {:.0f} KB/s up, {:.0f} KB/s down{}, {:.0f} ms one way", i,
                 link.uplink_bytes_per_second / 1e3, link.downlink_bytes_per_second / 1e3,
                 edge != nullptr ? " (middle of its range)" : "", options.one_way_delay_s * 1e3);
  }
  if (options.cloud_stages > 1) {
    spdlog::info("ablation: the cloud in {} pipeline stages (layers {})", options.cloud_stages,
                 absl::StrJoin(EvenStageBoundaries(options.middle_begin, options.middle_end,
                                                   options.cloud_stages),
                               ", "));
  }
  LinkVariation variation(links.edge, options, links.scale);

  std::vector<RunRecord> records;
  nlohmann::json fits = nlohmann::json::object();
  nlohmann::json step_curves = nlohmann::json::object();  // by configuration
  nlohmann::json measured_links = nlohmann::json::object();
  const size_t total_runs =
      options.configs.size() * options.datasets.size() * options.rates.size();
  size_t done = 0;
  const Clock::time_point started = Clock::now();
  for (const AblationConfig& config : options.configs) {
    const fs::path dir = options.work_dir / config.name;
    auto deployment = Deploy(config, options, links, dir);
    if (!deployment.ok()) return deployment.status();
    // Warm-up: the links and the step-time predictor get measurements, and the cloud sends
    // per-device chunk sizes, before anything is timed.
    for (int round = 0; round < 2; ++round) {
      auto warm = RunWorkload((*deployment)->agent_addresses,
                              {.requests = 2 * options.devices,
                               .rate = 0,
                               .prompt_lengths = "fixed:256",
                               .output_tokens = 8,
                               .seed = options.seed + 1000 + round,
                               .text_tokens = options.text_tokens});
      if (!warm.ok()) return warm.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    }
    for (const std::string& dataset : options.datasets) {
      for (double rate : options.rates) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
        std::fprintf(stderr, "[%zu/%zu] %-14s %-10s %5.2f req/s   elapsed %4.0fs%s\n", done + 1,
                     total_runs, config.name.c_str(), dataset.c_str(), rate, elapsed,
                     done > 0 ? absl::StrFormat(", ETA %.0fs", elapsed / done *
                                                                   (total_runs - done))
                                    .c_str()
                              : "");
        const auto [cloud_cpu, agent_cpu] = (*deployment)->CpuSecondsSoFar();
        auto run = RunWorkload((*deployment)->agent_addresses,
                               {.requests = options.requests,
                                .rate = rate,
                                .prompt_lengths = dataset,
                                .output_tokens = options.output_tokens,
                                .seed = options.seed,
                                .text_tokens = options.text_tokens,
                                .trace = true});
        if (!run.ok()) return run.status();
        records.push_back(Record(config, dataset, rate, *run, options));
        const auto [cloud_cpu_after, agent_cpu_after] = (*deployment)->CpuSecondsSoFar();
        const double wall = std::max(run->wall_seconds, 1e-9);
        records.back().cloud_cores = (cloud_cpu_after - cloud_cpu) / wall;
        records.back().agent_cores = (agent_cpu_after - agent_cpu) / wall;
        records.back().host_cores = std::thread::hardware_concurrency();
        ++done;
      }
    }
    const PredictionFit fit = ReadPredictionFit((*deployment)->cloud_metrics_port);
    fits[config.name] = {{"predictions", fit.observations},
                         {"within_15_percent", fit.within_15_percent},
                         {"median_error", fit.median_error}};
    step_curves[config.name] = ReadStepCurve((*deployment)->cloud_metrics_port);
    // What each agent measured of its link by the end (0: not known).
    nlohmann::json measured = nlohmann::json::array();
    for (const auto& [host, port] : (*deployment)->agent_metrics) {
      const std::string text = HttpGet(port, "/metrics", host);
      measured.push_back(
          {{"uplink_bytes_per_second",
            MetricValue(text, "tophat_link_bytes_per_second", "direction=\"up\"").value_or(0)},
           {"downlink_bytes_per_second",
            MetricValue(text, "tophat_link_bytes_per_second", "direction=\"down\"")
                .value_or(0)}});
    }
    measured_links[config.name] = measured;
    if (links.edge != nullptr) {
      // The kernel's view of each link (drops, TCP timeouts), for runs whose links misbehaved.
      std::string stats;
      for (int i = 0; i < links.edge->devices(); ++i) {
        absl::StrAppend(&stats, "## device ", i, "\n", links.edge->Stats(i), "\n");
      }
      bench::WriteTextFile(dir / "links.txt", stats).IgnoreError();
    }
  }

  for (const std::string& dataset : options.datasets) {
    for (double rate : options.rates) PrintTable(records, options, dataset, rate);
  }
  const nlohmann::json goals = Goals(records, options);
  PrintGoals(goals);
  std::printf("\nStep-time predictor (cloud): median |predicted - measured| / measured\n");
  for (const AblationConfig& config : options.configs) {
    const nlohmann::json& fit = fits[config.name];
    std::printf("%-14s %6.0f predictions, median error %5.1f%%, within 15%%: %5.1f%%\n",
                config.name.c_str(), fit["predictions"].get<double>(),
                100 * fit["median_error"].get<double>(),
                100 * fit["within_15_percent"].get<double>());
  }

  std::printf("\nLinks as the agents measured them at the end of each configuration, KB/s "
              "(shaped: see above)\n");
  for (const AblationConfig& config : options.configs) {
    std::vector<std::string> cells;
    for (const nlohmann::json& device : measured_links[config.name]) {
      cells.push_back(absl::StrFormat("%.0f up / %.0f down",
                                      device["uplink_bytes_per_second"].get<double>() / 1e3,
                                      device["downlink_bytes_per_second"].get<double>() / 1e3));
    }
    std::printf("%-14s %s\n", config.name.c_str(), absl::StrJoin(cells, "   ").c_str());
  }

  nlohmann::json plots = nlohmann::json::array();
  for (const std::string& dataset : options.datasets) {
    for (double rate : options.rates) {
      std::vector<CdfPanel> panels(2);
      const std::string where = absl::StrFormat("%s, %.2g req/s", DatasetLabel(dataset), rate);
      panels[0].title = absl::StrCat("Prefill SLA (", where, ")");
      panels[0].x_label = "TTFT per 128 prompt tokens (ms)";
      panels[1].title = absl::StrCat("Decode SLA (", where, ")");
      panels[1].x_label = "delay per 10 tokens (ms)";
      for (const AblationConfig& config : options.configs) {
        const RunRecord* r = Find(records, config.name, dataset, rate);
        if (r == nullptr) continue;
        panels[0].series.push_back({.label = config.name, .values = r->prefill_ms_per_128});
        panels[1].series.push_back({.label = config.name, .values = r->decode_ms_per_10});
      }
      const fs::path png =
          options.work_dir / absl::StrFormat("sla-%s-%grps.png", dataset, rate);
      if (absl::Status written = WriteCdfPlotPng(png, panels); !written.ok()) {
        spdlog::warn("ablation: {}", written.ToString());
      } else {
        plots.push_back(png.string());
        std::printf("SLA compliance plot: %s\n", png.string().c_str());
      }
    }
  }

  nlohmann::json runs = nlohmann::json::array();
  for (const RunRecord& r : records) {
    runs.push_back({{"config", r.config},
                    {"dataset", r.dataset},
                    {"rate", r.rate},
                    {"summary", SummaryJson(r.summary)},
                    {"tokens_per_round", r.tokens_per_round},
                    {"decode_network_ms_mean", r.decode_network_ms_mean},
                    {"decode_network_max_ms_p50", r.decode_network_max_ms_p50},
                    {"chunk_size_by_device", r.chunk_by_device},
                    {"prefill_ms_per_128_tokens", r.prefill_ms_per_128},
                    {"decode_ms_per_10_tokens", r.decode_ms_per_10},
                    {"cloud_cores", r.cloud_cores},
                    {"agent_cores", r.agent_cores},
                    {"host_cores", r.host_cores},
                    {"per_request", r.per_request}});
  }
  nlohmann::json configs = nlohmann::json::array();
  for (const AblationConfig& c : options.configs) {
    configs.push_back({{"name", c.name}, {"description", c.description}});
  }
  return nlohmann::json{
      {"devices", options.devices},
      {"datasets", options.datasets},
      {"rates", options.rates},
      {"requests", options.requests},
      {"output_tokens", options.output_tokens},
      {"seed", options.seed},
      {"prompt_text", options.text_tokens.empty()
                          ? std::string("random token ids")
                          : absl::StrCat("windows of a ", options.text_tokens.size(),
                                         "-token text")},
      {"links", {{"how", links_note},
                 {"scale", links.scale},
                 {"bytes_per_token", options.bytes_per_token},
                 {"wire_dtype", options.wire_dtype},
                 {"uplink_pacing", options.uplink_pacing},
                 {"one_way_delay_s", options.one_way_delay_s},
                 {"devices", device_links}}},
      {"sla", {{"ttft_s", options.sla.ttft_s}, {"tbt_s", options.sla.tbt_s}}},
      {"cloud_stages", options.cloud_stages},
      {"configs", configs},
      {"runs", runs},
      {"goals", goals},
      {"step_time_predictor", fits},
      {"step_time_curve", step_curves},
      {"measured_links", measured_links},
      {"plots", plots}};
}

}  // namespace tophat::bench
