// tophat-bench-flood: can one greedy device starve the others? A real tophat-cloud and a
// well-behaved tophat-agent on loopback serve a Poisson workload through the SDK, first
// alone and then while a greedy device floods the same cloud: it opens as many sessions of
// the longest context as it is allowed, keeps every admitted one busy with back-to-back
// prompt chunks, and reopens at once whatever is refused or finished. The same run is made
// with the cloud's per-device limits at their defaults and with all of them off, so the
// ratios "during / alone" of the agent's TTFT and TBT compare like for like. Prints a table
// and a JSON report.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "base/program.h"
#include "bench/bench_util.h"
#include "bench/machine_bounds.h"
#include "bench/process_control.h"
#include "bench/workload_runner.h"
#include "models/runtime/bundle.h"
#include "tophat/v1/cloud.grpc.pb.h"

namespace tophat {
namespace {

namespace fs = std::filesystem;

struct Args {
  std::string model_dir;  // the toy model (tophat toy-model)
  int64_t requests = 24;
  double rate = 2;
  std::string prompt_lengths = "fixed:128";
  int64_t output_tokens = 32;
  int64_t flood_sessions = 256;  // sessions the greedy device tries to hold
  int64_t flood_chunk = 256;     // positions per chunk it sends
  double decode_step_stretch = 2;  // the cloud's scheduler.decode_step_stretch (fair share)
  // The cloud's limits.max_messages_per_second_per_device where the limits are on (negative:
  // the cloud's default).
  double max_messages_per_second = -1;
  // Its limits.max_refusals_per_second_per_device there (negative: the cloud's default).
  double max_refusals_per_second = -1;
  // The agent and the app's requests on CPU 0, the cloud and the greedy device on CPU 1, as
  // if the device were its own machine. Off by default: on a 2-CPU machine the greedy
  // device's traffic then competes with the cloud's engine thread for one CPU, which costs
  // the agent more than sharing two (docs/benchmarks.md).
  bool pin = false;
  std::string json_path;
};

// Binds the calling thread (and the threads it starts later) to one CPU.
void PinThisThread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

constexpr char kTaskset[] = "/usr/bin/taskset";  // util-linux, in every Debian

// argv run on one CPU, or as it is when not pinning.
std::vector<std::string> OnCpu(bool pin, int cpu, std::vector<std::string> argv) {
  if (!pin) return argv;
  argv.insert(argv.begin(), {kTaskset, "-c", std::to_string(cpu)});
  return argv;
}

// What the greedy device got from the cloud.
struct FloodStats {
  std::atomic<int64_t> admitted{0};
  std::atomic<int64_t> refused{0};
  std::atomic<int64_t> chunks_computed{0};
};

// The greedy device: one stream, as many sessions as it can hold, each fed back to back.
// Reads on its own thread and writes from it too (the stream's only writer).
class Flooder {
 public:
  Flooder(const std::string& address, const Args& args, FloodStats* stats)
      : args_(args), stats_(stats) {
    grpc::ChannelArguments channel_args;
    channel_args.SetMaxSendMessageSize(256 << 20);
    channel_args.SetMaxReceiveMessageSize(256 << 20);
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), channel_args);
    stub_ = v1::CloudService::NewStub(channel_);
    thread_ = std::thread([this] { Run(); });
  }
  ~Flooder() {
    stop_ = true;
    context_.TryCancel();
    thread_.join();
  }

 private:
  void Open(uint64_t id) {
    v1::AgentMessage message;
    message.mutable_open()->set_session_id(id);
    message.mutable_open()->set_max_positions(static_cast<uint32_t>(max_positions_));
    stream_->Write(message);
  }
  void SendChunk(uint64_t id, int64_t first) {
    v1::AgentMessage message;
    v1::ForwardChunk* chunk = message.mutable_forward();
    chunk->set_session_id(id);
    chunk->set_sequence_number(static_cast<uint64_t>(first) + 1);
    chunk->set_first_position(static_cast<uint32_t>(first));
    chunk->set_phase(v1::PHASE_PREFILL);
    chunk->mutable_states()->set_dtype(v1::DTYPE_FLOAT32);
    chunk->mutable_states()->set_num_positions(static_cast<uint32_t>(args_.flood_chunk));
    chunk->mutable_states()->set_hidden_size(hidden_);
    chunk->mutable_states()->mutable_data()->assign(
        static_cast<size_t>(args_.flood_chunk) * hidden_ * 4, '\0');
    stream_->Write(message);
  }
  void Close(uint64_t id) {
    v1::AgentMessage message;
    message.mutable_close()->set_session_id(id);
    stream_->Write(message);
  }

