// tophat-bench-agent-memory: how much memory does tophat-agent hold per request? A real
// tophat-cloud and one or more tophat-agent binaries (this build's, and for a before/after
// comparison an older one given with --agent) serve requests that may run to the context
// (max_new_tokens = max_context - prompt, as an app that sets no limit asks) but whose app
// stops after --tokens tokens, as an app does at its stop string. For each concurrency the
// agent's peak resident memory (VmHWM, reset through /proc/PID/clear_refs before each phase)
// is read beside its idle footprint. Prints a table and a JSON report.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/program.h"
#include "bench/bench_util.h"
#include "bench/machine_bounds.h"
#include "bench/process_control.h"
#include "models/formats/config.h"
#include "models/runtime/bundle.h"
#include "sdk/client.h"

namespace tophat {
namespace {

namespace fs = std::filesystem;

struct Args {
  std::string model_dir;
  int64_t input_layers = 2;
  int64_t output_layers = 1;
  int64_t prompt_tokens = 64;
  int64_t tokens = 32;  // generated before the app stops reading
  std::vector<int64_t> concurrency = {1, 16};
  int64_t max_context = 2048;
  std::string dtype = "float32";
  std::string device_weights = "as-stored";  // or "int8" (tophat split --device-weights)
  // "label=path" or a path; default: this build's tophat-agent.
  std::vector<std::string> agents;
  std::string json_path;
  // > 0: fail when a phase's memory per request passes this fraction of what reserving the
  // whole context up front would take (a regression check for growing caches).
  double max_fraction = 0;
};

// One line of /proc/PID/status in KiB ("VmRSS", "VmHWM"); -1 when unreadable.
int64_t StatusKib(pid_t pid, const std::string& field) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (!line.starts_with(field + ":")) continue;
    int64_t kib = 0;
    std::vector<std::string> words =
        absl::StrSplit(line.substr(field.size() + 1), ' ', absl::SkipWhitespace());
    if (!words.empty() && absl::SimpleAtoi(words[0], &kib)) return kib;
  }
  return -1;
}

// Resets the process's peak resident size to its current one (Linux >= 4.0).
absl::Status ResetPeak(pid_t pid) {
  std::ofstream clear(absl::StrCat("/proc/", pid, "/clear_refs"));
  clear << "5";
  clear.flush();
  if (!clear) {
    return absl::PermissionDeniedError(
        absl::StrCat("/proc/", pid, "/clear_refs: cannot reset the peak resident size"));
  }
  return absl::OkStatus();
}

struct Phase {
  int64_t concurrency = 0;
  double peak_mib = 0;
  int64_t failed = 0;
  int64_t generated = 0;  // tokens over all requests
  std::string first_error;
};

struct AgentResult {
  std::string label;
  std::string binary;
  double idle_mib = 0;
  std::vector<Phase> phases;
};

v1::GenerateRequest MemoryRequest(const Args& args, int64_t vocab, int64_t index) {
  v1::GenerateRequest request;
  request.set_request_id(absl::StrCat("mem-", index));
  // Token ids spread over the vocabulary, different per request (no special ids: 3 and up).
  auto* ids = request.mutable_prompt_ids();
  const int64_t span = std::max<int64_t>(1, std::min<int64_t>(vocab, 4096) - 3);
  for (int64_t i = 0; i < args.prompt_tokens; ++i) {
    ids->add_ids(static_cast<uint32_t>(3 + (index * 7919 + i * 104729) % span));
  }
  request.set_max_new_tokens(static_cast<uint32_t>(args.max_context - args.prompt_tokens));
  request.set_ignore_eos(true);
  return request;
}

