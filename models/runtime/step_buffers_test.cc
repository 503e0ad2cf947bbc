#include "models/runtime/step_buffers.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <random>
#include <vector>

#include "base/test_util.h"
#include "models/runtime/counting_cpu_allocator.h"
#include "models/runtime/model_init.h"
#include "models/runtime/submodel.h"

namespace tophat {
namespace {

namespace fs = std::filesystem;

using testing::AllocationsDuring;

// The test variant named `name` (model_init.h), or the tiny Llama for "llama".
ModelConfig VariantNamed(const std::string& name) {
  for (const auto& [variant, config] : TinyTestVariants()) {
    if (variant == name) return config;
  }
  return TinyTestConfig();
}

struct Fixture {
  testing::TempDir scratch;  // declared first: removed after the model that reads it
  ModelConfig config;
  std::unique_ptr<CheckpointReader> checkpoint;
  std::unique_ptr<Submodel> model;

  explicit Fixture(ModelConfig model_config = TinyTestConfig()) : config(std::move(model_config)) {
    const fs::path dir = scratch.path() / "checkpoint";
    REQUIRE(WriteCheckpoint(config, InitWeights(config, 3), dir).ok());
    auto reader = CheckpointReader::Open(dir);
    REQUIRE(reader.ok());
    checkpoint = std::move(*reader);
    // The middle of the model (no embedding, no head): what the cloud's engine runs.
    auto loaded = Submodel::Load(config, *checkpoint, SubmodelSpec::Middle(config, 1, 1));
    REQUIRE(loaded.ok());
    model = std::move(*loaded);
  }
};

TEST_CASE("A decode step into step buffers allocates no tensor storage after warm-up",
          "[submodel][step_buffers]") {
  // A dense model, a mixture of experts whose middle holds a sparse layer (1) and a dense
  // one (2): the experts' routing and grouping stay inside the buffers too; and gpt-oss (its
  // sinks in the one-query kernel, biases, clamped experts).
  const std::string variant = GENERATE(as<std::string>{}, "llama", "qwen3_moe_mixed", "gpt_oss");
  INFO(variant);
  Fixture f(VariantNamed(variant));
  REQUIRE((variant == "llama" || f.config.MoeLayer(1)));
  const Submodel& model = *f.model;
  const int64_t d = f.config.hidden_size;
  constexpr int64_t kBlockSize = 4;
  constexpr int64_t kSequences = 3;
  auto pool = model.NewPagedPool(64, kBlockSize);
  REQUIRE(pool.ok());
  // Three paged sequences with different histories (the CPU's paged decode kernel) and one
  // contiguous cache, as a cloud step mixes them.
  std::vector<KvCache> caches;
  int32_t next_block = 0;
  std::mt19937 rng(5);
  for (int64_t i = 0; i < kSequences; ++i) {
    caches.emplace_back(*pool);
    for (int b = 0; b < 6; ++b) caches.back().AppendBlock(next_block++);
    REQUIRE(model.Forward(at::randn({3 + 4 * i, d}), caches.back()).ok());
  }
  caches.push_back(model.NewCache(32));
  REQUIRE(model.Forward(at::randn({5, d}), caches.back()).ok());

  std::vector<SequenceChunk> chunks;
  for (KvCache& cache : caches) chunks.push_back({.cache = &cache, .num_tokens = 1});
  const auto rows = static_cast<int64_t>(chunks.size());
  StepBuffers buffers = model.NewStepBuffers(/*max_tokens=*/16, kBlockSize);
  // The input written straight into the buffers' rows, as the engine stages it.
  at::Tensor input = buffers.residual.narrow(0, 0, rows);

  // Warm-up: the first step may allocate (thread pools, MKL's buffers).
  input.normal_();
  REQUIRE(model.Forward(input, chunks, buffers).ok());

  for (int step = 0; step < 5; ++step) {
    INFO("decode step " << step);
    // The reference first, on copies of the caches' state: the one-off path.
    std::vector<at::Tensor> inputs;
    for (int64_t r = 0; r < rows; ++r) inputs.push_back(at::randn({1, d}));
    int64_t allocations = -1;
    absl::StatusOr<at::Tensor> out;
    for (int64_t r = 0; r < rows; ++r) input[r].copy_(inputs[static_cast<size_t>(r)][0]);
    const at::Tensor stacked = at::cat(inputs);
    allocations = AllocationsDuring([&] { out = model.Forward(input, chunks, buffers); });
    REQUIRE(out.ok());
    CHECK(allocations == 0);
    CHECK(out->data_ptr() == buffers.residual.data_ptr());
    // Same values as the allocating path gives for the same caches: roll back one position
    // and recompute without the buffers.
    const at::Tensor kept = out->clone();
    for (KvCache& cache : caches) REQUIRE(cache.Truncate(cache.length() - 1).ok());
    const int64_t one_off_allocations = AllocationsDuring([&] {
      absl::StatusOr<at::Tensor> again = model.Forward(stacked, chunks);
      REQUIRE(again.ok());
      CHECK(at::allclose(*again, kept, 1e-5, 1e-6));
    });
    // The negative control: the counter does see a step that allocates.
    CHECK(one_off_allocations > 0);
  }
}

TEST_CASE(
    "A step of prompt chunks and decode rows into step buffers allocates no tensor "
    "storage after warm-up",
    "[submodel][step_buffers]") {
  // Chunks of several tokens attend through the prompt kernel over the paged cache in place
  // (kernels/prompt_attention.h), where the composite form gathered the rows and built a
  // score matrix every layer.
  const std::string variant = GENERATE(as<std::string>{}, "llama", "gpt_oss");
  INFO(variant);
  Fixture f(VariantNamed(variant));
  const Submodel& model = *f.model;
  const int64_t d = f.config.hidden_size;
  constexpr int64_t kBlockSize = 4;
  auto pool = model.NewPagedPool(64, kBlockSize);
  REQUIRE(pool.ok());
  std::vector<KvCache> caches;
  int32_t next_block = 0;
  for (int64_t i = 0; i < 3; ++i) {
    caches.emplace_back(*pool);
    for (int b = 0; b < 12; ++b) caches.back().AppendBlock(next_block++);
    REQUIRE(model.Forward(at::randn({2 + 3 * i, d}), caches.back()).ok());
  }
  // A prompt's next chunk of 6, verification rows of 3, and a decode row, each step.
  std::vector<SequenceChunk> chunks = {{.cache = &caches[0], .num_tokens = 6},
                                       {.cache = &caches[1], .num_tokens = 3},
                                       {.cache = &caches[2], .num_tokens = 1}};
  StepBuffers buffers = model.NewStepBuffers(/*max_tokens=*/16, kBlockSize);
  at::Tensor input = buffers.residual.narrow(0, 0, 10);
  input.normal_();
  REQUIRE(model.Forward(input, chunks, buffers).ok());  // warm-up
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    input.normal_();
    const at::Tensor stacked = input.clone();
    absl::StatusOr<at::Tensor> out;
    const int64_t allocations =
        AllocationsDuring([&] { out = model.Forward(input, chunks, buffers); });
    REQUIRE(out.ok());
    CHECK(allocations == 0);
    // The same values as the one-off path over the same caches, rolled back.
    const at::Tensor kept = out->clone();
    for (const SequenceChunk& chunk : chunks) {
      REQUIRE(chunk.cache->Truncate(chunk.cache->length() - chunk.num_tokens).ok());
    }
    absl::StatusOr<at::Tensor> again = model.Forward(stacked, chunks);
    REQUIRE(again.ok());
    CHECK(at::allclose(*again, kept, 1e-5, 1e-6));
  }
}

TEST_CASE("Step buffers refuse a step larger than they were made for", "[submodel][step_buffers]") {
  Fixture f;
  StepBuffers buffers = f.model->NewStepBuffers(/*max_tokens=*/2);
  KvCache cache = f.model->NewCache(16);
  auto out = f.model->Forward(at::randn({3, f.config.hidden_size}),
                              std::vector<SequenceChunk>{{.cache = &cache, .num_tokens = 3}},
                              buffers);
  REQUIRE_FALSE(out.ok());
  CHECK(out.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(out.status().message()).find("step buffers hold 2 rows") !=
        std::string::npos);
  CHECK(cache.length() == 0);
}

TEST_CASE("A prefill chunk and decode rows in step buffers equal the one-off path",
          "[submodel][step_buffers]") {
  Fixture f;
  const int64_t d = f.config.hidden_size;
  KvCache a = f.model->NewCache(64);
  KvCache b = f.model->NewCache(64);
  KvCache a_ref = f.model->NewCache(64);
  KvCache b_ref = f.model->NewCache(64);
  const at::Tensor history = at::randn({6, d});
  for (KvCache* cache : {&b, &b_ref}) REQUIRE(f.model->Forward(history, *cache).ok());
  StepBuffers buffers = f.model->NewStepBuffers(16);
  const at::Tensor step = at::randn({8, d});  // a's 7-token chunk, then b's decode row
  std::vector<SequenceChunk> chunks = {{.cache = &a, .num_tokens = 7}, {.cache = &b, .num_tokens = 1}};
  std::vector<SequenceChunk> ref = {{.cache = &a_ref, .num_tokens = 7},
                                    {.cache = &b_ref, .num_tokens = 1}};
  auto out = f.model->Forward(step, chunks, buffers);
  auto expected = f.model->Forward(step, ref);
  REQUIRE(out.ok());
  REQUIRE(expected.ok());
  CHECK(at::allclose(*out, *expected, 1e-5, 1e-6));
  CHECK(a.length() == 7);
  CHECK(b.length() == 7);
}

}  // namespace
}  // namespace tophat
