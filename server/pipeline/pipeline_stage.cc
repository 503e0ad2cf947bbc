#include "server/pipeline/pipeline_stage.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tophat::pipeline {
namespace {

// An idle stage waits for its next step this long per wait: "forever" for a daemon, but
// finite, so that a wait never overflows the transport's clock arithmetic.
constexpr std::chrono::milliseconds kIdleWait = std::chrono::hours(24 * 365);
// What Submit posts for each step: header, chunk addresses, hidden states, and the stages'
// forward seconds (float64, one slot per stage, each stage filling its own).
constexpr size_t kTensorsPerStep = 4;

}  // namespace

Downstream::Downstream(std::unique_ptr<StageTransport> transport, int64_t hidden_size,
                       at::ScalarType dtype, int64_t end_layer,
                       std::chrono::milliseconds timeout)
    : transport_(std::move(transport)),
      hidden_size_(hidden_size),
      dtype_(dtype),
      end_layer_(end_layer),
      timeout_(timeout) {}

absl::Status Downstream::Submit(const at::Tensor& hidden,
                                std::span<const SequenceChunk> chunks) {
  if (broken_) {
    return absl::UnavailableError("the cloud's pipeline lost a stage; restart its stages");
  }
  addresses_.clear();
  int64_t total = 0;
  for (const SequenceChunk& chunk : chunks) {
    addresses_.push_back({.past = chunk.cache->length() - chunk.num_tokens,
                          .num_tokens = chunk.num_tokens,
                          .blocks = chunk.cache->block_table()});
    total += chunk.num_tokens;
  }
  EncodeAddresses(addresses_, pending_copies_, encoded_);
  const StepHeader header{.op = StageOp::kForward,
                          .step = step_,
                          .total_tokens = total,
                          .address_length = static_cast<int64_t>(encoded_.size())};
  // The transport moves tensors on its device (host memory for Gloo, so a GPU stage's states
  // are staged through it). Each posted tensor owns its storage until it has been sent: the
  // caller reuses its buffers. Made before anything is posted or any state changes, so that
  // a copy that fails (memory short) fails this step alone: the queued block copies wait for
  // the next one, and the stages see no gap.
  const at::Device link = transport_->device();
  std::vector<at::Tensor> outgoing;
  absl::Status made = CatchExceptions("staging a pipeline step", [&] {
    outgoing = {EncodeHeader(header).to(link),
                at::from_blob(encoded_.data(), {static_cast<int64_t>(encoded_.size())}, at::kLong)
                    .to(link, /*non_blocking=*/false, /*copy=*/true),
                hidden.to(link, /*non_blocking=*/false, /*copy=*/true).contiguous(),
                at::zeros({transport_->size()}, at::TensorOptions().dtype(at::kDouble).device(link))};
  });
  if (!made.ok()) return made;
  if (absl::Status posted = transport_->Post(outgoing, 1); !posted.ok()) {
    broken_ = true;
    return posted;
  }
  ++step_;
  pending_copies_.clear();
  outstanding_.push_back({.total = total, .device = hidden.device()});
  return absl::OkStatus();
}

void Downstream::QueueBlockCopies(std::span<const int32_t> from, std::span<const int32_t> to) {
  for (size_t i = 0; i < std::min(from.size(), to.size()); ++i) {
    pending_copies_.push_back({.from = from[i], .to = to[i]});
  }
}

absl::StatusOr<at::Tensor> Downstream::Collect() {
  if (outstanding_.empty()) return absl::FailedPreconditionError("nothing was submitted");
  const Outstanding oldest = outstanding_.front();
  outstanding_.pop_front();
  if (broken_) {
    return absl::UnavailableError("the cloud's pipeline lost a stage; restart its stages");
  }
  // The oldest step's answer is in flight whatever happens here: if it is not taken now, the
  // next Collect would take it for the step after. A receive that fails or throws (its
  // buffers' allocation, memory short) leaves the links out of step, so it breaks them.
  const at::Device link = transport_->device();
  at::Tensor result;
  at::Tensor seconds;
  absl::Status received;
  absl::Status thrown = CatchExceptions("receiving a pipeline step", [&] {
    result = at::empty({oldest.total, hidden_size_}, at::TensorOptions().dtype(dtype_).device(link));
    seconds = at::empty({transport_->size()}, at::TensorOptions().dtype(at::kDouble).device(link));
    at::Tensor incoming[] = {result, seconds};
    received = transport_->Receive(incoming, transport_->size() - 1, timeout_);
  });
  if (!thrown.ok()) received = thrown;
  // This step's sends (the oldest posted) completed before its answer could come back;
  // waiting for them releases their buffers. Later steps' sends may still be pending.
  if (received.ok()) received = transport_->WaitSent(kTensorsPerStep, timeout_);
  if (!received.ok()) {
    broken_ = true;
    return received;
  }
  at::Tensor on_device;
  TOPHAT_RETURN_IF_ERROR(CatchExceptions("reading a pipeline step's answer", [&] {
    const at::Tensor host_seconds = seconds.to(at::kCPU);
    const double* slots = host_seconds.data_ptr<double>();
    stage_seconds_.assign(slots, slots + transport_->size());
    on_device = result.to(oldest.device);
  }));
  return on_device;
}