// `first_index` picks the prompts (MemoryRequest): a warm-up uses others than the phases, so
// that no phase reuses a conversation the warm-up left.
absl::StatusOr<Phase> RunPhase(Client& client, const Args& args, int64_t vocab,
                               int64_t concurrency, pid_t agent_pid, int64_t first_index = 0) {
  Phase phase{.concurrency = concurrency};
  if (absl::Status reset = ResetPeak(agent_pid); !reset.ok()) return reset;
  std::atomic<int64_t> failed{0};
  std::atomic<int64_t> generated{0};
  std::mutex error_mutex;
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < concurrency; ++r) {
    threads.emplace_back([&, r] {
      const v1::GenerateRequest request = MemoryRequest(args, vocab, first_index + r);
      int64_t seen = 0;
      bool cancelled = false;
      auto result = client.Generate(request, [&](const v1::GenerateResponse& update) {
        seen += update.token_ids_size();
        if (seen >= args.tokens && !cancelled) {
          cancelled = true;  // the app has what it wanted
          client.Cancel(request.request_id()).IgnoreError();
        }
      });
      generated += seen;
      std::string error;
      if (!result.ok()) {
        error = result.status().ToString();
      } else if (result->finish_reason != v1::FINISH_REASON_CANCELLED) {
        error = absl::StrCat("finished with ", v1::FinishReason_Name(result->finish_reason),
                             " after ", seen, " tokens: ", result->error);
      }
      if (!error.empty()) {
        ++failed;
        std::lock_guard<std::mutex> lock(error_mutex);
        if (phase.first_error.empty()) phase.first_error = error;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  phase.failed = failed.load();
  phase.generated = generated.load();
  phase.peak_mib = static_cast<double>(StatusKib(agent_pid, "VmHWM")) / 1024;
  return phase;
}

absl::StatusOr<AgentResult> RunAgent(const std::string& label, const std::string& binary,
                                     const Args& args, const fs::path& device_bundle,
                                     int64_t vocab, int cloud_port, const fs::path& dir) {
  using bench::ChildProcess;
  fs::create_directories(dir);
  const int agent_port = bench::FreePort();
  const int64_t most = *std::max_element(args.concurrency.begin(), args.concurrency.end());
  const std::string agent = absl::StrFormat(
      "listen_address: \"127.0.0.1:%d\"\ncloud_address: \"127.0.0.1:%d\"\nbundle: \"%s\"\n"
      "cloud_tls:\n  insecure: true\nmax_context: %d\nmax_concurrent_requests: %d\n"
      "dtype: %s\nmetrics_address: \"\"\n",
      agent_port, cloud_port, device_bundle.string(), args.max_context, most, args.dtype);
  if (absl::Status s = bench::WriteTextFile(dir / "agent.yaml", agent); !s.ok()) return s;
  ChildProcess process({binary, "--config", (dir / "agent.yaml").string()}, dir / "agent.log");
  if (!bench::WaitForPort(agent_port, std::chrono::seconds(600))) {
    return absl::UnavailableError(
        absl::StrCat(label, ": tophat-agent did not start:\n", process.Log()));
  }
  auto client = Client::Connect(absl::StrCat("127.0.0.1:", agent_port), 60);
  if (!client.ok()) return client.status();
  // A warm-up phase first, at the largest concurrency, with other prompts: the cloud link,
  // LibTorch's pools, the request threads' malloc arenas and stacks, and the kernels and
  // scratch space LibTorch 2.11 (oneDNN, MKL) builds on a shape's first use and keeps. None
  // of it is a request's to hold; after a single 2-token warm-up it landed in the first
  // measured phase (seen: 0.6-0.9 MiB per request at concurrency 1 in most runs, 4.4-4.7 in
  // some).
  auto warmed = RunPhase(**client, args, vocab, most, process.pid(), /*first_index=*/1000);
  if (!warmed.ok() || warmed->failed > 0) {
    return absl::UnavailableError(absl::StrCat(
        label, ": the warm-up requests failed: ",
        warmed.ok() ? warmed->first_error : warmed.status().ToString(), "\n", process.Log()));
  }
  AgentResult result{.label = label, .binary = binary};
  result.idle_mib = static_cast<double>(StatusKib(process.pid(), "VmRSS")) / 1024;
  for (int64_t concurrency : args.concurrency) {
    std::fprintf(stderr, "%s: %lld concurrent request(s)\n", label.c_str(),
                 static_cast<long long>(concurrency));
    auto phase = RunPhase(**client, args, vocab, concurrency, process.pid());
    if (!phase.ok()) return phase.status();
    result.phases.push_back(*phase);
  }
  process.Signal(SIGTERM);
  process.Wait(std::chrono::seconds(30));
  return result;
}

int Run(Args args) {
  const fs::path bin = fs::read_symlink("/proc/self/exe").parent_path();
  std::vector<std::pair<std::string, std::string>> agents;
  if (args.agents.empty()) args.agents.push_back((bin / "tophat-agent").string());
  for (const std::string& spec : args.agents) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos) {
      agents.emplace_back(agents.empty() ? "this build" : spec, spec);
    } else {
      agents.emplace_back(spec.substr(0, eq), spec.substr(eq + 1));
    }
  }
  auto scratch = bench::ScratchDir::Create("tophat-bench-agent-memory");
  if (!scratch.ok()) return Fail(scratch.status());
  const fs::path bundles = scratch->path() / "bundles";
  std::fprintf(stderr, "splitting %s (m = %lld, k = %lld)\n", args.model_dir.c_str(),
               static_cast<long long>(args.input_layers),
               static_cast<long long>(args.output_layers));
  auto split = SplitCheckpoint(
      {.model_dir = args.model_dir, .input_layers = args.input_layers,
       .output_layers = args.output_layers, .out_dir = bundles,
       .device_weights = args.device_weights == "int8" ? DeviceWeights::kInt8
                                                       : DeviceWeights::kAsStored});
  if (!split.ok()) return Fail(split.status());
  auto config = ModelConfig::Load(fs::path(args.model_dir) / "config.json");
  if (!config.ok()) return Fail(config.status());
  auto manifest = BundleManifest::Load(bundles / "device");
  if (!manifest.ok()) return Fail(manifest.status());
  // Requests ask for the whole context, which the model's own limit may cap.
  args.max_context = std::min(args.max_context, config->max_position_embeddings);
  if (args.prompt_tokens + args.tokens >= args.max_context) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--prompt-tokens ", args.prompt_tokens, " + --tokens ", args.tokens,
        " must stay below --max-context ", args.max_context)));
  }

  // The cloud admits a session by reserving its max_positions: room for every request of
  // the largest phase at the full context, plus a tenth.
  const int64_t most = *std::max_element(args.concurrency.begin(), args.concurrency.end());
  const int64_t cloud_layers =
      config->num_hidden_layers - args.input_layers - args.output_layers;
  const int64_t dtype_bytes = args.dtype == "float32" ? 4 : 2;
  const int64_t kv_bytes = 2 * std::max<int64_t>(1, cloud_layers) * config->num_key_value_heads *
                           config->head_dim * dtype_bytes * (most + 1) * args.max_context *
                           11 / 10;
  const int cloud_port = bench::FreePort();
  const std::string cloud = absl::StrFormat(
      "listen_address: \"127.0.0.1:%d\"\nbundle: \"%s\"\nmax_context: %d\ndtype: %s\n"
      "tls:\n  insecure: true\nmetrics_address: \"\"\nkv_cache:\n  memory_bytes: %d\n"
      "scheduler:\n  max_running_sessions: %d\n"
      // One device holds every session here: the per-device shares would refuse most.
      "limits:\n  max_sessions_per_device: 0\n  max_waiting_sessions_per_device: 0\n"
      "  max_kv_fraction_per_device: 1\n",
      cloud_port, (bundles / "cloud").string(), args.max_context, args.dtype, kv_bytes,
      std::max<int64_t>(64, most + 1));
  if (absl::Status s = bench::WriteTextFile(scratch->path() / "cloud.yaml", cloud); !s.ok()) {
    return Fail(s);
  }
  bench::ChildProcess cloud_process(
      {(bin / "tophat-cloud").string(), "--config", (scratch->path() / "cloud.yaml").string()},
      scratch->path() / "cloud.log");
  if (!bench::WaitForPort(cloud_port, std::chrono::seconds(600))) {
    return Fail(absl::UnavailableError(
        absl::StrCat("tophat-cloud did not start:\n", cloud_process.Log())));
  }

  std::vector<AgentResult> results;
  for (size_t i = 0; i < agents.size(); ++i) {
    auto result = RunAgent(agents[i].first, agents[i].second, args, bundles / "device",
                           config->vocab_size, cloud_port,
                           scratch->path() / absl::StrCat("agent", i));
    if (!result.ok()) return Fail(result.status());
    results.push_back(*result);
  }
  cloud_process.Signal(SIGTERM);
  cloud_process.Wait(std::chrono::seconds(30));

  // What one request held before its caches grew with it: K and V of every device layer
  // (input, output, adapter) and one shallow hidden state, for each position of the context.
  const int64_t device_layers = manifest->input_layers.size() + manifest->output_layers.size() +
                                (manifest->adapter ? manifest->adapter->num_layers : 0);
  const double reserved_mib =
      static_cast<double>((2 * device_layers * config->num_key_value_heads * config->head_dim +
                           config->hidden_size) *
                          dtype_bytes * args.max_context) /
      (1 << 20);
  std::string table = absl::StrFormat(
      "%d-token prompts, %d tokens read, requests asking for the context (%d positions): "
      "reserved up front, a request's KV and shallow states would take %.1f MiB\n\n",
      args.prompt_tokens, args.tokens, args.max_context, reserved_mib);
  table += "| agent | idle RSS MiB |";
  std::string rule = "|---|---:|";
  for (int64_t c : args.concurrency) {
    table += absl::StrFormat(" peak @%d MiB | per request MiB |", c);
    rule += "---:|---:|";
  }
  table += " failed |\n" + rule + "---:|\n";
  nlohmann::json agents_json = nlohmann::json::array();
  std::string errors;
  for (const AgentResult& r : results) {
    table += absl::StrFormat("| %s | %.0f |", r.label, r.idle_mib);
    int64_t failed = 0;
    nlohmann::json phases = nlohmann::json::array();
    for (const Phase& p : r.phases) {
      const double per_request = (p.peak_mib - r.idle_mib) / static_cast<double>(p.concurrency);
      table += absl::StrFormat(" %.0f | %.1f |", p.peak_mib, per_request);
      failed += p.failed;
      if (!p.first_error.empty()) {
        errors += absl::StrFormat("\n%s @%d, first failure: %s", r.label, p.concurrency,
                                  p.first_error);
      }
      phases.push_back({{"concurrency", p.concurrency},
                        {"peak_rss_mib", p.peak_mib},
                        {"per_request_mib", per_request},
                        {"generated_tokens", p.generated},
                        {"failed", p.failed}});
    }
    table += absl::StrFormat(" %d |\n", failed);
    agents_json.push_back({{"label", r.label},
                           {"binary", r.binary},
                           {"idle_rss_mib", r.idle_mib},
                           {"phases", phases}});
  }
  // Same-run ratios of the first agent's growth against each other agent's.
  for (size_t i = 1; i < results.size(); ++i) {
    for (size_t p = 0; p < results[0].phases.size() && p < results[i].phases.size(); ++p) {
      const double base = results[0].phases[p].peak_mib - results[0].idle_mib;
      const double other = results[i].phases[p].peak_mib - results[i].idle_mib;
      if (base > 0) {
        table += absl::StrFormat("\n%s / %s, memory above idle @%d: %.2fx", results[i].label,
                                 results[0].label, results[0].phases[p].concurrency,
                                 other / base);
      }
    }
  }
  table += errors + "\n";
  const nlohmann::json report = {{"benchmark", "agent_memory"},
                                 {"reserved_up_front_mib_per_request", reserved_mib},
                                 {"model", args.model_dir},
                                 {"input_layers", args.input_layers},
                                 {"output_layers", args.output_layers},
                                 {"prompt_tokens", args.prompt_tokens},
                                 {"tokens", args.tokens},
                                 {"max_context", args.max_context},
                                 {"dtype", args.dtype},
                                 {"agents", agents_json},
                                 {"cpus", UsableCpuCount()}};
  if (absl::Status s = bench::PrintReport(table, report, args.json_path); !s.ok()) return Fail(s);
  int status = 0;
  for (const AgentResult& r : results) {
    for (const Phase& p : r.phases) {
      if (p.failed > 0) status = 1;
      const double per_request = (p.peak_mib - r.idle_mib) / static_cast<double>(p.concurrency);
      if (args.max_fraction > 0 && per_request > args.max_fraction * reserved_mib) {
        std::fprintf(stderr,
                     "%s @%lld: %.2f MiB per request is more than %.2f of the %.2f MiB an "
                     "up-front reservation takes\n",
                     r.label.c_str(), static_cast<long long>(p.concurrency), per_request,
                     args.max_fraction, reserved_mib);
        status = 1;
      }
    }
  }
  return status;
}

}  // namespace
}  // namespace tophat

