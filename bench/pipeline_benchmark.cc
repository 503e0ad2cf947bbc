// tophat-bench-pipeline: does the cloud's pipeline overlap its stages? The same middle runs
// (a) as one stage and (b) split in two stages over Gloo on loopback, each stage on one
// thread (ATen single-threaded), under a saturating stream of batches: stage 0 keeps two
// batches submitted (Downstream::Submit / Collect, as the engine does with P = 2 micro-
// batches) while stage 1 serves in its own thread (ServeStage, the `--stage 1` loop). On a
// machine with two free cores the two-stage throughput can approach 2x the one-stage one,
// less the transfers. The same-run ratio is the result. Prints a table and a JSON report.
//
// --serving measures the whole path instead: real tophat-cloud stage processes and a
// tophat-agent on loopback, a saturating burst of requests through the SDK, the engine's
// token-budget micro-batches (P in flight), for one stage against two even stages (one thread
// each), and, with --stage-threads, two stages of different thread counts split evenly
// against split by the layer planner from each stage's own start-up profile.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/program.h"
#include "bench/bench_util.h"
#include "bench/machine_bounds.h"
#include "bench/model_benchmark.h"
#include "bench/process_control.h"
#include "bench/workload_runner.h"
#include "models/runtime/bundle.h"
#include "models/runtime/compute_threads.h"
#include "models/runtime/model_init.h"
#include "server/pipeline/pipeline_stage.h"

