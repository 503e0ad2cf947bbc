#include "bench/machine_bounds.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <thread>
#include <vector>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include <ATen/Parallel.h>

#include "bench/model_benchmark.h"
#include "models/formats/safetensors.h"
#include "models/runtime/model_init.h"
// After every header that pulls in ATen: c10's glog defines its own CHECK, which would
// otherwise replace Catch's.
#include <catch2/catch.hpp>

namespace tophat {
namespace {

namespace fs = std::filesystem;

// A plain single-threaded sum over `bytes` of memory, timed here: an independent, slower
// estimate of read bandwidth (bytes/s) that the probe's numbers are checked against.
double NaiveReadBandwidth(int64_t bytes) {
  std::vector<uint64_t> buffer(static_cast<size_t>(bytes / 8), 1);
  uint64_t sum = std::accumulate(buffer.begin(), buffer.end(), uint64_t{0});  // fault pages in
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    sum += std::accumulate(buffer.begin(), buffer.end(), uint64_t{0});
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(bytes) / seconds);
  }
  REQUIRE(sum == 4 * buffer.size());
  return best;
}

// The probe against a naive sum measured in the same test: it uses every core and wide
// loads, so it is not much slower than one thread's plain loop, and not a unit's worth
// (1,000x, 8x for bits) faster. A wrong unit or a timer off by a factor fails here, where a
// plausibility range such as "between 100 MB/s and 1 TB/s" would not.
TEST_CASE("The read-bandwidth probe agrees with a naive timed sum to within its method",
          "[bench]") {
  const int64_t bytes = int64_t{256} << 20;
  const double naive = NaiveReadBandwidth(bytes);
  for (const bool huge_pages : {true, false}) {
    CAPTURE(huge_pages);
    BandwidthOptions options;
    options.bytes = bytes + 12345;  // an odd size
    options.repetitions = 2;
    options.huge_pages = huge_pages;
    const double probe = MeasureReadBandwidth(options);
    INFO("probe " << probe / 1e9 << " GB/s, naive sum " << naive / 1e9 << " GB/s");
    CHECK(probe >= 0.3 * naive);
    CHECK(probe <= 8 * naive * std::max(1, UsableCpuCount()));
  }
}

// A naive triple loop's rate on a small float32 product, timed here (FLOP/s, 2mnk each).
double NaiveGemmFlops(int64_t n) {
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n, 0.0f);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < n; ++k) {
        const float x = a[i * n + k];
        for (int64_t j = 0; j < n; ++j) c[i * n + j] += x * b[k * n + j];
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) / seconds);
  }
  REQUIRE(c[0] > 0);
  return best;
}

// The GEMM probe against a naive loop (which the compiler vectorises: the probe's BLAS is
// faster, but not by a unit's worth, and never slower by much). A FLOP count off by the
// factor 2 of a multiply-add, or by m, n or k, falls outside.
TEST_CASE("The GEMM probe's rate agrees with a naive loop to within its method", "[bench]") {
  // One ATen thread, like the naive loop: a product this small is over in well under a
  // millisecond, and with two threads on a machine whose other core is busy (ctest -j2) every
  // call waited a scheduler slice for its second thread at the fork-join (0.9 GFLOP/s measured
  // against 205 the call before).
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const double naive = NaiveGemmFlops(192);
  const double rate = MeasureGemmFlops(192, 192, 192, 3);
  const double transposed = MeasureGemmFlops(192, 192, 192, 3, /*b_transposed=*/true);
  INFO("probe " << rate / 1e9 << " GFLOP/s, transposed " << transposed / 1e9
                << ", naive loop " << naive / 1e9);
  for (const double measured : {rate, transposed}) {
    CHECK(measured >= 0.5 * naive);
    CHECK(measured <= 200 * naive);
  }
  // The probe counts 2mnk for any shape: a product 4x as long in k takes about 4x as long, so
  // its rate stays within a factor of the square one's.
  const double deep = MeasureGemmFlops(192, 192, 768, 3);
  at::set_num_threads(threads);
  CHECK(deep >= 0.3 * rate);
  CHECK(deep <= 3 * rate);
}

