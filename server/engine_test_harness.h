// What the engine's tests share (engine_test.cc on the CPU, engine_gpu_test.cc on a GPU): a
// sink that collects one stream's messages, and a harness that drives an engine over a
// middle submodel on stream 1 without gRPC.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "proto/hidden_states.h"
#include "server/engine.h"

namespace tophat::testing {

// Collects what the engine sends to one stream.
class CollectingSink final : public MessageSink {
 public:
  void Send(v1::CloudMessage message) override {
    std::lock_guard<std::mutex> lock(mutex_);
    // Load reports come on a timer; the tests of a session's messages do not expect them.
    if (message.has_load()) {
      loads_.push_back(message.load());
      return;
    }
    messages_.push_back(std::move(message));
  }
  void Finish(const absl::Status& status) override { finished_ = true; }
  void Consumed(int64_t bytes) override { consumed_ += bytes; }
  bool Congested() const override { return congested.load(); }
  std::atomic<bool> congested{false};  // as a stream over its unread-results bound
  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return messages_.size();
  }

  std::vector<v1::CloudMessage> Take() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<v1::CloudMessage> out(messages_.begin(), messages_.end());
    messages_.clear();
    return out;
  }
  int64_t consumed() const { return consumed_; }
  std::vector<v1::CloudLoad> loads() {
    std::lock_guard<std::mutex> lock(mutex_);
    return loads_;
  }

 private:
  std::mutex mutex_;
  std::deque<v1::CloudMessage> messages_;
  std::vector<v1::CloudLoad> loads_;
  bool finished_ = false;
  int64_t consumed_ = 0;
};