namespace tophat {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using bench::CpuSeconds;

struct Args {
  int64_t layers = 8;
  int64_t hidden = 1024;
  int64_t batch_tokens = 64;  // tokens per batch: a prefill chunk of one sequence
  int64_t batches = 60;
  int repetitions = 3;
  std::string json_path;
  // --serving
  bool serving = false;
  std::string tokenizer_model;  // a checkpoint whose tokenizer.model the random model uses
  int64_t serving_hidden = 512;
  int64_t requests = 16;
  int64_t prompt_tokens = 256;
  int64_t output_tokens = 8;
  std::vector<int64_t> stage_threads;  // heterogeneous stages: threads of stage 0 and 1
};

ModelConfig Config(const Args& args) {
  ModelConfig c = Bench110MConfig();
  c.num_hidden_layers = args.layers;
  c.hidden_size = args.hidden;
  c.intermediate_size = args.hidden * 8 / 3 / 64 * 64;
  c.num_attention_heads = args.hidden / 64;
  c.num_key_value_heads = args.hidden / 64;
  c.head_dim = 64;
  return c;
}

std::unique_ptr<Submodel> Load(const ModelConfig& config, const CheckpointReader& checkpoint,
                               LayerRange layers, int64_t max_context) {
  auto model = Submodel::Load(config, checkpoint, {.layers = layers},
                              {.dtype = at::kFloat, .device = at::kCPU,
                               .max_context = max_context, .huge_pages = false});
  if (!model.ok()) std::exit(Fail(model.status()));
  return std::move(*model);
}

std::shared_ptr<KvBlockPool> Pool(const ModelConfig& config, int64_t layers, int64_t blocks) {
  auto pool = KvBlockPool::Create(config, layers, blocks, 16, at::kFloat, at::kCPU);
  if (!pool.ok()) std::exit(Fail(pool.status()));
  return *pool;
}

// One sequence per batch, each its own blocks, so the KV grows as prefill would.
struct Sequences {
  std::vector<KvCache> caches;
  Sequences(const std::shared_ptr<KvBlockPool>& pool, int64_t count, int64_t blocks_each) {
    for (int64_t s = 0; s < count; ++s) {
      caches.emplace_back(pool);
      for (int64_t b = 0; b < blocks_each; ++b) {
        caches.back().AppendBlock(static_cast<int32_t>(s * blocks_each + b));
      }
    }
  }
};

int Run(const Args& args) {
  // One thread per stage: LibTorch's pool and OpenBLAS's (which would otherwise run two
  // spinning threads per GEMM on each stage's thread).
  if (absl::Status s = SetComputeThreads(1); !s.ok()) return Fail(s);
  const ModelConfig config = Config(args);
  auto scratch = bench::ScratchDir::Create("tophat-bench-pipeline");
  if (!scratch.ok()) return Fail(scratch.status());
  if (absl::Status s = WriteCheckpoint(config, InitWeights(config, 1), scratch->path()); !s.ok()) {
    return Fail(s);
  }
  auto checkpoint = CheckpointReader::Open(scratch->path());
  if (!checkpoint.ok()) return Fail(checkpoint.status());
  const int64_t half = args.layers / 2;
  const int64_t blocks_each = (args.batch_tokens + 15) / 16;
  const int64_t blocks = args.batches * blocks_each;
  auto whole = Load(config, **checkpoint, {0, args.layers}, args.batch_tokens);
  auto first = Load(config, **checkpoint, {0, half}, args.batch_tokens);
  auto second = Load(config, **checkpoint, {half, args.layers}, args.batch_tokens);
  const at::Tensor hidden = at::randn({args.batch_tokens, config.hidden_size});

  // Stage 1 in its own thread for the whole run.
  auto second_pool = Pool(config, args.layers - half, blocks);
  auto rendezvous = pipeline::Rendezvous::Join(
      {.address = "127.0.0.1:0", .rank = 0, .size = 2, .timeout = milliseconds(60000)});
  if (!rendezvous.ok()) return Fail(rendezvous.status());
  const int port = (*rendezvous)->port();
  std::future<absl::Status> served = std::async(std::launch::async, [&] {
    auto joined = pipeline::Rendezvous::Join({.address = absl::StrFormat("127.0.0.1:%d", port),
                                              .rank = 1, .size = 2,
                                              .timeout = milliseconds(60000)});
    if (!joined.ok()) return joined.status();
    auto transport = pipeline::ConnectGloo(**joined);
    if (!transport.ok()) return transport.status();
    return pipeline::ServeStage(**transport, *second, second_pool, milliseconds(60000));
  });
  auto transport = pipeline::ConnectGloo(**rendezvous);
  if (!transport.ok()) return Fail(transport.status());
  pipeline::Downstream downstream(std::move(*transport), config.hidden_size, at::kFloat,
                                  args.layers, milliseconds(60000));

  std::vector<double> one_stage;
  std::vector<double> two_stages;
  for (int r = 0; r < args.repetitions; ++r) {
    {  // one stage
      Sequences seqs(Pool(config, args.layers, blocks), args.batches, blocks_each);
      const auto start = Clock::now();
      for (int64_t b = 0; b < args.batches; ++b) {
        SequenceChunk chunk{.cache = &seqs.caches[b], .num_tokens = args.batch_tokens};
        auto out = whole->Forward(hidden, std::span<const SequenceChunk>(&chunk, 1));
        if (!out.ok()) return Fail(out.status());
      }
      one_stage.push_back(args.batches * args.batch_tokens /
                          std::chrono::duration<double>(Clock::now() - start).count());
    }
    {  // two stages, two batches in flight
      Sequences seqs(Pool(config, half, blocks), args.batches, blocks_each);
      const auto start = Clock::now();
      int64_t collected = 0;
      for (int64_t b = 0; b < args.batches; ++b) {
        SequenceChunk chunk{.cache = &seqs.caches[b], .num_tokens = args.batch_tokens};
        const std::span<const SequenceChunk> chunks(&chunk, 1);
        auto out = first->Forward(hidden, chunks);
        if (!out.ok()) return Fail(out.status());
        if (absl::Status s = downstream.Submit(*out, chunks); !s.ok()) return Fail(s);
        if (b - collected >= 1) {  // two submitted: take the older one's answer
          if (auto deep = downstream.Collect(); !deep.ok()) return Fail(deep.status());
          ++collected;
        }
      }
      for (; collected < args.batches; ++collected) {
        if (auto deep = downstream.Collect(); !deep.ok()) return Fail(deep.status());
      }
      two_stages.push_back(args.batches * args.batch_tokens /
                           std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  downstream.Shutdown();
  if (absl::Status s = served.get(); !s.ok()) return Fail(s);

  auto best = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  const double one = best(one_stage);
  const double two = best(two_stages);
  const double ratio = two / one;
  std::string table = absl::StrFormat(
      "| case | tokens/s (best of %d) |\n|---|---:|\n| 1 stage, 1 thread | %.0f |\n"
      "| 2 stages over Gloo, 1 thread each, 2 batches in flight | %.0f |\n"
      "| ratio | %.2f |\n",
      args.repetitions, one, two, ratio);
  const nlohmann::json report = {
      {"benchmark", "pipeline_overlap"},
      {"model", {{"layers", args.layers}, {"hidden_size", config.hidden_size},
                 {"intermediate_size", config.intermediate_size}}},
      {"batch_tokens", args.batch_tokens},
      {"batches", args.batches},
      {"one_stage_tokens_per_s", one_stage},
      {"two_stages_tokens_per_s", two_stages},
      {"ratio_best", ratio},
      {"cpus", UsableCpuCount()}};
  if (absl::Status s = bench::PrintReport(table, report, args.json_path); !s.ok()) return Fail(s);
  return 0;
}


// --serving: the processes of one case.
struct ServingCase {
  std::string name;
  std::vector<int64_t> boundaries;  // empty: one stage
  int64_t planned_stages = 0;       // or: the planner splits
  std::vector<int64_t> threads;     // per stage
};

struct ServingResult {
  std::vector<double> tokens_per_s;  // prompt + generated tokens per second of wall time
  std::string boundaries;            // as the stages ran (planned ones from stage 0's log)
  std::vector<double> cpu_share;     // of the best run: cores each stage, then the agent, used
};

std::string LastLine(const std::string& log, const std::string& marker) {
  const size_t at = log.rfind(marker);
  if (at == std::string::npos) return "";
  const size_t end = log.find('\n', at);
  return log.substr(at + marker.size(), end == std::string::npos ? std::string::npos : end - at - marker.size());
}

// One run of `c`: stages and an agent start, a burst of requests runs through them, all stop.
absl::StatusOr<double> RunServingCase(const ServingCase& c, const Args& args,
                                      const std::filesystem::path& bundles,
                                      const std::filesystem::path& dir, std::string* boundaries,
                                      std::vector<double>* cpu_share) {
  namespace fs = std::filesystem;
  using bench::ChildProcess;
  fs::create_directories(dir);
  const fs::path bin = fs::read_symlink("/proc/self/exe").parent_path();
  const int cloud_port = bench::FreePort();
  const int stages = c.planned_stages > 0 ? static_cast<int>(c.planned_stages)
                     : c.boundaries.empty() ? 1
                                            : static_cast<int>(c.boundaries.size()) - 1;
  std::string cloud = absl::StrFormat(
      "listen_address: \"127.0.0.1:%d\"\nbundle: \"%s\"\nmax_context: 1024\n"
      "tls:\n  insecure: true\n"
      "metrics_address: \"\"\ncompute_threads: %d\nkv_cache:\n  memory_bytes: 512MiB\n"
      "scheduler:\n  max_batch_tokens: 256\n  max_running_sessions: 64\n"
      "  max_waiting_sessions: 64\n",
      cloud_port, (bundles / "cloud").string(), c.threads.front());
  if (stages > 1) {
    cloud += absl::StrFormat("pipeline:\n  rendezvous_address: \"127.0.0.1:%d\"\n  "
                             "compute_threads: [%s]\n",
                             bench::FreePort(), absl::StrJoin(c.threads, ", "));
    cloud += c.planned_stages > 0
                 ? absl::StrFormat("  planned_stages: %d\n", c.planned_stages)
                 : absl::StrFormat("  layer_boundaries: [%s]\n", absl::StrJoin(c.boundaries, ", "));
  }
  const int agent_port = bench::FreePort();
  // A fixed chunk: the comparison is of the cloud, not of the adaptive chunk size.
  const std::string agent = absl::StrFormat(
      "listen_address: \"127.0.0.1:%d\"\ncloud_address: \"127.0.0.1:%d\"\nbundle: \"%s\"\n"
      "cloud_tls:\n  insecure: true\n"
      "max_context: 1024\nprompt_chunk_size: 128\nmax_concurrent_requests: 256\n"
      "compute_threads: 1\nmetrics_address: \"\"\nspeculative:\n  enabled: false\n",
      agent_port, cloud_port, (bundles / "device").string());
  if (absl::Status s = bench::WriteTextFile(dir / "cloud.yaml", cloud); !s.ok()) return s;
  if (absl::Status s = bench::WriteTextFile(dir / "agent.yaml", agent); !s.ok()) return s;

  std::vector<std::unique_ptr<ChildProcess>> processes;
  processes.push_back(std::make_unique<ChildProcess>(
      std::vector<std::string>{(bin / "tophat-cloud").string(), "--config",
                               (dir / "cloud.yaml").string()},
      dir / "cloud.log"));
  for (int stage = 1; stage < stages; ++stage) {
    processes.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{(bin / "tophat-cloud").string(), "--config",
                                 (dir / "cloud.yaml").string(), "--stage", std::to_string(stage)},
        dir / absl::StrCat("stage-", stage, ".log")));
  }
  auto stop = [&] {
    for (auto it = processes.rbegin(); it != processes.rend(); ++it) (*it)->Signal(SIGTERM);
    for (auto& process : processes) process->Wait(std::chrono::seconds(20));
  };
  if (!bench::WaitForPort(cloud_port, std::chrono::seconds(180))) {
    const std::string log = processes.front()->Log();
    stop();
    return absl::UnavailableError(absl::StrCat("tophat-cloud did not start:\n", log));
  }
  processes.push_back(std::make_unique<ChildProcess>(
      std::vector<std::string>{(bin / "tophat-agent").string(), "--config",
                               (dir / "agent.yaml").string()},
      dir / "agent.log"));
  if (!bench::WaitForPort(agent_port, std::chrono::seconds(120))) {
    const std::string log = processes.back()->Log();
    stop();
    return absl::UnavailableError(absl::StrCat("tophat-agent did not start:\n", log));
  }
  const std::string agent_address = absl::StrCat("127.0.0.1:", agent_port);
  // A short warm-up, then the burst: every request at once, so that the cloud always has
  // work for P micro-batches.
  bench::WorkloadSpec warm{.requests = 2, .rate = 0,
                           .prompt_lengths = absl::StrCat("fixed:", args.prompt_tokens),
                           .output_tokens = 2, .seed = 99};
  (void)bench::RunWorkload({agent_address}, warm);
  std::vector<double> cpu_before;
  for (auto& process : processes) cpu_before.push_back(CpuSeconds(process->pid()));
  bench::WorkloadSpec burst{.requests = args.requests, .rate = 0,
                            .prompt_lengths = absl::StrCat("fixed:", args.prompt_tokens),
                            .output_tokens = args.output_tokens, .seed = 7};
  absl::StatusOr<bench::WorkloadRun> run = bench::RunWorkload({agent_address}, burst);
  // Each process's share of a core over the burst: stages first, the agent last.
  cpu_share->clear();
  for (size_t p = 0; p < processes.size() && run.ok(); ++p) {
    cpu_share->push_back((CpuSeconds(processes[p]->pid()) - cpu_before[p]) / run->wall_seconds);
  }
  *boundaries = c.planned_stages > 0
                    ? LastLine(processes.front()->Log(), "planned layer boundaries ")
                    : absl::StrJoin(c.boundaries, ", ");
  stop();
  if (!run.ok()) return run.status();
  int64_t tokens = 0;
  for (const bench::RequestOutcome& outcome : run->outcomes) {
    if (!outcome.status.ok()) {
      return absl::InternalError(absl::StrCat(c.name, ": a request failed: ",
                                              outcome.status.ToString(), " (logs in ",
                                              dir.string(), ")"));
    }
    tokens += args.prompt_tokens + static_cast<int64_t>(outcome.result.token_ids.size());
  }
  return static_cast<double>(tokens) / run->wall_seconds;
}

int RunServing(const Args& args) {
  namespace fs = std::filesystem;
  auto scratch = bench::ScratchDir::Create("tophat-bench-pipeline-serving");
  if (!scratch.ok()) return Fail(scratch.status());
  // A random Llama of the toy model's vocabulary (its tokenizer, so the agent loads) whose
  // middle is `layers` layers of `serving_hidden` width: the cloud's work dominates the
  // agent's (one input layer, one output layer and a 512-token head).
  ModelConfig config = Config(args);
  config.hidden_size = args.serving_hidden;
  config.intermediate_size = args.serving_hidden * 8 / 3 / 64 * 64;
  config.num_attention_heads = args.serving_hidden / 64;
  config.num_key_value_heads = args.serving_hidden / 64;
  config.num_hidden_layers = args.layers + 2;
  config.vocab_size = 512;
  config.tie_word_embeddings = false;
  const fs::path model = scratch->path() / "model";
  fs::create_directories(model);
  if (absl::Status s = WriteCheckpoint(config, InitWeights(config, 1), model); !s.ok()) {
    return Fail(s);
  }
  std::error_code copied;
  fs::copy_file(fs::path(args.tokenizer_model) / "tokenizer.model", model / "tokenizer.model",
                copied);
  if (copied) {
    return Fail(absl::NotFoundError(absl::StrCat(
        "--tokenizer-from ", args.tokenizer_model, ": no tokenizer.model (",
        copied.message(), "); give the toy model's directory (tophat toy-model)")));
  }
  auto split = SplitCheckpoint({.model_dir = model, .input_layers = 1, .output_layers = 1,
                                .out_dir = scratch->path() / "bundles"});
  if (!split.ok()) return Fail(split.status());
  const int64_t first = 1;
  const int64_t end = 1 + args.layers;
  const int64_t middle = first + args.layers / 2;
  std::vector<ServingCase> cases = {
      {.name = "1 stage, 1 thread", .threads = {1}},
      {.name = "2 stages (even), 1 thread each", .boundaries = {first, middle, end},
       .threads = {1, 1}},
  };
  if (!args.stage_threads.empty()) {
    const std::string threads = absl::StrJoin(args.stage_threads, "+");
    cases.push_back({.name = absl::StrCat("2 stages (even), ", threads, " threads"),
                     .boundaries = {first, middle, end}, .threads = args.stage_threads});
    cases.push_back({.name = absl::StrCat("2 stages (planned), ", threads, " threads"),
                     .planned_stages = 2, .threads = args.stage_threads});
  }
  std::vector<ServingResult> results(cases.size());
  // Interleaved repetitions: drift in the machine's speed touches every case alike.
  for (int r = 0; r < args.repetitions; ++r) {
    for (size_t i = 0; i < cases.size(); ++i) {
      std::fprintf(stderr, "[%d/%d] %s\n", r + 1, args.repetitions, cases[i].name.c_str());
      std::vector<double> cpu_share;
      absl::StatusOr<double> rate = RunServingCase(
          cases[i], args, scratch->path() / "bundles",
          scratch->path() / absl::StrCat("run-", r, "-", i), &results[i].boundaries, &cpu_share);
      if (!rate.ok()) return Fail(rate.status());
      if (results[i].tokens_per_s.empty() ||
          *rate > *std::max_element(results[i].tokens_per_s.begin(), results[i].tokens_per_s.end())) {
        results[i].cpu_share = cpu_share;
      }
      results[i].tokens_per_s.push_back(*rate);
    }
  }
  auto best = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  std::string table = absl::StrFormat(
      "| case | layer boundaries | tokens/s (best of %d) | vs 1 stage | cores used: stages, agent |\n"
      "|---|---|---:|---:|---|\n",
      args.repetitions);
  nlohmann::json runs = nlohmann::json::array();
  const double baseline = best(results[0].tokens_per_s);
  for (size_t i = 0; i < cases.size(); ++i) {
    const double rate = best(results[i].tokens_per_s);
    std::vector<std::string> shares;
    for (double share : results[i].cpu_share) shares.push_back(absl::StrFormat("%.2f", share));
    table += absl::StrFormat("| %s | %s | %.0f | %.2f | %s |\n", cases[i].name,
                             results[i].boundaries.empty() ? "-" : results[i].boundaries, rate,
                             rate / baseline, absl::StrJoin(shares, ", "));
    runs.push_back({{"case", cases[i].name},
                    {"layer_boundaries", results[i].boundaries},
                    {"threads", cases[i].threads},
                    {"tokens_per_s", results[i].tokens_per_s},
                    {"cores_used_stages_then_agent", results[i].cpu_share},
                    {"ratio_to_one_stage_best", rate / baseline}});
  }
  if (cases.size() == 4) {
    table += absl::StrFormat("| planned / even (%s threads) | | | %.2f | |\n",
                             absl::StrJoin(args.stage_threads, "+"),
                             best(results[3].tokens_per_s) / best(results[2].tokens_per_s));
  }
  const nlohmann::json report = {
      {"benchmark", "pipeline_serving"},
      {"model", {{"layers", config.num_hidden_layers}, {"middle_layers", args.layers},
                 {"hidden_size", config.hidden_size},
                 {"intermediate_size", config.intermediate_size}}},
      {"requests", args.requests},
      {"prompt_tokens", args.prompt_tokens},
      {"output_tokens", args.output_tokens},
      {"cases", runs},
      {"cpus", UsableCpuCount()}};
  if (absl::Status s = bench::PrintReport(table, report, args.json_path); !s.ok()) return Fail(s);
  return 0;
}

}  // namespace
}  // namespace tophat

