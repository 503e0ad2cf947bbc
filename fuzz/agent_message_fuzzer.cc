// What an agent's stream carries to the cloud, through the real engine: a sequence of
// AgentMessages delivered on two streams of a tiny random model's engine, stepped as the
// daemon steps it. Each message is either any bytes parsed as an AgentMessage (what the
// gRPC reactor hands the engine) or one built from the input with fields near the valid
// ones (so that the fuzzer gets past the first check quickly): sessions opened, chunks of
// any shape, dtype and position, truncations, cancels, closes, device reports. No input
// may crash the engine or break its books: once every session is closed, the KV pool is
// empty again.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "fuzz/fuzz_util.h"
#include "models/runtime/model_init.h"
#include "server/engine.h"

namespace tophat {
namespace {

class DiscardingSink final : public MessageSink {
 public:
  void Send(v1::CloudMessage) override {}
  void Finish(const absl::Status&) override {}
  void Consumed(int64_t) override {}
};

std::shared_ptr<const Submodel> TinyMiddle() {
  static std::shared_ptr<const Submodel> middle = [] {
    auto loaded = TinyTestMiddle(fuzz::ScratchDir() / "tiny-model");
    if (!loaded.ok()) std::abort();
    return *loaded;
  }();
  return middle;
}

v1::AgentMessage BuiltMessage(FuzzedDataProvider& input, int64_t hidden) {
  v1::AgentMessage message;
  const uint64_t session = input.ConsumeIntegralInRange<uint64_t>(0, 4);
  switch (input.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
      message.mutable_open()->set_session_id(session);
      message.mutable_open()->set_max_positions(input.ConsumeIntegralInRange<uint32_t>(0, 80));
      message.mutable_open()->set_timeout_ms(input.ConsumeIntegral<uint32_t>());
      break;
    case 1: {
      v1::ForwardChunk* chunk = message.mutable_forward();
      chunk->set_session_id(session);
      chunk->set_sequence_number(input.ConsumeIntegral<uint8_t>());
      chunk->set_first_position(input.ConsumeIntegralInRange<uint32_t>(0, 70));
      chunk->set_phase(static_cast<v1::Phase>(input.ConsumeIntegralInRange<int>(0, 3)));
      v1::HiddenStates* states = chunk->mutable_states();
      const bool honest = input.ConsumeBool();
      states->set_dtype(honest ? v1::DTYPE_FLOAT32
                               : static_cast<v1::DType>(input.ConsumeIntegralInRange<int>(0, 5)));
      const uint32_t positions = input.ConsumeIntegralInRange<uint32_t>(0, 24);
      states->set_num_positions(positions);
      states->set_hidden_size(honest ? static_cast<uint32_t>(hidden)
                                     : input.ConsumeIntegral<uint32_t>());
      // Honest payloads are the right length, or one byte off either way.
      const int64_t honest_bytes =
          std::max<int64_t>(0, positions * hidden * 4 + input.ConsumeIntegralInRange<int>(-1, 1));
      const size_t bytes = honest ? static_cast<size_t>(honest_bytes)
                                  : input.ConsumeIntegralInRange<size_t>(0, 4096);
      std::string data = input.ConsumeBytesAsString(bytes);
      data.resize(bytes, '\x3f');  // finite floats where the input ran out
      states->set_data(std::move(data));
      break;
    }
    case 2:
      message.mutable_truncate()->set_session_id(session);
      message.mutable_truncate()->set_sequence_number(input.ConsumeIntegral<uint8_t>());
      message.mutable_truncate()->set_length(input.ConsumeIntegralInRange<uint32_t>(0, 90));
      break;
    case 3:
      message.mutable_cancel()->set_session_id(session);
      break;
    case 4:
      message.mutable_close()->set_session_id(session);
      break;
    default: {
      v1::DeviceState* state = message.mutable_device_state();
      state->set_uplink_bytes_per_second(input.ConsumeFloatingPoint<double>());
      state->set_downlink_bytes_per_second(input.ConsumeFloatingPoint<double>());
      state->set_draft_step_seconds(input.ConsumeFloatingPoint<double>());
      state->set_mean_round_length(input.ConsumeFloatingPoint<double>());
      break;
    }
  }
  return message;
}

}  // namespace
}  // namespace tophat

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tophat;
  const std::shared_ptr<const Submodel> middle = TinyMiddle();
  // 16 blocks of 4 positions: small enough that admission, queueing and refusal all happen.
  auto engine = Engine::Create({.model_id = "fuzz",
                                .kv_block_size = 4,
                                .kv_num_blocks = 16,
                                .max_batch_tokens = 32,
                                .max_running_sessions = 4,
                                .max_waiting_sessions = 2,
                                .max_chunk_tokens = 20,
                                .session_timeout_s = 600,
                                .max_sessions_per_device = 3,
                                .max_waiting_sessions_per_device = 1,
                                .max_kv_blocks_per_device = 12,
                                .adaptive = true},
                               middle, nullptr);
  if (!engine.ok()) std::abort();
  Engine& e = **engine;
  e.AttachStream(1, std::make_shared<DiscardingSink>(), "device-1");
  e.AttachStream(2, std::make_shared<DiscardingSink>(), "device-2");
  FuzzedDataProvider input(data, size);
  const int64_t hidden = middle->config().hidden_size;
  while (input.remaining_bytes() > 0) {
    const uint8_t op = input.ConsumeIntegral<uint8_t>();
    const StreamId stream = 1 + (op & 1);
    if ((op >> 1) % 8 == 0) {
      // Raw bytes, as the reactor would hand them over after gRPC's parse.
      v1::AgentMessage message;
      const std::string bytes =
          input.ConsumeBytesAsString(input.ConsumeIntegralInRange<size_t>(0, 512));
      if (message.ParseFromString(bytes)) e.Deliver(stream, std::move(message));
    } else if ((op >> 1) % 8 == 1) {
      e.RunOnce();
    } else if ((op >> 1) % 8 == 2 && op > 250) {
      e.DetachStream(stream);
      e.RunOnce();
      e.AttachStream(stream, std::make_shared<DiscardingSink>(), stream == 1 ? "device-1" : "device-2");
    } else {
      e.Deliver(stream, BuiltMessage(input, hidden));
    }
  }
  for (int i = 0; i < 4; ++i) e.RunOnce();
  // Both devices leave: everything they held is freed.
  e.DetachStream(1);
  e.DetachStream(2);
  e.RunOnce();
  const EngineStats stats = e.stats();
  TOPHAT_FUZZ_CHECK(stats.sessions_running == 0);
  TOPHAT_FUZZ_CHECK(stats.sessions_waiting == 0);
  TOPHAT_FUZZ_CHECK(stats.kv_blocks_allocated == 0);
  return 0;
}