TEST_CASE("machine facts", "[bench]") {
  CHECK(UsableCpuCount() >= 1);
  CHECK(UsableCpuCount() <= static_cast<int>(std::thread::hardware_concurrency()));
  CHECK(DefaultBandwidthBytes() >= (int64_t{1} << 30));
  CHECK(DefaultBandwidthBytes() >= 8 * LastLevelCacheBytes());
}

TEST_CASE("Bench110MConfig has the stories110M shape", "[bench]") {
  const ModelConfig c = Bench110MConfig();
  CHECK(c.hidden_size == 768);
  CHECK(c.num_hidden_layers == 12);
  CHECK(c.num_attention_heads == 12);
  CHECK(c.num_key_value_heads == 12);
  CHECK(c.intermediate_size == 2048);
  CHECK(c.vocab_size == 32000);
  CHECK(c.max_position_embeddings == 2048);
  const int64_t params =
      c.vocab_size * c.hidden_size + c.num_hidden_layers * c.LayerParameterCount() + c.hidden_size;
  CHECK(params > 100'000'000);
  CHECK(params < 120'000'000);
}

// A random tiny checkpoint in a directory of its own (`name` and this process's id), for a
// test to run the model benchmark on and remove.
fs::path WriteTinyModel(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  REQUIRE(WriteRandomModel(TinyTestConfig(), 3, dir).ok());
  return dir;
}

TEST_CASE("model benchmark runs on the tiny model", "[bench]") {
  const fs::path dir = WriteTinyModel("tophat_bench_model_test");

  ModelBenchOptions options;
  options.prompt_tokens = 32;
  options.decode_tokens = 4;
  options.repetitions = 1;
  options.bandwidth_bytes = int64_t{16} << 20;
  int progress_lines = 0;
  auto report = RunModelBenchmark(dir, options, [&](std::string_view) { ++progress_lines; });
  REQUIRE(report.ok());
  CHECK(progress_lines > 0);
  CHECK(report->layers == 4);
  CHECK(report->prefill_tokens_per_s > 0.0);
  CHECK(report->decode_tokens_per_s > 0.0);
  // The bytes a decoded token reads, from the checkpoint on disk rather than the model in
  // memory: every tensor, except that the embedding table gives one row (and, when the head
  // is tied to it, is read whole by the head).
  auto file = SafetensorsFile::Open(dir / "model.safetensors");
  fs::remove_all(dir);  // the mapping stays readable
  REQUIRE(file.ok());
  int64_t file_bytes = 0;
  int64_t layer_matmul_params = 0;  // of the layers' 2-D weights
  for (const auto& [name, info] : (*file)->tensors()) {
    file_bytes += static_cast<int64_t>(info.data_end - info.data_begin);
    if (name.find(".layers.") != std::string::npos && info.shape.size() == 2) {
      layer_matmul_params += info.shape[0] * info.shape[1];
    }
  }
  const ModelConfig config = TinyTestConfig();
  const int64_t row = config.hidden_size * 4;
  const int64_t embedding_table = config.vocab_size * row;
  const bool tied = !(*file)->tensors().contains("lm_head.weight");
  CHECK(report->weight_bytes_per_token == (tied ? file_bytes + row : file_bytes - embedding_table + row));
  // FLOPs of a prefill token: 2 per multiply-add of the layers' matrices (counted from the
  // file), attention's and the head's share on top; a missing 2 or layer falls outside.
  const double matmul_flops = 2.0 * static_cast<double>(layer_matmul_params);
  CHECK(report->flops_per_prefill_token >= matmul_flops);
  CHECK(report->flops_per_prefill_token <= 1.5 * matmul_flops +
                                               2.0 * static_cast<double>(config.vocab_size) *
                                                   static_cast<double>(config.hidden_size));
  CHECK(report->decode_fraction > 0.0);
  CHECK(report->prefill_fraction > 0.0);

  const nlohmann::json json = report->ToJson();
  CHECK(json["decode_tokens_per_s"].get<double>() == report->decode_tokens_per_s);
  CHECK(json["model"]["layers"].get<int64_t>() == 4);
  const std::string table = report->ToTable();
  CHECK(table.find("decode") != std::string::npos);
  CHECK(table.find("fraction") != std::string::npos);
  // A float32 CPU model decodes in the fused one-token step; the layer-by-layer path is
  // timed only when asked for.
  CHECK(report->fused_decode);
  CHECK(report->decode_layer_by_layer_tokens_per_s == 0.0);
  CHECK(table.find("layer by layer") == std::string::npos);
}

