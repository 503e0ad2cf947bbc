#include "server/cloud_service.h"

#include <deque>
#include <memory>
#include <mutex>

#include <spdlog/spdlog.h>

#include "proto/channel_security.h"

namespace tophat {
namespace {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

class ConnectReactor;

// Shared by the reactor and the engine: the engine may outlive the call (it learns of the
// detach a step later), so it talks to this object, which forgets the reactor in OnDone.
class StreamChannel final : public MessageSink {
 public:
  StreamChannel(ConnectReactor* reactor, const CloudServiceOptions& options)
      : reactor_(reactor), options_(options) {}

  void Send(v1::CloudMessage message) override;
  void Finish(const absl::Status& status) override;
  void Consumed(int64_t bytes) override;

  // Reactor side.
  void OnWriteDone(bool ok);
  // Counts a message handed to the engine; false when the reactor should stop reading.
  bool OnReadQueued(int64_t bytes);
  void Detach();

 private:
  void StartNextWriteLocked();
  void FinishLocked(grpc::Status status);

  std::recursive_mutex mutex_;
  ConnectReactor* reactor_;  // null once the call is done
  const CloudServiceOptions options_;
  std::deque<v1::CloudMessage> queue_;  // front() is being written while writing_
  bool writing_ = false;
  bool finishing_ = false;
  bool finished_ = false;
  grpc::Status final_status_;
  int64_t inflight_bytes_ = 0;
  bool read_paused_ = false;
};

class ConnectReactor final : public grpc::ServerBidiReactor<v1::AgentMessage, v1::CloudMessage> {
 public:
  ConnectReactor(Engine* engine, StreamId stream, const CloudServiceOptions& options,
                 grpc::CallbackServerContext* context)
      : engine_(engine), stream_(stream), context_(context) {
    channel_ = std::make_shared<StreamChannel>(this, options);
    // The device's identity is the name its client certificate gives (mutual TLS); a
    // plaintext cloud (tls.insecure) has none.
    device_ = PeerIdentity(*context_->auth_context());
    spdlog::info("stream {} connected from {} ({})", stream_, context_->peer(),
                 device_.empty() ? std::string("no device identity: plaintext")
                                 : "device " + device_);
    engine_->AttachStream(stream_, channel_, device_);
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The agent half-closed or the call broke: its sessions are over.
      Detach();
      channel_->Finish(absl::OkStatus());
      return;
    }
    // Only forward payloads are held by the engine until computed; they are what counts.
    const int64_t bytes =
        incoming_.has_forward() ? static_cast<int64_t>(incoming_.forward().states().data().size())
                                : 0;
    engine_->Deliver(stream_, std::move(incoming_));
    incoming_.Clear();
    if (channel_->OnReadQueued(bytes)) StartRead(&incoming_);
  }

  void ResumeRead() { StartRead(&incoming_); }

  void OnWriteDone(bool ok) override { channel_->OnWriteDone(ok); }

  void OnCancel() override {
    Detach();
    channel_->Finish(absl::CancelledError("the call was cancelled"));
  }

  void OnDone() override {
    Detach();
    channel_->Detach();
    spdlog::info("stream {} done", stream_);
    delete this;
  }

 private:
  void Detach() {
    if (!detached_.exchange(true)) engine_->DetachStream(stream_);
  }

  Engine* engine_;
  const StreamId stream_;
  std::string device_;  // from the client certificate; "" for plaintext
  grpc::CallbackServerContext* context_;
  std::shared_ptr<StreamChannel> channel_;
  v1::AgentMessage incoming_;
  std::atomic<bool> detached_{false};
};

// The lock is held across StartWrite/StartRead/Finish so that the reactor cannot be
// deleted (OnDone) between the check of reactor_ and the call. It is recursive because
// gRPC may run a reaction inline on the calling thread.
void StreamChannel::Send(v1::CloudMessage message) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (reactor_ == nullptr || finishing_) return;
  if (static_cast<int64_t>(queue_.size()) >= options_.max_queued_messages_per_stream) {
    FinishLocked(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                              "the agent is not reading its stream; too many queued messages"));
    return;
  }
  queue_.push_back(std::move(message));
  StartNextWriteLocked();
}

void StreamChannel::StartNextWriteLocked() {
  if (writing_ || queue_.empty() || reactor_ == nullptr || finished_) return;
  writing_ = true;
  // deque::push_back keeps references valid, so front() stays put while it is written.
  reactor_->StartWrite(&queue_.front());
}

void StreamChannel::FinishLocked(grpc::Status status) {
  if (finishing_ || reactor_ == nullptr) return;
  finishing_ = true;
  final_status_ = std::move(status);
  if (!writing_) {
    queue_.clear();
    finished_ = true;
    reactor_->Finish(final_status_);
  }
}

void StreamChannel::OnWriteDone(bool ok) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  writing_ = false;
  if (!queue_.empty()) queue_.pop_front();
  if (!ok) queue_.clear();  // the client is gone; a failed read or OnCancel finishes the call
  if (!queue_.empty() && !finished_) {
    StartNextWriteLocked();
    return;
  }
  if (finishing_ && !finished_ && reactor_ != nullptr) {
    finished_ = true;
    reactor_->Finish(final_status_);
  }
}

void StreamChannel::Finish(const absl::Status& status) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  FinishLocked(ToGrpcStatus(status));
}

bool StreamChannel::OnReadQueued(int64_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  inflight_bytes_ += bytes;
  if (finishing_) return false;
  if (inflight_bytes_ > options_.max_inflight_bytes_per_stream) {
    read_paused_ = true;
    return false;
  }
  return true;
}

void StreamChannel::Consumed(int64_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  inflight_bytes_ -= bytes;
  if (read_paused_ && inflight_bytes_ <= options_.max_inflight_bytes_per_stream / 2 &&
      reactor_ != nullptr && !finishing_) {
    read_paused_ = false;
    reactor_->ResumeRead();
  }
}

void StreamChannel::Detach() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  reactor_ = nullptr;
  queue_.clear();
}

}  // namespace

grpc::ServerBidiReactor<v1::AgentMessage, v1::CloudMessage>* CloudServiceImpl::Connect(
    grpc::CallbackServerContext* context) {
  return new ConnectReactor(engine_, next_stream_++, options_, context);
}

}  // namespace tophat
