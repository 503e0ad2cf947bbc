#include "bench/machine_bounds.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include "bench/model_benchmark.h"
#include "models/runtime/model_init.h"
// After every header that pulls in ATen: c10's glog defines its own CHECK, which would
// otherwise replace Catch's.
#include <catch2/catch.hpp>

namespace tophat {
namespace {

namespace fs = std::filesystem;

TEST_CASE("read bandwidth of a small buffer is sane", "[bench]") {
  BandwidthOptions options;
  options.bytes = int64_t{64} << 20;
  options.repetitions = 1;
  const double bandwidth = MeasureReadBandwidth(options);
  CHECK(std::isfinite(bandwidth));
  CHECK(bandwidth > 1e8);
  CHECK(bandwidth < 1e12);
}

TEST_CASE("read bandwidth with one thread, an odd size and small pages", "[bench]") {
  BandwidthOptions options;
  options.bytes = (int64_t{8} << 20) + 12345;
  options.repetitions = 2;
  options.threads = 1;
  options.huge_pages = false;
  const double bandwidth = MeasureReadBandwidth(options);
  CHECK(std::isfinite(bandwidth));
  CHECK(bandwidth > 1e8);
}

TEST_CASE("machine facts", "[bench]") {
  CHECK(UsableCpuCount() >= 1);
  CHECK(LastLevelCacheBytes() >= 0);
  CHECK(DefaultBandwidthBytes() >= (int64_t{1} << 30));
  CHECK(DefaultBandwidthBytes() >= 8 * LastLevelCacheBytes());
}

TEST_CASE("GEMM rate is positive", "[bench]") {
  const double rate = MeasureGemmFlops(128, 192, 256, 2);
  CHECK(std::isfinite(rate));
  CHECK(rate > 0.0);
  const double transposed = MeasureGemmFlops(64, 96, 128, 1, /*b_transposed=*/true);
  CHECK(transposed > 0.0);
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

TEST_CASE("model benchmark runs on the tiny model", "[bench]") {
  const fs::path dir =
      fs::temp_directory_path() / ("tophat_bench_model_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  REQUIRE(WriteRandomModel(TinyTestConfig(), 3, dir).ok());

  ModelBenchOptions options;
  options.prompt_tokens = 32;
  options.decode_tokens = 4;
  options.repetitions = 1;
  options.bandwidth_bytes = int64_t{16} << 20;
  int progress_lines = 0;
  auto report = RunModelBenchmark(dir, options, [&](std::string_view) { ++progress_lines; });
  fs::remove_all(dir);
  REQUIRE(report.ok());
  CHECK(progress_lines > 0);
  CHECK(report->layers == 4);
  CHECK(report->prefill_tokens_per_s > 0.0);
  CHECK(report->decode_tokens_per_s > 0.0);
  CHECK(report->weight_bytes_per_token > 0);
  CHECK(report->flops_per_prefill_token > 0.0);
  CHECK(report->decode_bound_tokens_per_s ==
        Approx(report->read_bandwidth_bytes_per_s /
               static_cast<double>(report->weight_bytes_per_token)));
  CHECK(report->prefill_bound_tokens_per_s ==
        Approx(report->gemm_flops_per_s / report->flops_per_prefill_token));
  CHECK(report->decode_fraction > 0.0);
  CHECK(report->prefill_fraction > 0.0);

  const nlohmann::json json = report->ToJson();
  CHECK(json["decode_tokens_per_s"].get<double>() == report->decode_tokens_per_s);
  CHECK(json["model"]["layers"].get<int64_t>() == 4);
  const std::string table = report->ToTable();
  CHECK(table.find("decode") != std::string::npos);
  CHECK(table.find("fraction") != std::string::npos);
}

TEST_CASE("model benchmark rejects a context the model lacks", "[bench]") {
  const fs::path dir =
      fs::temp_directory_path() / ("tophat_bench_model_ctx_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  REQUIRE(WriteRandomModel(TinyTestConfig(), 3, dir).ok());
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
