// The engine on a CUDA device whose context is lost mid-service (label `gpu`; skipped without
// a device). A lost context cannot be had back in the process, so this binary holds this one
// case: deploy/gpu/check.sh runs it alone.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "base/test_util.h"
#include "kernels/cuda_device.h"
#include "models/formats/checkpoint.h"
#include "models/runtime/model_init.h"
#include "server/engine.h"
#include "server/engine_test_harness.h"

namespace tophat {
namespace {

TEST_CASE("On CUDA a device-side assert loses the context: the next step's sessions and the "
          "others fail with UNAVAILABLE naming the CUDA error, once, and nothing is admitted",
          "[device-loss]") {
  static testing::TempDir dir;
  const ModelConfig config = TinyDecodeKernelConfig();
  REQUIRE(WriteCheckpoint(config, InitWeights(config, 5), dir.path()).ok());
  auto checkpoint = CheckpointReader::Open(dir.path());
  REQUIRE(checkpoint.ok());
  auto loaded = Submodel::Load(config, **checkpoint, SubmodelSpec::Middle(config, 1, 1),
                               {.dtype = at::kBFloat16,
                                .device = at::Device("cuda:0"),
                                .max_context = 64});
  REQUIRE(loaded.ok());
  std::shared_ptr<const Submodel> middle(std::move(*loaded));
  std::vector<std::string> lost;
  EngineOptions options{.model_id = "tiny",
                        .kv_block_size = 16,
                        .kv_num_blocks = 16,
                        .max_batch_tokens = 64,
                        .max_running_sessions = 4,
                        .max_waiting_sessions = 4,
                        .max_chunk_tokens = 64,
                        .cuda_graph_max_batch = 4,
                        .session_timeout_s = 600};
  options.on_device_lost = [&](const absl::Status& status) {
    CHECK(status.code() == absl::StatusCode::kUnavailable);
    lost.emplace_back(status.message());
  };
  testing::EngineHarness h(options, middle);
  // Neither the engine nor the middle is freed, whatever the outcome: a lost context fails
  // the frees too (some by throwing, from destructors), which is why tophat-cloud exits
  // without them after a loss.
  struct Leak {
    testing::EngineHarness& h;
    ~Leak() { (void)h.engine.release(); }
  } leak{h};
  new std::shared_ptr<const Submodel>(middle);
  Engine& engine = *h.engine;

  for (uint64_t id : {1, 2, 3}) h.Open(id, 64);
  h.Chunk(1, 0, 5, v1::PHASE_PREFILL);
  h.Chunk(2, 0, 7, v1::PHASE_PREFILL);
  CHECK(engine.RunOnce() == 12);
  auto last = testing::LastBySession(h.sink->Take());
  REQUIRE(last[1].has_result());
  REQUIRE(last[2].has_result());
  REQUIRE_FALSE(kernels::CudaContextFault(0).has_value());

  // An index past the table's end: the gather's device-side assert ends the context, as
  // a kernel's out-of-bounds access or an uncorrectable ECC error would (and a build without
  // device asserts reads 32 GiB past the table: an illegal address, as final). Not waited
  // for: the engine's next step meets it.
  at::Tensor table = at::zeros({4, 8}, at::TensorOptions().device(at::Device("cuda:0")));
  at::Tensor index =
      at::full({1}, int64_t{1} << 30, at::TensorOptions().dtype(at::kLong).device(table.device()));
  (void)at::embedding(table, index);

  h.Chunk(1, 5, 1, v1::PHASE_DECODE);
  h.Chunk(2, 7, 1, v1::PHASE_DECODE);
  engine.RunOnce();
  last = testing::LastBySession(h.sink->Take());
  for (uint64_t id : {1, 2, 3}) {
    INFO("session " << id);
    REQUIRE(last[id].has_error());
    CHECK(last[id].error().code() == static_cast<int>(absl::StatusCode::kUnavailable));
    CHECK(last[id].error().message().find("the cloud's GPU (cuda:0) is lost") != std::string::npos);
    CHECK_FALSE(last[id].error().session_alive());
  }
  REQUIRE(lost.size() == 1);
  std::printf("device lost: %s\n", lost[0].c_str());
  CHECK(kernels::CudaContextFault(0).has_value());
  CHECK_FALSE(engine.device_lost().ok());

  // Nothing new is admitted, and nothing touches the device again.
  h.Open(4, 64);
  CHECK(engine.RunOnce() == 0);
  last = testing::LastBySession(h.sink->Take());
  REQUIRE(last[4].has_error());
  CHECK(last[4].error().code() == static_cast<int>(absl::StatusCode::kUnavailable));
  CHECK(lost.size() == 1);
}

}  // namespace
}  // namespace tophat