TEST_CASE("model benchmark times the layer-by-layer path beside the fused step when asked",
          "[bench]") {
  const fs::path dir = WriteTinyModel("tophat_bench_model_lbl");
  ModelBenchOptions options;
  options.prompt_tokens = 16;
  options.decode_tokens = 4;
  options.repetitions = 2;
  options.bandwidth_bytes = int64_t{16} << 20;
  options.compare_layer_by_layer = true;
  std::vector<std::string> lines;
  auto report = RunModelBenchmark(dir, options,
                                  [&](std::string_view line) { lines.emplace_back(line); });
  fs::remove_all(dir);
  REQUIRE(report.ok());
  CHECK(report->fused_decode);
  CHECK(report->decode_tokens_per_s > 0.0);
  CHECK(report->decode_layer_by_layer_tokens_per_s > 0.0);
  // Repetitions alternate: fused, layer by layer, fused, layer by layer.
  std::vector<std::string> decodes;
  for (const std::string& line : lines) {
    if (line.rfind("decode ", 0) == 0) decodes.push_back(line);
  }
  REQUIRE(decodes.size() == 4);
  CHECK(decodes[0].find("layer by layer") == std::string::npos);
  CHECK(decodes[1].find("layer by layer") != std::string::npos);
  CHECK(decodes[2].find("layer by layer") == std::string::npos);
  CHECK(decodes[3].find("layer by layer") != std::string::npos);
  CHECK(report->ToJson()["decode_layer_by_layer_tokens_per_s"].get<double>() ==
        report->decode_layer_by_layer_tokens_per_s);
  CHECK(report->ToTable().find("fused step") != std::string::npos);
}

TEST_CASE("model benchmark rejects a context the model lacks", "[bench]") {
  const fs::path dir = WriteTinyModel("tophat_bench_model_ctx");
  ModelBenchOptions options;
  options.prompt_tokens = TinyTestConfig().max_position_embeddings + 1;
  auto report = RunModelBenchmark(dir, options);
  fs::remove_all(dir);
  CHECK(report.status().code() == absl::StatusCode::kInvalidArgument);
}

// The real measurement, hidden from the default run:
//   tophat_model_bench_test "[.bench110m]"
// Creates (once) the ~110M-parameter model under $TOPHAT_BENCH_DIR or /tmp/bench110m.
TEST_CASE("benchmark the 110M model", "[.bench110m]") {
  const char* env = std::getenv("TOPHAT_BENCH_DIR");
  const fs::path dir = env != nullptr ? fs::path(env) : fs::path("/tmp/bench110m");
  if (!fs::exists(dir / "model.safetensors")) {
    REQUIRE(WriteRandomModel(Bench110MConfig(), 110, dir).ok());
  }
  auto report = RunModelBenchmark(dir, ModelBenchOptions{}, [](std::string_view line) {
    std::cerr << "  " << line << "\n";
  });
  REQUIRE(report.ok());
  std::cout << report->ToTable() << report->ToJson().dump(2) << "\n";
}

}  // namespace
}  // namespace tophat
