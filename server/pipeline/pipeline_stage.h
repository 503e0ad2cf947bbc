// The two ends of the cloud's pipeline. Stage 0 (the gRPC-facing tophat-cloud, which owns
// sessions, admission, batching and every KV block id) runs its layers and hands each
// step's output to Downstream; stages 1..P-1 (`tophat-cloud --stage i`) run ServeStage:
// receive a step, run their layers over their own paged KV, pass it on. The last stage sends
// the deep hidden states back to stage 0. Sampled tokens never travel: the cloud has none.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/runtime/kv_cache.h"
#include "models/runtime/submodel.h"
#include "server/pipeline/stage_step.h"
#include "server/pipeline/stage_transport.h"

namespace tophat::pipeline {

// Stage 0's link to the stages after it. Engine-thread only.
class Downstream {
 public:
  // `end_layer`: where the last stage's layers end (the middle's end, announced to agents).
  Downstream(std::unique_ptr<StageTransport> transport, int64_t hidden_size,
             at::ScalarType dtype, int64_t end_layer, std::chrono::milliseconds timeout);

  int64_t end_layer() const { return end_layer_; }
  int stages() const { return transport_->size(); }
  // Whether a transfer has failed: the pipeline's links are then in an unknown state and
  // every later Forward fails at once (a restart of the stages rebuilds them).
  bool broken() const { return broken_; }

  // Starts the rest of the pipeline on stage 0's output `hidden` ([T, hidden_size], this
  // stage's dtype) for `chunks`, whose caches stage 0's forward has already advanced (each
  // wrote [length - num_tokens, length)), without waiting for it: up to stages()
  // submissions may be outstanding, answered in order by Collect.
  absl::Status Submit(const at::Tensor& hidden, std::span<const SequenceChunk> chunks);
  // Block from[i] into block to[i] on every later stage, before the next submitted step's
  // forward: a forked session's copy of its parent's KV, which stage 0 has just made in its
  // own pool (KvCache::CopyPrefixFrom). Carried by the next Submit, in step order.
  void QueueBlockCopies(std::span<const int32_t> from, std::span<const int32_t> to);
  // The last stage's output for the oldest outstanding submission, on its hidden's device.
  // Unavailable when a stage is gone or does not answer within the timeout.
  absl::StatusOr<at::Tensor> Collect();
  // Each stage's own forward seconds for the step Collect returned last (stage 0's slot is
  // 0: the engine times its own layers).
  const std::vector<double>& stage_seconds() const { return stage_seconds_; }
  // Submit, then Collect.
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& hidden,
                                     std::span<const SequenceChunk> chunks);
  // Tells the other stages to exit (best effort).
  void Shutdown();

 private:
  std::unique_ptr<StageTransport> transport_;
  int64_t hidden_size_;
  at::ScalarType dtype_;
  int64_t end_layer_;
  std::chrono::milliseconds timeout_;
  int64_t step_ = 0;
  bool broken_ = false;
  std::vector<ChunkAddress> addresses_;  // reused every step
  std::vector<int64_t> encoded_;
  std::vector<BlockCopy> pending_copies_;  // for the next Submit
  struct Outstanding {
    int64_t total = 0;
    at::Device device = at::kCPU;
  };
  std::deque<Outstanding> outstanding_;
  std::vector<double> stage_seconds_;
};

// Serves steps for stage transport.rank() > 0 until stage 0 shuts the pipeline down (OK)
// or is gone (Unavailable). `layers` runs on its options().device; `pool` holds its layers'
// KV with as many blocks as stage 0's allocator hands out. Waits for work without limit;
// `timeout` bounds each transfer within a step.
absl::Status ServeStage(StageTransport& transport, const Submodel& layers,
                        const std::shared_ptr<KvBlockPool>& pool,
                        std::chrono::milliseconds timeout);

}  // namespace tophat::pipeline
