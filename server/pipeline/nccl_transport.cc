// The NCCL backend of StageTransport: ncclSend/ncclRecv between the stages' GPUs.
//
// Written against the CUDA runtime and NCCL directly, not c10d's ProcessGroupNCCL or
// c10::cuda: this must compile against Debian's CPU-only LibTorch, where neither exists.
// Streams: LibTorch computes on the legacy default stream; the transfers run on streams of
// their own (non-blocking, so a transfer waiting for its peer never stalls compute), and each
// send first waits for an event recorded on the default stream, so it reads finished data.
// A receive is waited for on the host before it returns, so compute launched after it sees
// the data.
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/pipeline/stage_transport.h"

#ifdef TOPHAT_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace tophat::pipeline {

#ifndef TOPHAT_HAVE_NCCL

bool NcclBuilt() { return false; }

absl::StatusOr<std::unique_ptr<StageTransport>> ConnectNccl(Rendezvous&, int) {
  return absl::UnimplementedError(
      "pipeline.backend nccl: this tophat-cloud was built without NCCL (no CUDA toolkit with "
      "NCCL at configure time, or TOPHAT_CUDA=OFF); use pipeline.backend gloo");
}

#else

bool NcclBuilt() { return true; }

namespace {

using Clock = std::chrono::steady_clock;

// How often a wait asks the rendezvous whether stage 0 is still there: NCCL's kernels do
// not notice a peer that died, so this is what bounds a later stage's idle wait.
constexpr std::chrono::seconds kReachableEvery{1};

std::string CudaError(cudaError_t error) {
  return absl::StrCat(cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
}

// One communicator with the stream its transfers run on.
struct Link {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

class NcclTransport : public StageTransport {
 public:
  NcclTransport(Rendezvous& rendezvous, int rank, int size, int cuda_index)
      : rendezvous_(rendezvous), rank_(rank), size_(size), cuda_index_(cuda_index) {}

  ~NcclTransport() override {
    cudaSetDevice(cuda_index_);
    for (Sent& sent : posted_) cudaEventDestroy(sent.done);
    for (cudaEvent_t event : free_events_) cudaEventDestroy(event);
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    for (Link* link : {&down_, &back_}) {
      if (link->comm != nullptr) {
        // A healthy communicator is finalized (flushes, frees its peers' resources); a
        // broken one is aborted (finalizing could wait for a peer that is gone).
        if (!broken_) {
          ncclCommFinalize(link->comm);
          WaitComm(link->comm, Clock::now() + std::chrono::seconds(10), "finalize").IgnoreError();
        }
        if (link->comm != nullptr) ncclCommAbort(link->comm);
      }
      if (link->stream != nullptr) cudaStreamDestroy(link->stream);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  at::Device device() const override { return at::Device(at::kCUDA, cuda_index_); }
  const char* name() const override { return "NCCL"; }

  // Sets up both communicators from the ids stage 0 published. Non-blocking: each init is
  // polled until it completes or the rendezvous's timeout passes (then aborted).
  absl::Status Initialize() {
    const RendezvousOptions& options = rendezvous_.options();
    if (cudaError_t error = cudaSetDevice(cuda_index_); error != cudaSuccess) {
      return absl::UnavailableError(absl::StrCat("pipeline stage ", rank_, ": CUDA device ",
                                                 cuda_index_, ": ", CudaError(error)));
    }
    if (!options.interface.empty()) {
      // NCCL reads its socket interface from the environment at init; an operator's own
      // setting wins.
      setenv("NCCL_SOCKET_IFNAME", options.interface.c_str(), /*overwrite=*/0);
    }
    const Clock::time_point deadline = Clock::now() + options.timeout;
    for (auto [link, key] : {std::pair{&down_, "nccl/down"}, std::pair{&back_, "nccl/back"}}) {
      ncclUniqueId id;
      if (rank_ == 0) {
        if (ncclResult_t result = ncclGetUniqueId(&id); result != ncclSuccess) {
          return Failed(result, nullptr, "creating the communicator id");
        }
        absl::Status published = rendezvous_.Set(
            key, absl::Base64Escape(absl::string_view(id.internal, sizeof(id.internal))));
        if (!published.ok()) return published;
      }
      absl::StatusOr<std::string> encoded = rendezvous_.Get(key);
      if (!encoded.ok()) return encoded.status();
      std::string raw;
      if (!absl::Base64Unescape(*encoded, &raw) || raw.size() != sizeof(id.internal)) {
        return absl::InvalidArgumentError(
            absl::StrCat("pipeline: malformed NCCL id '", key, "' at the rendezvous"));
      }
      std::memcpy(id.internal, raw.data(), sizeof(id.internal));
      if (cudaError_t error = cudaStreamCreateWithFlags(&link->stream, cudaStreamNonBlocking);
          error != cudaSuccess) {
        return absl::UnavailableError(absl::StrCat("pipeline stage ", rank_,
                                                   ": creating a stream: ", CudaError(error)));
      }
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclResult_t result = ncclCommInitRankConfig(&link->comm, size_, id, rank_, &config);
      if (result != ncclSuccess && result != ncclInProgress) {
        return Failed(result, link->comm, "setting up the communicator");
      }
      if (absl::Status ready = WaitComm(link->comm, deadline, "set-up"); !ready.ok()) {
        broken_ = true;
        return absl::DeadlineExceededError(absl::StrCat(
            ready.message(), " (are all ", size_, " stages started, each on its own GPU?)"));
      }
    }
    if (cudaError_t error = cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming);
        error != cudaSuccess) {
      return absl::UnavailableError(absl::StrCat("pipeline stage ", rank_, ": ", CudaError(error)));
    }
    if (size_ > 1) return Connect(deadline);
    return absl::OkStatus();
  }

  absl::Status Send(std::span<const at::Tensor> tensors, int peer,
                    std::chrono::milliseconds timeout) override {
    if (absl::Status posted = Post(tensors, peer); !posted.ok()) return posted;
    return WaitSent(posted_.size(), timeout);
  }

  absl::Status Post(std::span<const at::Tensor> tensors, int peer) override {
    if (absl::Status usable = Usable(); !usable.ok()) return usable;
    for (const at::Tensor& tensor : tensors) {
      if (absl::Status checked = Check(tensor, "send"); !checked.ok()) return checked;
    }
    Link& link = LinkFor(rank_, peer);
    // The sends read what the default stream (LibTorch's) wrote.
    if (absl::Status ordered = AfterCompute(link, "send"); !ordered.ok()) return ordered;
    // One group for the step's tensors: on a non-blocking communicator each call outside a
    // group is an enqueue of its own on NCCL's group thread, polled until it settles.
    ncclGroupStart();
    ncclResult_t result = ncclSuccess;
    for (const at::Tensor& tensor : tensors) {
      result = ncclSend(tensor.data_ptr(), tensor.nbytes(), ncclUint8, peer, link.comm,
                        link.stream);
      if (result != ncclSuccess) break;
    }
    const ncclResult_t ended = ncclGroupEnd();
    if (absl::Status issued = Issued(result != ncclSuccess ? result : ended, link.comm, "send");
        !issued.ok()) {
      return issued;
    }
    for (const at::Tensor& tensor : tensors) {
      cudaEvent_t done = TakeEvent();
      if (const cudaError_t error = cudaEventRecord(done, link.stream); error != cudaSuccess) {
        free_events_.push_back(done);
        return CudaFailed(error, "a send's completion event");
      }
      posted_.push_back({.tensor = tensor, .done = done, .comm = link.comm});
    }
    return absl::OkStatus();
  }

  absl::Status WaitSent(size_t count, std::chrono::milliseconds timeout) override {
    const Clock::time_point deadline = Clock::now() + timeout;
    for (; count > 0 && !posted_.empty(); --count) {
      if (broken_) {
        for (Sent& sent : posted_) free_events_.push_back(sent.done);
        posted_.clear();
        return Usable();
      }
      Sent sent = std::move(posted_.front());
      posted_.pop_front();
      absl::Status done = WaitEvent(sent.done, sent.comm, deadline, "a send");
      free_events_.push_back(sent.done);
      if (!done.ok()) return done;
    }
    return absl::OkStatus();
  }

  absl::Status Receive(std::span<at::Tensor> tensors, int peer,
                       std::chrono::milliseconds timeout) override {
    if (absl::Status usable = Usable(); !usable.ok()) return usable;
    for (const at::Tensor& tensor : tensors) {
      if (absl::Status checked = Check(tensor, "receive"); !checked.ok()) return checked;
    }
    const Clock::time_point deadline = Clock::now() + timeout;
    Link& link = LinkFor(peer, rank_);
    // The buffers were allocated on the default stream.
    if (absl::Status ordered = AfterCompute(link, "receive"); !ordered.ok()) return ordered;
    ncclGroupStart();
    ncclResult_t result = ncclSuccess;
    for (at::Tensor& tensor : tensors) {
      result = ncclRecv(tensor.data_ptr(), tensor.nbytes(), ncclUint8, peer, link.comm,
                        link.stream);
      if (result != ncclSuccess) break;
    }
    const ncclResult_t ended = ncclGroupEnd();
    if (absl::Status issued = Issued(result != ncclSuccess ? result : ended, link.comm,
                                     "receive");
        !issued.ok()) {
      return issued;
    }
    cudaEvent_t done = TakeEvent();
    if (const cudaError_t error = cudaEventRecord(done, link.stream); error != cudaSuccess) {
      free_events_.push_back(done);
      return CudaFailed(error, "a receive's completion event");
    }
    absl::Status received =
        WaitEvent(done, link.comm, deadline, absl::StrCat("a receive from stage ", peer));
    free_events_.push_back(done);
    return received;
  }

 private:
  struct Sent {
    at::Tensor tensor;  // kept alive until the send completes
    cudaEvent_t done = nullptr;
    ncclComm_t comm = nullptr;
  };

  // Transfers from the last stage back to stage 0 use their own communicator; all others
  // go down the chain.
  Link& LinkFor(int from, int to) { return from == size_ - 1 && to == 0 ? back_ : down_; }

  absl::Status Usable() const {
    if (!broken_) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(
        "pipeline stage ", rank_, ": the NCCL links were aborted after an earlier failure"));
  }

  absl::Status Check(const at::Tensor& tensor, const char* what) const {
    if (!tensor.is_cuda() || tensor.get_device() != cuda_index_ || !tensor.is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline stage ", rank_, ": NCCL can only ", what, " contiguous tensors on cuda:",
          cuda_index_, ", not ", tensor.toString(), " on ", tensor.device().str()));
    }
    return absl::OkStatus();
  }

  cudaEvent_t TakeEvent() {
    if (free_events_.empty()) {
      cudaEvent_t event = nullptr;
      cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      return event;
    }
    cudaEvent_t event = free_events_.back();
    free_events_.pop_back();
    return event;
  }

  absl::Status Failed(ncclResult_t result, ncclComm_t comm, const std::string& what) {
    broken_ = true;
    const char* detail = ncclGetLastError(comm);
    return absl::UnavailableError(absl::StrCat("pipeline stage ", rank_, ": NCCL ", what,
                                               " failed: ", ncclGetErrorString(result),
                                               detail != nullptr && *detail ? ": " : "",
                                               detail != nullptr ? detail : ""));
  }

  // A non-blocking communicator may answer a call with ncclInProgress: it must settle before
  // the next call (by `deadline`; by default the rendezvous's timeout from now). An error
  // aborts the links.
  absl::Status Issued(ncclResult_t result, ncclComm_t comm, const std::string& what,
                      std::optional<Clock::time_point> deadline = std::nullopt) {
    if (result == ncclSuccess) return absl::OkStatus();
    if (result != ncclInProgress) return Abort(result, comm, what);
    return WaitComm(comm, deadline.value_or(Clock::now() + rendezvous_.options().timeout), what);
  }

  // Makes `link`'s stream wait for what LibTorch's stream (the legacy default one) has queued.
  absl::Status AfterCompute(Link& link, const char* what) {
    cudaError_t error = cudaEventRecord(ready_, cudaStreamLegacy);
    if (error == cudaSuccess) error = cudaStreamWaitEvent(link.stream, ready_, 0);
    if (error != cudaSuccess) return CudaFailed(error, absl::StrCat("ordering a ", what));
    return absl::OkStatus();
  }

  // A CUDA call of the transport failed: the links are aborted, as after an NCCL error.
  absl::Status CudaFailed(cudaError_t error, const std::string& what) {
    AbortLinks();
    return absl::UnavailableError(
        absl::StrCat("pipeline stage ", rank_, ": ", what, ": ", CudaError(error)));
  }

  // NCCL connects two ranks at their first transfer, and waits for the peer with no timeout
  // of its own (on a non-blocking communicator, as a call that stays in progress). So every
  // link a step uses carries one byte now, by the set-up's deadline: down the chain (each
  // stage from the one before, to the one after) and back (the last stage to stage 0).
  // Without it a later stage's wait for its first step was a wait for a connection, cut off
  // at the rendezvous's timeout: an idle cloud lost its pipeline that long after it started.
  absl::Status Connect(Clock::time_point deadline) {
    void* probe = nullptr;
    if (const cudaError_t error = cudaMalloc(&probe, 2); error != cudaSuccess) {
      return CudaFailed(error, "connecting the stages");
    }
    char* bytes = static_cast<char*>(probe);
    absl::Status status = [&]() -> absl::Status {
      ncclGroupStart();
      ncclResult_t result = ncclSuccess;
      if (rank_ > 0) result = ncclRecv(bytes, 1, ncclUint8, rank_ - 1, down_.comm, down_.stream);
      if (result == ncclSuccess && rank_ < size_ - 1) {
        result = ncclSend(bytes + 1, 1, ncclUint8, rank_ + 1, down_.comm, down_.stream);
      }
      const ncclResult_t ended = ncclGroupEnd();
      if (absl::Status issued = Issued(result != ncclSuccess ? result : ended, down_.comm,
                                       "connecting down the chain", deadline);
          !issued.ok()) {
        return issued;
      }
      if (rank_ == 0 || rank_ == size_ - 1) {
        result = rank_ == 0 ? ncclRecv(bytes, 1, ncclUint8, size_ - 1, back_.comm, back_.stream)
                            : ncclSend(bytes, 1, ncclUint8, 0, back_.comm, back_.stream);
        if (absl::Status issued = Issued(result, back_.comm, "connecting back to stage 0",
                                         deadline);
            !issued.ok()) {
          return issued;
        }
      }
      for (Link* link : {&down_, &back_}) {
        cudaEvent_t done = TakeEvent();
        const cudaError_t recorded = cudaEventRecord(done, link->stream);
        absl::Status connected =
            recorded != cudaSuccess
                ? CudaFailed(recorded, "connecting the stages")
                : WaitEvent(done, link->comm, deadline, "connecting the stages");
        free_events_.push_back(done);
        if (!connected.ok()) return connected;
      }
      return absl::OkStatus();
    }();
    cudaFree(probe);
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat(status.message(), " (are all ", size_,
                                       " stages started, each on its own GPU?)"));
    }
    return absl::OkStatus();
  }

  // Polls a communicator until it is no longer in progress; aborts it (and every later
  // call fails) on an error or at `deadline`.
  absl::Status WaitComm(ncclComm_t comm, Clock::time_point deadline, const std::string& what) {
    for (int polls = 0;; ++polls) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
      if (asked != ncclSuccess) return Abort(asked, comm, what);
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return Abort(state, comm, what);
      if (Clock::now() >= deadline) {
        Abort(ncclInProgress, comm, what).IgnoreError();
        return absl::DeadlineExceededError(absl::StrCat(
            "pipeline stage ", rank_, ": NCCL ", what, " did not complete within ",
            rendezvous_.options().timeout.count(), " ms; aborted"));
      }
      // Spin briefly (an enqueue settles in microseconds), then let the core go.
      if (polls < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  absl::Status Abort(ncclResult_t result, ncclComm_t comm, const std::string& what) {
    absl::Status failed = Failed(result, comm, what);
    AbortLinks();
    return failed;
  }

  // Both links, whichever failed: every later call fails anyway, and a transfer still queued
  // on the other (a send to a stage that is gone) would spin on the GPU for ever, holding
  // whoever then waits for the device (the engine's check of it after a failed step).
  // NCCL's abort ends its kernels.
  void AbortLinks() {
    broken_ = true;
    for (Link* link : {&down_, &back_}) {
      if (link->comm != nullptr) ncclCommAbort(link->comm);
      link->comm = nullptr;
    }
  }

  // Waits for `event` (the end of a transfer on `comm`) until `deadline`, watching the
  // communicator for errors and, every kReachableEvery, the rendezvous for stage 0.
  absl::Status WaitEvent(cudaEvent_t event, ncclComm_t comm, Clock::time_point deadline,
                         const std::string& what) {
    Clock::time_point next_check = Clock::now() + kReachableEvery;
    for (int polls = 0;; ++polls) {
      const cudaError_t state = cudaEventQuery(event);
      if (state == cudaSuccess) return absl::OkStatus();
      if (state != cudaErrorNotReady) {
        broken_ = true;
        return absl::UnavailableError(
            absl::StrCat("pipeline stage ", rank_, ": ", what, " failed: ", CudaError(state)));
      }
      if (broken_) return Usable();  // the communicator was aborted meanwhile
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) return Abort(async, comm, what);
      const Clock::time_point now = Clock::now();
      if (now >= deadline) {
        Abort(ncclInProgress, comm, what).IgnoreError();
        return absl::UnavailableError(absl::StrCat("pipeline stage ", rank_, ": ", what,
                                                   " did not complete in time; links aborted"));
      }
      if (now >= next_check) {
        next_check = now + kReachableEvery;
        if (absl::Status reachable = rendezvous_.CheckReachable(); !reachable.ok()) {
          Abort(ncclRemoteError, comm, what).IgnoreError();
          return reachable;
        }
      }
      // Spin briefly (a step's transfer takes microseconds to a few milliseconds), then
      // let the core go.
      if (polls < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  Rendezvous& rendezvous_;
  int rank_;
  int size_;
  int cuda_index_;
  Link down_;
  Link back_;
  cudaEvent_t ready_ = nullptr;
  std::deque<Sent> posted_;
  std::vector<cudaEvent_t> free_events_;
  bool broken_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StageTransport>> ConnectNccl(Rendezvous& rendezvous,
                                                            int cuda_index) {
  const RendezvousOptions& options = rendezvous.options();
  auto transport =
      std::make_unique<NcclTransport>(rendezvous, options.rank, options.size, cuda_index);
  if (absl::Status ready = transport->Initialize(); !ready.ok()) return ready;
  return std::unique_ptr<StageTransport>(std::move(transport));
}

#endif  // TOPHAT_HAVE_NCCL

}  // namespace tophat::pipeline
