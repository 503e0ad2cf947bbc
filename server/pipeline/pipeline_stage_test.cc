#include "server/pipeline/pipeline_stage.h"

#include <catch2/catch.hpp>
#include <future>
#include <vector>

#include "base/test_util.h"
#include "models/runtime/model_init.h"

namespace tophat::pipeline {
namespace {

using std::chrono::milliseconds;

std::unique_ptr<Submodel> LoadLayers(const ModelConfig& config, const CheckpointReader& checkpoint,
                                     LayerRange layers) {
  auto model = Submodel::Load(config, checkpoint, {.layers = layers},
                              {.dtype = at::kFloat, .device = at::kCPU, .max_context = 64});
  REQUIRE(model.ok());
  return std::move(*model);
}

std::shared_ptr<KvBlockPool> Pool(const ModelConfig& config, int64_t layers) {
  auto pool = KvBlockPool::Create(config, layers, /*num_blocks=*/16, /*block_size=*/4,
                                  at::kFloat, at::kCPU);
  REQUIRE(pool.ok());
  return *pool;
}

TEST_CASE("Two stages over Gloo compute what one stage computes, bit for bit", "[pipeline]") {
  const ModelConfig config = TinyTestConfig();  // 4 layers
  testing::TempDir dir;
  REQUIRE(WriteCheckpoint(config, InitWeights(config, 3), dir.path()).ok());
  auto checkpoint = CheckpointReader::Open(dir.path());
  REQUIRE(checkpoint.ok());
  auto whole = LoadLayers(config, **checkpoint, {0, 4});
  auto first = LoadLayers(config, **checkpoint, {0, 2});
  auto second = LoadLayers(config, **checkpoint, {2, 4});

  auto stage0 = Rendezvous::Join({.address = "127.0.0.1:0", .rank = 0, .size = 2,
                                  .timeout = milliseconds(20000)});
  REQUIRE(stage0.ok());
  const int port = (*stage0)->port();
  REQUIRE(port > 0);
  auto second_pool = Pool(config, 2);
  std::future<absl::Status> served = std::async(std::launch::async, [&] {
    auto joined = Rendezvous::Join({.address = "127.0.0.1:" + std::to_string(port), .rank = 1,
                                    .size = 2, .timeout = milliseconds(20000)});
    if (!joined.ok()) return joined.status();
    auto transport = ConnectGloo(**joined);
    if (!transport.ok()) return transport.status();
    return ServeStage(**transport, *second, second_pool, milliseconds(20000));
  });
  auto transport = ConnectGloo(**stage0);
  REQUIRE(transport.ok());
  Downstream downstream(std::move(*transport), config.hidden_size, at::kFloat, 4,
                        milliseconds(20000));

  // The same block ids in both set-ups, as stage 0's allocator would hand them out.
  auto whole_pool = Pool(config, 4);
  auto first_pool = Pool(config, 2);
  KvCache whole_a(whole_pool), whole_b(whole_pool), first_a(first_pool), first_b(first_pool);
  for (int32_t id : {5, 2, 9}) {
    whole_a.AppendBlock(id);
    first_a.AppendBlock(id);
  }
  for (int32_t id : {0, 7}) {
    whole_b.AppendBlock(id);
    first_b.AppendBlock(id);
  }
  at::manual_seed(4);
  // Prefill of both, a decode step of both, then a rollback of a (a rejected draft) and a
  // verification-sized chunk over the rolled-back positions.
  const std::vector<std::pair<int64_t, int64_t>> steps = {{5, 3}, {1, 1}, {3, 0}};
  for (size_t s = 0; s < steps.size(); ++s) {
    if (s == 2) {
      REQUIRE(whole_a.Truncate(whole_a.length() - 2).ok());
      REQUIRE(first_a.Truncate(first_a.length() - 2).ok());
    }
    const auto [na, nb] = steps[s];
    const at::Tensor hidden = at::randn({na + nb, config.hidden_size});
    std::vector<SequenceChunk> whole_chunks = {{&whole_a, na}, {&whole_b, nb}};
    std::vector<SequenceChunk> first_chunks = {{&first_a, na}, {&first_b, nb}};
    auto want = whole->Forward(hidden, whole_chunks);
    REQUIRE(want.ok());
    auto mid = first->Forward(hidden, first_chunks);
    REQUIRE(mid.ok());
    auto got = downstream.Forward(*mid, first_chunks);
    INFO("step " << s);
    REQUIRE(got.ok());
    CHECK(at::equal(*got, *want));
    REQUIRE(downstream.stage_seconds().size() == 2);
    CHECK(downstream.stage_seconds()[1] > 0);  // stage 1 timed its own layers
  }

  // A fork of a (ForkSession): stage 0 copies its own layers' blocks, and the next step
  // carries the copy to stage 1, which makes it in its own pool before the forward. The
  // fork's next chunk then computes what a one-stage fork's does.
  KvCache whole_c(whole_pool), first_c(first_pool);
  for (int32_t id : {11, 3, 12}) {
    whole_c.AppendBlock(id);
    first_c.AppendBlock(id);
  }
  const int64_t parent = whole_a.length();
  REQUIRE(whole_c.CopyPrefixFrom(whole_a, parent).ok());
  REQUIRE(first_c.CopyPrefixFrom(first_a, parent).ok());
  const auto blocks = static_cast<size_t>(first_pool->BlocksFor(parent));
  downstream.QueueBlockCopies(first_a.block_table().first(blocks),
                              first_c.block_table().first(blocks));
  const at::Tensor hidden = at::randn({3, config.hidden_size});
  std::vector<SequenceChunk> whole_fork = {{&whole_c, 3}};
  std::vector<SequenceChunk> first_fork = {{&first_c, 3}};
  auto want = whole->Forward(hidden, whole_fork);
  REQUIRE(want.ok());
  auto mid = first->Forward(hidden, first_fork);
  REQUIRE(mid.ok());
  // A step that fails before anything is posted (here no hidden states to stage; on a GPU,
  // memory short for the copy) fails alone: the links stay up, and the queued copies go with
  // the next step.
  const absl::Status failed = downstream.Submit(at::Tensor(), first_fork);
  INFO(failed.ToString());
  CHECK_FALSE(failed.ok());
  CHECK_FALSE(downstream.broken());
  auto got = downstream.Forward(*mid, first_fork);
  REQUIRE(got.ok());
  CHECK(at::equal(*got, *want));
  downstream.Shutdown();
  REQUIRE(served.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  CHECK(served.get().ok());
}

TEST_CASE("A stage that never joins is a deadline naming the address", "[pipeline]") {
  auto stage0 = Rendezvous::Join({.address = "127.0.0.1:0", .rank = 0, .size = 2,
                                  .timeout = milliseconds(1000)});
  INFO(stage0.status().ToString());
  REQUIRE(stage0.ok());
  auto missing = (*stage0)->Get("stage/1");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(missing.status().message()).find("stage/1") != std::string::npos);
}

}  // namespace
}  // namespace tophat::pipeline