  void Run() {
    // The greedy device is another machine: it shares the cloud's core, not the agent's.
    if (args_.pin) PinThisThread(1);
    stream_ = stub_->Connect(&context_);
    v1::CloudMessage message;
    if (!stream_->Read(&message) || !message.has_hello()) return;
    hidden_ = message.hello().hidden_size();
    // The longest session the chunks fill exactly.
    max_positions_ = std::max<int64_t>(args_.flood_chunk,
                                       1024 / args_.flood_chunk * args_.flood_chunk);
    uint64_t next_id = 1;
    std::unordered_map<uint64_t, int64_t> next_position;
    for (int64_t i = 0; i < args_.flood_sessions; ++i) Open(next_id++);
    while (!stop_ && stream_->Read(&message)) {
      if (message.has_admitted()) {
        ++stats_->admitted;
        next_position[message.admitted().session_id()] = 0;
        SendChunk(message.admitted().session_id(), 0);
        next_position[message.admitted().session_id()] = args_.flood_chunk;
      } else if (message.has_error()) {
        ++stats_->refused;
        next_position.erase(message.error().session_id());
        Open(next_id++);  // a greedy device asks again at once
      } else if (message.has_result() && message.result().chunk_done()) {
        ++stats_->chunks_computed;
        const uint64_t id = message.result().session_id();
        auto it = next_position.find(id);
        if (it == next_position.end()) continue;
        if (it->second + args_.flood_chunk <= max_positions_) {
          SendChunk(id, it->second);
          it->second += args_.flood_chunk;
        } else {
          next_position.erase(it);
          Close(id);
          Open(next_id++);
        }
      }
    }
  }

