// The engine on a CUDA device whose context is lost mid-service (label `gpu`; skipped without
// a device). A lost context cannot be had back in the process, so this binary holds this one
// case: deploy/gpu/check.sh runs it alone.
#include <catch2/catch.hpp>

#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "base/test_util.h"
#include "kernels/cuda_device.h"
#include "models/formats/checkpoint.h"
#include "models/runtime/model_init.h"
#include "proto/hidden_states.h"
#include "server/engine.h"

namespace tophat {
namespace {

class CollectingSink final : public MessageSink {
 public:
  void Send(v1::CloudMessage message) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!message.has_load()) messages_.push_back(std::move(message));
  }
  void Finish(const absl::Status&) override {}
  void Consumed(int64_t) override {}
  // The last result or error of each session since the previous call.
  std::map<uint64_t, v1::CloudMessage> TakeLast() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::map<uint64_t, v1::CloudMessage> last;
    for (v1::CloudMessage& message : messages_) {
      if (message.has_error()) last[message.error().session_id()] = message;
      if (message.has_result()) last[message.result().session_id()] = message;
    }
    messages_.clear();
    return last;
  }

 private:
  std::mutex mutex_;
  std::deque<v1::CloudMessage> messages_;
};

v1::AgentMessage OpenMessage(uint64_t id) {
  v1::AgentMessage message;
  message.mutable_open()->set_session_id(id);
  message.mutable_open()->set_max_positions(64);
  return message;
}

v1::AgentMessage ChunkMessage(uint64_t id, uint32_t first, int64_t positions, v1::Phase phase,
                              int64_t hidden_size) {
  v1::AgentMessage message;
  v1::ForwardChunk* chunk = message.mutable_forward();
  chunk->set_session_id(id);
  chunk->set_sequence_number(first + 1);
  chunk->set_first_position(first);
  chunk->set_phase(phase);
  REQUIRE(PackHiddenStates(at::randn({positions, hidden_size}), v1::DTYPE_BFLOAT16,
                           chunk->mutable_states())
              .ok());
  return message;
}

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
  auto created = Engine::Create(options, middle, nullptr);
  REQUIRE(created.ok());
  // Neither is freed: a lost context fails the frees too (some by throwing, from
  // destructors), which is why tophat-cloud exits without them after a loss.
  Engine& engine = *created->release();
  new std::shared_ptr<const Submodel>(middle);

  auto sink = std::make_shared<CollectingSink>();
  engine.AttachStream(1, sink);
  const int64_t hidden = config.hidden_size;
  for (uint64_t id : {1, 2, 3}) engine.Deliver(1, OpenMessage(id));
  engine.Deliver(1, ChunkMessage(1, 0, 5, v1::PHASE_PREFILL, hidden));
  engine.Deliver(1, ChunkMessage(2, 0, 7, v1::PHASE_PREFILL, hidden));
  CHECK(engine.RunOnce() == 12);
  auto last = sink->TakeLast();
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

  engine.Deliver(1, ChunkMessage(1, 5, 1, v1::PHASE_DECODE, hidden));
  engine.Deliver(1, ChunkMessage(2, 7, 1, v1::PHASE_DECODE, hidden));
  engine.RunOnce();
  last = sink->TakeLast();
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
  engine.Deliver(1, OpenMessage(4));
  CHECK(engine.RunOnce() == 0);
  last = sink->TakeLast();
  REQUIRE(last[4].has_error());
  CHECK(last[4].error().code() == static_cast<int>(absl::StatusCode::kUnavailable));
  CHECK(lost.size() == 1);
}

}  // namespace
}  // namespace tophat
