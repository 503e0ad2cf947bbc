// How the stages of the cloud's pipeline exchange tensors: an interface over an existing
// collective library (no hand-rolled sockets for tensors). Gloo (c10d's ProcessGroupGloo,
// shipped in Debian's LibTorch) links CPU processes on any machine, and GPU stages through
// host memory; NCCL (ncclSend/ncclRecv on CUDA streams) links GPU stages directly.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tophat::pipeline {

class StageTransport {
 public:
  virtual ~StageTransport() = default;
  virtual int rank() const = 0;  // this stage's index
  virtual int size() const = 0;  // number of stages
  // Where the tensors it moves must live: host memory for Gloo, the stage's GPU for NCCL.
  virtual at::Device device() const = 0;
  // "Gloo" or "NCCL", for logs and the checks at rendezvous.
  virtual const char* name() const = 0;

  // Sends `tensors` (contiguous) to stage `peer`, in order, and waits until they have left.
  // Unavailable when the peer is gone or `timeout` passes.
  virtual absl::Status Send(std::span<const at::Tensor> tensors, int peer,
                            std::chrono::milliseconds timeout) = 0;
  // Starts sending `tensors` to `peer` without waiting: they stay alive and are sent in
  // order with the transport's other sends. WaitSent waits for the oldest `count` tensors
  // posted and not yet waited for (all of them when fewer are outstanding).
  virtual absl::Status Post(std::span<const at::Tensor> tensors, int peer) = 0;
  virtual absl::Status WaitSent(size_t count, std::chrono::milliseconds timeout) = 0;
  // Receives into `tensors` (contiguous, already of the sender's shapes and dtypes) from
  // stage `peer`, in the order sent. Unavailable when the peer is gone or `timeout` passes.
  virtual absl::Status Receive(std::span<at::Tensor> tensors, int peer,
                               std::chrono::milliseconds timeout) = 0;
};

// Where and how the stages meet. Stage 0 serves a c10d TCPStore at `address` (host:port);
// the others connect to it. c10d's store rather than a channel of our own: the process
// group needs one for its own set-up anyway, and its keys carry the stages' descriptions
// for the checks at rendezvous.
struct RendezvousOptions {
  std::string address;  // host:port of stage 0's store
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{30000};  // for meeting, and for each transfer
  // The network interface the stages' links use across hosts (Gloo's pairs, NCCL's
  // sockets), e.g. "eth1". Empty: the store's address on one host, else the interface of
  // this host's name.
  std::string interface;
};

// The stages' shared key-value store, joined. Thread-compatible.
class Rendezvous {
 public:
  // Stage 0 starts the store, the others connect (retrying until the timeout:
  // DeadlineExceeded naming the address when nobody answers).
  static absl::StatusOr<std::unique_ptr<Rendezvous>> Join(const RendezvousOptions& options);
  virtual ~Rendezvous() = default;

  const RendezvousOptions& options() const { return options_; }
  // The store's port: the configured one, or the one stage 0 was given for port 0.
  virtual int port() const = 0;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits for `key` up to the timeout (DeadlineExceeded naming the key).
  virtual absl::StatusOr<std::string> Get(const std::string& key) = 0;
  // Whether stage 0's store still answers (always OK on stage 0): how a stage whose links
  // cannot report a dead peer (NCCL's) learns that stage 0 is gone while it waits.
  virtual absl::Status CheckReachable() = 0;

 protected:
  explicit Rendezvous(RendezvousOptions options) : options_(std::move(options)) {}

 private:
  RendezvousOptions options_;
};

// A Gloo process group over the rendezvous's store, all stages joined (blocks until they
// have, or the timeout passes). The pairs bind to the host part of the store's address.
absl::StatusOr<std::unique_ptr<StageTransport>> ConnectGloo(Rendezvous& rendezvous);

// Whether this build has the NCCL backend (a CUDA toolkit with NCCL was found).
bool NcclBuilt();
// NCCL communicators between the stages, this one on CUDA device `cuda_index` (all stages
// joined, or DeadlineExceeded after the rendezvous's timeout: the set-up is non-blocking
// and aborted then). Two communicators: one down the chain (stage i to i + 1), one from the
// last stage back to stage 0, each on its own stream, so that stage 0's sends of the next
// micro-batch never queue behind its wait for the last one's answer. `rendezvous` must
// outlive the transport (waits ask it whether stage 0 is still there).
// Unimplemented when !NcclBuilt().
absl::StatusOr<std::unique_ptr<StageTransport>> ConnectNccl(Rendezvous& rendezvous,
                                                            int cuda_index);

}  // namespace tophat::pipeline