  const Args args_;
  FloodStats* stats_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CloudService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::CloudMessage>> stream_;
  uint32_t hidden_ = 0;
  int64_t max_positions_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

struct PhaseResult {
  bench::WorkloadSummary summary;
  int64_t flood_admitted = 0;
  int64_t flood_refused = 0;
  int64_t flood_chunks = 0;
  // The greedy device's computed prompt positions a second while the well-behaved agent's
  // requests ran: what it still gets.
  double flood_positions_per_second = 0;
  std::string first_error;  // of the well-behaved agent's failed requests, if any
};

std::string FirstError(const bench::WorkloadRun& run) {
  for (const bench::RequestOutcome& outcome : run.outcomes) {
    if (!outcome.status.ok()) return outcome.status.ToString();
  }
  return "";
}

struct CaseResult {
  std::string name;
  double decode_step_stretch = 0;
  PhaseResult alone;
  PhaseResult flooded;
};

// One cloud configuration: the per-device limits on or off, and the fair share's cap on a
// decoding device's steps (scheduler.decode_step_stretch; 0: off).
struct CaseSpec {
  std::string name;
  bool limits = true;
  double decode_step_stretch = 2;
};

absl::StatusOr<CaseResult> RunCase(const CaseSpec& spec_case, const Args& args,
                                   const fs::path& bundles, const fs::path& dir) {
  const std::string& name = spec_case.name;
  const bool limits = spec_case.limits;
  using bench::ChildProcess;
  fs::create_directories(dir);
  const fs::path bin = fs::read_symlink("/proc/self/exe").parent_path();
  const int cloud_port = bench::FreePort();
  // Plaintext on loopback: each stream is its own device, which is what the greedy device's
  // one stream is. With limits off every per-device limit is disabled; the global ones
  // (max_running_sessions, max_waiting_sessions, the KV pool) stay as they are.
  std::string cloud = absl::StrFormat(
      "listen_address: \"127.0.0.1:%d\"\nbundle: \"%s\"\nmax_context: 1024\n"
      "tls:\n  insecure: true\nmetrics_address: \"\"\ncompute_threads: 1\n"
      "kv_cache:\n  memory_bytes: 256MiB\n"
      "scheduler:\n  max_batch_tokens: 512\n  max_running_sessions: 64\n"
      "  max_waiting_sessions: 64\n  decode_step_stretch: %g\n",
      cloud_port, (bundles / "cloud").string(), spec_case.decode_step_stretch);
  if (limits) {
    std::string overrides;
    if (args.max_messages_per_second >= 0) {
      overrides += absl::StrFormat("  max_messages_per_second_per_device: %g\n",
                                   args.max_messages_per_second);
    }
    if (args.max_refusals_per_second >= 0) {
      overrides += absl::StrFormat("  max_refusals_per_second_per_device: %g\n",
                                   args.max_refusals_per_second);
    }
    if (!overrides.empty()) cloud += "limits:\n" + overrides;
  }
  if (!limits) {
    cloud +=
        "limits:\n  max_sessions_per_device: 0\n  max_waiting_sessions_per_device: 0\n"
        "  max_kv_fraction_per_device: 1\n  max_messages_per_second_per_device: 0\n";
  }
  const int agent_port = bench::FreePort();
  const std::string agent = absl::StrFormat(
      "listen_address: \"127.0.0.1:%d\"\ncloud_address: \"127.0.0.1:%d\"\nbundle: \"%s\"\n"
      "cloud_tls:\n  insecure: true\nmax_context: 1024\ncompute_threads: 1\n"
      "metrics_address: \"\"\n",
      agent_port, cloud_port, (bundles / "device").string());
  if (absl::Status s = bench::WriteTextFile(dir / "cloud.yaml", cloud); !s.ok()) return s;
  if (absl::Status s = bench::WriteTextFile(dir / "agent.yaml", agent); !s.ok()) return s;
  ChildProcess cloud_process(OnCpu(args.pin, 1, {(bin / "tophat-cloud").string(), "--config",
                                                 (dir / "cloud.yaml").string()}),
                             dir / "cloud.log");
  if (!bench::WaitForPort(cloud_port, std::chrono::seconds(120))) {
    return absl::UnavailableError(
        absl::StrCat("tophat-cloud did not start:\n", cloud_process.Log()));
  }
  ChildProcess agent_process(OnCpu(args.pin, 0, {(bin / "tophat-agent").string(), "--config",
                                                 (dir / "agent.yaml").string()}),
                             dir / "agent.log");
  if (!bench::WaitForPort(agent_port, std::chrono::seconds(120))) {
    return absl::UnavailableError(
        absl::StrCat("tophat-agent did not start:\n", agent_process.Log()));
  }
  const std::vector<std::string> agents = {absl::StrCat("127.0.0.1:", agent_port)};
  const bench::WorkloadSpec spec{.requests = args.requests,
                                 .rate = args.rate,
                                 .prompt_lengths = args.prompt_lengths,
                                 .output_tokens = args.output_tokens,
                                 .seed = 11};
  (void)bench::RunWorkload(agents, {.requests = 2, .rate = 0, .prompt_lengths = "fixed:16",
                                    .output_tokens = 2, .seed = 1});
  CaseResult result{.name = name, .decode_step_stretch = spec_case.decode_step_stretch};
  auto alone = bench::RunWorkload(agents, spec);
  if (!alone.ok()) return alone.status();
  result.alone.summary = bench::SummarizeRun(*alone, {});
  result.alone.first_error = FirstError(*alone);

  FloodStats stats;
  {
    Flooder flooder(absl::StrCat("127.0.0.1:", cloud_port), args, &stats);
    // The flood is on once the greedy device's chunks are being computed.
    if (!bench::WaitUntil([&] { return stats.chunks_computed.load() > 0; },
                          std::chrono::seconds(60))) {
      return absl::UnavailableError(absl::StrCat(
          name, ": the greedy device got no chunk computed in 60 s (logs in ", dir.string(), ")"));
    }
    const int64_t chunks_before = stats.chunks_computed.load();
    const auto started = std::chrono::steady_clock::now();
    auto flooded = bench::RunWorkload(agents, spec);
    if (!flooded.ok()) return flooded.status();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    result.flooded.flood_positions_per_second =
        static_cast<double>((stats.chunks_computed.load() - chunks_before) * args.flood_chunk) /
        seconds;
    result.flooded.summary = bench::SummarizeRun(*flooded, {});
    result.flooded.first_error = FirstError(*flooded);
    result.flooded.flood_admitted = stats.admitted.load();
    result.flooded.flood_refused = stats.refused.load();
    result.flooded.flood_chunks = stats.chunks_computed.load();
  }
  agent_process.Signal(SIGTERM);
  cloud_process.Signal(SIGTERM);
  agent_process.Wait(std::chrono::seconds(20));
  cloud_process.Wait(std::chrono::seconds(20));
  return result;
}

nlohmann::json PhaseJson(const PhaseResult& phase) {
  nlohmann::json out = bench::SummaryJson(phase.summary);
  out["flood_sessions_admitted"] = phase.flood_admitted;
  out["flood_sessions_refused"] = phase.flood_refused;
  out["flood_chunks_computed"] = phase.flood_chunks;
  out["flood_positions_per_second"] = phase.flood_positions_per_second;
  out["first_error"] = phase.first_error;
  return out;
}

int Run(const Args& args) {
  // The app's requests run where the agent does (threads started from here inherit it).
  if (args.pin) PinThisThread(0);
  auto scratch = bench::ScratchDir::Create("tophat-bench-flood");
  if (!scratch.ok()) return Fail(scratch.status());
  auto split = SplitCheckpoint({.model_dir = args.model_dir, .input_layers = 2,
                                .output_layers = 1, .out_dir = scratch->path() / "bundles"});
  if (!split.ok()) return Fail(split.status());
  std::vector<CaseResult> results;
  const std::vector<CaseSpec> specs = {
      {"limits + fair share (defaults)", true, args.decode_step_stretch},
      {"limits, no fair share", true, 0},
      {"no per-device limits", false, args.decode_step_stretch}};
  for (size_t i = 0; i < specs.size(); ++i) {
    std::fprintf(stderr, "%s\n", specs[i].name.c_str());
    auto result = RunCase(specs[i], args, scratch->path() / "bundles",
                          scratch->path() / absl::StrCat("case-", i));
    if (!result.ok()) return Fail(result.status());
    results.push_back(*result);
  }
  // 0 where the flooded phase has no successful request to measure.
  auto ratio = [](double during, double before) { return before > 0 ? during / before : 0.0; };
  std::string table =
      "| cloud | phase | TTFT p50 ms | TTFT p99 ms | TBT p50 ms | TBT p99 ms | failed | "
      "greedy: admitted / refused / chunks | greedy positions/s |\n"
      "|---|---|---:|---:|---:|---:|---:|---|---:|\n";
  nlohmann::json cases = nlohmann::json::array();
  for (const CaseResult& r : results) {
    for (const auto& [phase, p] : {std::pair<std::string, const PhaseResult*>{"alone", &r.alone},
                                   {"greedy device flooding", &r.flooded}}) {
      const std::string greedy =
          phase == "alone" ? "-"
                           : absl::StrFormat("%d / %d / %d", p->flood_admitted, p->flood_refused,
                                             p->flood_chunks);
      const std::string rate =
          phase == "alone" ? "-" : absl::StrFormat("%.0f", p->flood_positions_per_second);
      if (p->summary.failed == p->summary.requests) {
        table += absl::StrFormat("| %s | %s | - | - | - | - | all %d | %s | %s |\n", r.name,
                                 phase, p->summary.failed, greedy, rate);
        continue;
      }
      table += absl::StrFormat("| %s | %s | %.0f | %.0f | %.1f | %.1f | %d | %s | %s |\n",
                               r.name, phase, p->summary.ttft.p50 * 1e3,
                               p->summary.ttft.p99 * 1e3, p->summary.tbt.p50 * 1e3,
                               p->summary.tbt.p99 * 1e3, p->summary.failed, greedy, rate);
    }
    table += absl::StrFormat(
        "| %s | during / alone | %.2fx | %.2fx | %.2fx | %.2fx | | | |\n", r.name,
        ratio(r.flooded.summary.ttft.p50, r.alone.summary.ttft.p50),
        ratio(r.flooded.summary.ttft.p99, r.alone.summary.ttft.p99),
        ratio(r.flooded.summary.tbt.p50, r.alone.summary.tbt.p50),
        ratio(r.flooded.summary.tbt.p99, r.alone.summary.tbt.p99));
    cases.push_back({{"cloud", r.name},
                     {"decode_step_stretch", r.decode_step_stretch},
                     {"alone", PhaseJson(r.alone)},
                     {"flooded", PhaseJson(r.flooded)},
                     {"ttft_p50_ratio", ratio(r.flooded.summary.ttft.p50, r.alone.summary.ttft.p50)},
                     {"ttft_p99_ratio", ratio(r.flooded.summary.ttft.p99, r.alone.summary.ttft.p99)},
                     {"tbt_p50_ratio", ratio(r.flooded.summary.tbt.p50, r.alone.summary.tbt.p50)},
                     {"tbt_p99_ratio", ratio(r.flooded.summary.tbt.p99, r.alone.summary.tbt.p99)}});
  }
  for (const CaseResult& r : results) {
    if (!r.flooded.first_error.empty()) {
      table += absl::StrFormat("\n%s, flooded, first failure: %s\n", r.name, r.flooded.first_error);
    }
  }
  const nlohmann::json report = {{"benchmark", "flood"},
                                 {"requests", args.requests},
                                 {"rate", args.rate},
                                 {"prompt_lengths", args.prompt_lengths},
                                 {"output_tokens", args.output_tokens},
                                 {"flood_sessions", args.flood_sessions},
                                 {"flood_chunk", args.flood_chunk},
                                 {"cases", cases},
                                 {"pinned", args.pin},
                                 {"cpus", UsableCpuCount()}};
  if (absl::Status s = bench::PrintReport(table, report, args.json_path); !s.ok()) return Fail(s);
  return 0;
}

}  // namespace
}  // namespace tophat

