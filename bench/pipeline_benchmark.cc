// tophat-bench-pipeline: does the cloud's pipeline overlap its stages? The same middle runs
// (a) as one stage and (b) split in two stages over Gloo on loopback, each stage on one
// thread (ATen single-threaded), under a saturating stream of batches: stage 0 keeps two
// batches submitted (Downstream::Submit / Collect, as the engine does with P = 2 micro-
// batches) while stage 1 serves in its own thread (ServeStage, the `--stage 1` loop). On a
// machine with two free cores the two-stage throughput can approach 2x the one-stage one,
// less the transfers. The same-run ratio is the result. Prints a table and a JSON report.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "base/program.h"
#include "bench/bench_util.h"
#include "bench/machine_bounds.h"
#include "bench/model_benchmark.h"
#include "models/runtime/compute_threads.h"
#include "models/runtime/model_init.h"
#include "server/pipeline/pipeline_stage.h"

namespace tophat {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct Args {
  int64_t layers = 8;
  int64_t hidden = 1024;
  int64_t batch_tokens = 64;  // tokens per batch: a prefill chunk of one sequence
  int64_t batches = 60;
  int repetitions = 3;
  std::string json_path;
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
  CLI11_PARSE(app, argc, argv);
  return tophat::Run(args);
}