int main(int argc, char** argv) {
  tophat::Args args;
  CLI::App app{
      "tophat-bench-pipeline: throughput of the cloud's middle as one stage and as two "
      "pipeline stages over Gloo on loopback (one thread each, two batches in flight), in the "
      "same run. Prints a table and a JSON report."};
  app.add_option("--layers", args.layers, "Layers of the random middle (split in half)")
      ->capture_default_str()->check(CLI::Range(2, 128));
  app.add_option("--hidden", args.hidden, "Hidden size (a multiple of 64)")
      ->capture_default_str()->check(CLI::Range(64, 8192));
  app.add_option("--batch-tokens", args.batch_tokens, "Tokens per batch")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--batches", args.batches, "Batches per repetition")
      ->capture_default_str()->check(CLI::Range(2, 100000));
  app.add_option("--repetitions", args.repetitions)->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--json", args.json_path, "Also write the report here");
  auto* serving = app.add_flag(
      "--serving", args.serving,
      "Measure through real processes instead: tophat-cloud stages and a tophat-agent on "
      "loopback under a burst of requests (one stage against two)");
  app.add_option("--tokenizer-from", args.tokenizer_model,
                 "With --serving: a checkpoint directory whose tokenizer.model (vocabulary "
                 "512) the random model uses, e.g. the toy model's")
      ->needs(serving);
  app.add_option("--serving-hidden", args.serving_hidden,
                 "With --serving: hidden size of the random model (--layers is its middle)")
      ->capture_default_str()->check(CLI::Range(64, 8192))->needs(serving);
  app.add_option("--requests", args.requests, "With --serving: requests in the burst")
      ->capture_default_str()->check(CLI::Range(2, 4096))->needs(serving);
  app.add_option("--prompt-tokens", args.prompt_tokens, "With --serving: tokens per prompt")
      ->capture_default_str()->check(CLI::Range(1, 1000))->needs(serving);
  app.add_option("--output-tokens", args.output_tokens,
                 "With --serving: tokens generated per request")
      ->capture_default_str()->check(CLI::Range(1, 1000))->needs(serving);
  app.add_option("--stage-threads", args.stage_threads,
                 "With --serving: also two stages with these thread counts (e.g. 2,1), "
                 "split evenly and by the layer planner")
      ->delimiter(',')->expected(2)->needs(serving);
  CLI11_PARSE(app, argc, argv);
  if (args.serving) {
    if (args.tokenizer_model.empty()) {
      std::fprintf(stderr, "--serving needs --tokenizer-from DIR (e.g. the toy model's)\n");
      return 2;
    }
    return tophat::RunServing(args);
  }
  return tophat::Run(args);
}