int main(int argc, char** argv) {
  tophat::Args args;
  CLI::App app{
      "tophat-bench-flood: a well-behaved agent's TTFT and TBT alone and while a greedy device "
      "floods the same tophat-cloud (as many long sessions as it may hold, chunks back to "
      "back, refusals retried at once), with the cloud's per-device limits on and off, in the "
      "same run. Prints a table and a JSON report."};
  app.add_option("--model", args.model_dir, "The toy model's directory (tophat toy-model)")
      ->required()->check(CLI::ExistingDirectory);
  app.add_option("--requests", args.requests, "Requests of the well-behaved agent per phase")
      ->capture_default_str()->check(CLI::Range(1, 10000));
  app.add_option("--rate", args.rate, "Their arrival rate, requests/s (Poisson)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--prompt-lengths", args.prompt_lengths,
                 "Their prompt lengths (specbench, cnndm, fixed:N, uniform:A:B)")
      ->capture_default_str();
  app.add_option("--output-tokens", args.output_tokens)->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--flood-sessions", args.flood_sessions,
                 "Sessions the greedy device tries to hold at once")
      ->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--flood-chunk", args.flood_chunk, "Positions per chunk it sends")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--decode-step-stretch", args.decode_step_stretch,
                 "The fair share's cap where it is on (scheduler.decode_step_stretch)")
      ->capture_default_str();
  app.add_option("--max-messages-per-second", args.max_messages_per_second,
                 "The cloud's limits.max_messages_per_second_per_device where its limits are on "
                 "(default: the cloud's default)");
  app.add_option("--max-refusals-per-second", args.max_refusals_per_second,
                 "The cloud's limits.max_refusals_per_second_per_device where its limits are on "
                 "(default: the cloud's default)");
  app.add_flag("--pin", args.pin,
               "Put the agent and the app on CPU 0, the cloud and the greedy device on CPU 1");
  app.add_option("--json", args.json_path, "Also write the report here");
  CLI11_PARSE(app, argc, argv);
  // Pinning needs a second CPU to pin to, and taskset.
  if (args.pin && (tophat::UsableCpuCount() < 2 || !std::filesystem::exists(tophat::kTaskset))) {
    std::fprintf(stderr, "not pinning: fewer than 2 CPUs or no %s\n", tophat::kTaskset);
    args.pin = false;
  }
  return tophat::Run(args);
}
