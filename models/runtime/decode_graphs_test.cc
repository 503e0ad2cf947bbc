#include "models/runtime/decode_graphs.h"

#include <catch2/catch.hpp>
#include <filesystem>

#include "models/runtime/model_init.h"

namespace tophat {
namespace {

TEST_CASE("Decode graph buckets are the powers of two up to the largest batch",
          "[decode_graphs]") {
  CHECK(DecodeGraphBuckets(1) == std::vector<int64_t>{1});
  CHECK(DecodeGraphBuckets(8) == std::vector<int64_t>{1, 2, 4, 8});
  // A largest batch that is no power of two is a bucket of its own.
  CHECK(DecodeGraphBuckets(48) == std::vector<int64_t>{1, 2, 4, 8, 16, 32, 48});
  CHECK(DecodeGraphBuckets(0).empty());
  const std::vector<int64_t> buckets = DecodeGraphBuckets(48);
  CHECK(BucketFor(buckets, 1) == 1);
  CHECK(BucketFor(buckets, 3) == 4);   // one padding row
  CHECK(BucketFor(buckets, 17) == 32);  // 15 padding rows: under 2x, as every bucket
  CHECK(BucketFor(buckets, 33) == 48);
  CHECK(BucketFor(buckets, 49) == -1);  // beyond: the eager path
}

TEST_CASE("Decode graphs refuse a CPU model", "[decode_graphs]") {
  // The GPU tests' config, loaded and stepped here too: what they need beyond a GPU works.
  const ModelConfig config = TinyDecodeKernelConfig();
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tophat_decode_graphs_test_" + std::to_string(::getpid()));
  REQUIRE(WriteCheckpoint(config, InitWeights(config, 3), dir).ok());
  auto checkpoint = CheckpointReader::Open(dir);
  REQUIRE(checkpoint.ok());
  auto model = Submodel::Load(config, **checkpoint, SubmodelSpec::Middle(config, 1, 1));
  REQUIRE(model.ok());
  auto pool = (*model)->NewPagedPool(8, 4);
  REQUIRE(pool.ok());
  StepBuffers buffers = (*model)->NewStepBuffers(4, 4);
  auto graphs = DecodeGraphs::Capture(**model, **pool, buffers, 4);
  REQUIRE_FALSE(graphs.ok());
  // Without CUDA kernels the build says so; with them, the device does.
  CHECK((graphs.status().code() == absl::StatusCode::kUnimplemented ||
         graphs.status().code() == absl::StatusCode::kFailedPrecondition));
  CHECK_FALSE((*model)->DecodeStepInBuffers(**pool, 1, buffers).ok());
  // The same model steps eagerly in those buffers.
  KvCache cache(*pool);
  cache.AppendBlock(0);
  const SequenceChunk chunk{.cache = &cache, .num_tokens = 3};
  auto out = (*model)->Forward(at::randn({3, config.hidden_size}),
                               std::span<const SequenceChunk>(&chunk, 1), buffers);
  REQUIRE(out.ok());
  CHECK(out->size(1) == 128);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tophat