struct EngineHarness {
  EngineHarness(EngineOptions options, std::shared_ptr<const Submodel> middle_in)
      : middle(std::move(middle_in)) {
    auto created = Engine::Create(options, middle, nullptr);
    REQUIRE(created.ok());
    engine = std::move(*created);
    engine->AttachStream(1, sink);
    engine->RunOnce();
    auto messages = sink->Take();
    REQUIRE(messages.size() == 1);
    REQUIRE(messages[0].has_hello());
    hello = messages[0].hello();
  }
  void Open(uint64_t id, uint32_t max_positions,
            v1::DType result_dtype = v1::DTYPE_UNSPECIFIED) {
    v1::AgentMessage message;
    message.mutable_open()->set_session_id(id);
    message.mutable_open()->set_max_positions(max_positions);
    message.mutable_open()->set_result_dtype(result_dtype);
    engine->Deliver(1, message);
  }
  // `wire`: the chunk's dtype on the wire; `sent` gets what the cloud decodes from it.
  void Chunk(uint64_t id, uint32_t first, int64_t positions, v1::Phase phase,
             at::Tensor* sent = nullptr, v1::DType wire = v1::DTYPE_FLOAT32) {
    at::Tensor hidden = at::randn({positions, middle->config().hidden_size});
    v1::AgentMessage message;
    v1::ForwardChunk* chunk = message.mutable_forward();
    chunk->set_session_id(id);
    chunk->set_sequence_number(first + 1);
    chunk->set_first_position(first);
    chunk->set_phase(phase);
    REQUIRE(PackHiddenStates(hidden, wire, chunk->mutable_states()).ok());
    if (sent != nullptr) {
      auto decoded = UnpackHiddenStates(chunk->states(), at::kFloat);
      REQUIRE(decoded.ok());
      *sent = *decoded;
    }
    engine->Deliver(1, message);
  }
  // A prefill chunk of exactly `hidden` (float32).
  void ChunkOf(uint64_t id, uint32_t first, const at::Tensor& hidden) {
    v1::AgentMessage message;
    v1::ForwardChunk* chunk = message.mutable_forward();
    chunk->set_session_id(id);
    chunk->set_sequence_number(first + 1);
    chunk->set_first_position(first);
    chunk->set_phase(v1::PHASE_PREFILL);
    REQUIRE(PackHiddenStates(hidden, v1::DTYPE_FLOAT32, chunk->mutable_states()).ok());
    engine->Deliver(1, message);
  }
  void Park(uint64_t id, uint32_t keep_alive_ms) {
    v1::AgentMessage message;
    message.mutable_park()->set_session_id(id);
    message.mutable_park()->set_keep_alive_ms(keep_alive_ms);
    engine->Deliver(1, message);
  }
  void Resume(uint64_t id, uint32_t max_positions, uint64_t new_id = 0) {
    v1::AgentMessage message;
    message.mutable_resume()->set_session_id(id);
    message.mutable_resume()->set_max_positions(max_positions);
    message.mutable_resume()->set_new_session_id(new_id);
    engine->Deliver(1, message);
  }
  void Close(uint64_t id) {
    v1::AgentMessage message;
    message.mutable_close()->set_session_id(id);
    engine->Deliver(1, message);
  }
  void Fork(uint64_t id, uint64_t new_id, uint32_t max_positions) {
    v1::AgentMessage message;
    message.mutable_fork()->set_session_id(id);
    message.mutable_fork()->set_new_session_id(new_id);
    message.mutable_fork()->set_max_positions(max_positions);
    engine->Deliver(1, message);
  }
  void Truncate(uint64_t id, uint32_t length) {
    v1::AgentMessage message;
    message.mutable_truncate()->set_session_id(id);
    message.mutable_truncate()->set_sequence_number(1000 + length);
    message.mutable_truncate()->set_length(length);
    engine->Deliver(1, message);
  }
  // On another stream (another device): an open, and a first prompt chunk of `positions`
  // random rows (the prompt's last when `decode_follows`).
  void OpenOn(StreamId stream, uint64_t id, uint32_t max_positions) {
    v1::AgentMessage open;
    open.mutable_open()->set_session_id(id);
    open.mutable_open()->set_max_positions(max_positions);
    engine->Deliver(stream, open);
  }
  void PrefillOn(StreamId stream, uint64_t id, int64_t positions, bool decode_follows = false) {
    v1::AgentMessage message;
    v1::ForwardChunk* chunk = message.mutable_forward();
    chunk->set_session_id(id);
    chunk->set_sequence_number(1);
    chunk->set_phase(v1::PHASE_PREFILL);
    chunk->set_decode_follows(decode_follows);
    REQUIRE(PackHiddenStates(at::randn({positions, middle->config().hidden_size}),
                             chunk->mutable_states())
                .ok());
    engine->Deliver(stream, message);
  }
  // Runs steps until `id`'s chunk results are all in; returns their rows concatenated.
  at::Tensor Results(uint64_t id) {
    std::vector<at::Tensor> rows;
    for (int step = 0; step < 20; ++step) {
      engine->RunOnce();
      bool done = false;
      for (const v1::CloudMessage& message : sink->Take()) {
        if (message.has_error()) UNSCOPED_INFO(message.error().message());
        if (!message.has_result() || message.result().session_id() != id) continue;
        auto deep = UnpackHiddenStates(message.result().states());
        REQUIRE(deep.ok());
        rows.push_back(*deep);
        done = message.result().chunk_done();
      }
      if (done) break;
    }
    REQUIRE_FALSE(rows.empty());
    return at::cat(rows);
  }
  // Session `id` runs a prefill step and a decode step, so the state monitor has step
  // timings (the scheduler decides nothing without them); their messages are dropped.
  void TimeTwoSteps(uint64_t id) {
    Open(id, 32);
    Chunk(id, 0, 12, v1::PHASE_PREFILL);
    engine->RunOnce();
    Chunk(id, 12, 1, v1::PHASE_DECODE);
    engine->RunOnce();
    sink->Take();
  }
  std::shared_ptr<const Submodel> middle;
  std::shared_ptr<CollectingSink> sink = std::make_shared<CollectingSink>();
  std::unique_ptr<Engine> engine;
  v1::Hello hello;
};

// The last message each session got, by session id.
std::map<uint64_t, v1::CloudMessage> LastBySession(std::vector<v1::CloudMessage> messages) {
  std::map<uint64_t, v1::CloudMessage> last;
  for (v1::CloudMessage& message : messages) {
    if (message.has_error()) last[message.error().session_id()] = message;
    if (message.has_result()) last[message.result().session_id()] = message;
  }
  return last;
}

}  // namespace tophat::testing