int main(int argc, char** argv) {
  tophat::Args args;
  CLI::App app{
      "tophat-bench-agent-memory: tophat-agent's resident memory when idle and at its peak "
      "with N concurrent requests that may run to the context but whose app stops after "
      "--tokens tokens, against a real tophat-cloud on loopback. Give --agent more than once "
      "(LABEL=PATH) to compare agent builds in one run. Prints a table and a JSON report."};
  app.add_option("--model", args.model_dir,
                 "A Hugging Face checkpoint directory with a tokenizer (split here)")
      ->required()->check(CLI::ExistingDirectory);
  app.add_option("-m,--input-layers", args.input_layers)->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app.add_option("-k,--output-layers", args.output_layers)->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app.add_option("--prompt-tokens", args.prompt_tokens)->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--tokens", args.tokens, "Tokens each app reads before it stops")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--concurrency", args.concurrency, "Concurrent requests of each phase")
      ->capture_default_str()->delimiter(',')->check(CLI::Range(1, 1024));
  app.add_option("--max-context", args.max_context,
                 "The agent's and cloud's max_context; requests ask for all of it")
      ->capture_default_str()->check(CLI::Range(2, 1 << 20));
  app.add_option("--dtype", args.dtype, "Compute dtype of the cloud and the agent")
      ->capture_default_str()->check(CLI::IsMember({"float32", "bfloat16"}));
  app.add_option("--agent", args.agents,
                 "A tophat-agent binary, LABEL=PATH or PATH (default: this build's)");
  app.add_option("--json", args.json_path, "Also write the report here");
  app.add_option("--device-weights", args.device_weights,
                 "The device bundle's matrices: as-stored or int8 (tophat split --device-weights)")
      ->capture_default_str()->check(CLI::IsMember({"as-stored", "int8"}));
  app.add_option("--max-fraction", args.max_fraction,
                 "Fail when memory per request passes this fraction of an up-front "
                 "reservation of the context (0: no check)")
      ->capture_default_str()->check(CLI::Range(0.0, 10.0));
  CLI11_PARSE(app, argc, argv);
  return tophat::Run(args);
}