absl::StatusOr<at::Tensor> Downstream::Forward(const at::Tensor& hidden,
                                               std::span<const SequenceChunk> chunks) {
  TOPHAT_RETURN_IF_ERROR(Submit(hidden, chunks));
  return Collect();
}

void Downstream::Shutdown() {
  if (broken_) return;
  (void)transport_->WaitSent(kTensorsPerStep * outstanding_.size(), timeout_);
  const at::Tensor outgoing[] = {
      EncodeHeader({.op = StageOp::kShutdown, .step = step_}).to(transport_->device())};
  (void)transport_->Send(outgoing, 1, timeout_);
}

absl::Status ServeStage(StageTransport& transport, const Submodel& layers,
                        const std::shared_ptr<KvBlockPool>& pool,
                        std::chrono::milliseconds timeout) {
  const int rank = transport.rank();
  const int last = transport.size() - 1;
  if (rank == 0) return absl::InvalidArgumentError("stage 0 does not serve steps");
  // Per-thread state at the top (STYLE.md): the stage's own copies and transfers go to its
  // device's streams, whatever GPU the thread started on (stage 1 on cuda:1).
  c10::InferenceMode inference_mode;
  const c10::DeviceGuard device_guard(layers.options().device);
  const int64_t hidden_size = layers.config().hidden_size;
  const at::ScalarType dtype = layers.options().dtype;
  std::vector<KvCache> caches;
  std::vector<SequenceChunk> chunks;
  // Tensors travel on the transport's device; the header, addresses and timings are read
  // and written on the host (no copy when that is where the transport keeps them).
  const at::Device link = transport.device();
  const at::Device device = layers.options().device;
  for (;;) {
    at::Tensor header_tensor = at::empty({kHeaderElements}, at::TensorOptions().dtype(at::kLong).device(link));
    at::Tensor header_in[] = {header_tensor};
    TOPHAT_RETURN_IF_ERROR(transport.Receive(header_in, rank - 1, kIdleWait));
    TOPHAT_ASSIGN_OR_RETURN(StepHeader header, DecodeHeader(header_tensor.to(at::kCPU)));
    if (header.op == StageOp::kShutdown) {
      if (rank < last) {
        const at::Tensor forward[] = {header_tensor};
        (void)transport.Send(forward, rank + 1, timeout);
      }
      return absl::OkStatus();
    }
    at::Tensor addresses = at::empty({header.address_length}, at::TensorOptions().dtype(at::kLong).device(link));
    at::Tensor hidden = at::empty({header.total_tokens, hidden_size}, at::TensorOptions().dtype(dtype).device(link));
    at::Tensor seconds = at::empty({transport.size()}, at::TensorOptions().dtype(at::kDouble).device(link));
    at::Tensor body[] = {addresses, hidden, seconds};
    TOPHAT_RETURN_IF_ERROR(transport.Receive(body, rank - 1, timeout));
    const at::Tensor host_addresses = addresses.to(at::kCPU);
    TOPHAT_ASSIGN_OR_RETURN(
        DecodedStep decoded,
        DecodeAddresses(std::span<const int64_t>(host_addresses.data_ptr<int64_t>(),
                                                 static_cast<size_t>(header.address_length)),
                        header.total_tokens, pool->num_blocks(), pool->block_size()));
    // Forks' copies first: the step may read them, and a later step may reuse their sources.
    TOPHAT_RETURN_IF_ERROR(pool->CopyBlocks(decoded.copy_from, decoded.copy_to));
    // One cache object per chunk slot, kept across steps (their tables are reassigned).
    while (caches.size() < decoded.chunks.size()) caches.emplace_back(pool);
    chunks.clear();
    for (size_t i = 0; i < decoded.chunks.size(); ++i) {
      TOPHAT_RETURN_IF_ERROR(caches[i].Assign(decoded.chunks[i].blocks, decoded.chunks[i].past));
      chunks.push_back({.cache = &caches[i], .num_tokens = decoded.chunks[i].num_tokens});
    }
    const auto start = std::chrono::steady_clock::now();
    TOPHAT_ASSIGN_OR_RETURN(at::Tensor output, layers.Forward(hidden.to(device), chunks));
    const at::Tensor outgoing = output.to(link).contiguous();
    at::Tensor host_seconds = seconds.to(at::kCPU);
    host_seconds.data_ptr<double>()[rank] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const at::Tensor outgoing_seconds = host_seconds.to(link);
    if (rank < last) {
      const at::Tensor forward[] = {header_tensor, addresses, outgoing, outgoing_seconds};
      TOPHAT_RETURN_IF_ERROR(transport.Send(forward, rank + 1, timeout));
    } else {
      const at::Tensor back[] = {outgoing, outgoing_seconds};
      TOPHAT_RETURN_IF_ERROR(transport.Send(back, 0, timeout));
    }
  }
}

}  // namespace tophat::pipeline
