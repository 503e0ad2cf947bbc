#include "server/cloud_service.h"

#include <grpcpp/alarm.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "base/memory_release.h"
#include "base/thread_sanitizer.h"
#include "proto/channel_security.h"
#include "proto/grpc_status.h"
#include "proto/session_of.h"

namespace tophat {

namespace {

// AdmitDevice with the token's name found by `name_of_digest`: over every token in constant
// time for a stream that asks (MatchBearerDigest), or in an index for a reload, which checks
// every open stream again (10,000 streams against 10,000 tokens would otherwise be 10^8
// comparisons under the lock new streams wait on).
template <typename NameOfDigest>
absl::StatusOr<std::string> AdmitDeviceBy(const DeviceAccess& access,
                                          const PresentedCredentials& presented,
                                          const NameOfDigest& name_of_digest) {
  if (access.revoked_certificates != nullptr && presented.certificate.has_value() &&
      access.revoked_certificates->Revoked(*presented.certificate)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the certificate of ",
        presented.certified.empty() ? "this device" : absl::StrCat("device ", presented.certified),
        " (serial ", presented.certificate->serial, ", issued by ", presented.certificate->issuer,
        ") is revoked (tls.crl_file)"));
  }
  std::string device = presented.certified;
  if (!access.device_tokens.empty()) {
    if (!presented.token_digest.ok()) return presented.token_digest.status();
    absl::StatusOr<std::string> named = name_of_digest(*presented.token_digest);
    if (!named.ok()) return named.status();
    if (!presented.certified.empty() && *named != presented.certified) {
      return absl::UnauthenticatedError(absl::StrCat(
          "the bearer token is ", *named, "'s, the certificate ", presented.certified, "'s"));
    }
    device = *std::move(named);
  }
  if (!device.empty() && std::find(access.revoked_devices.begin(), access.revoked_devices.end(),
                                   device) != access.revoked_devices.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("device ", device, " is revoked (tls.revoked_devices)"));
  }
  return device;
}

}  // namespace

absl::StatusOr<std::string> AdmitDevice(const DeviceAccess& access,
                                        const PresentedCredentials& presented) {
  return AdmitDeviceBy(access, presented, [&](const std::string& digest) {
    return MatchBearerDigest(digest, access.device_tokens);
  });
}

OpenStreams::OpenStreams(DeviceAccess rules)
    : access_(std::make_shared<const DeviceAccess>(std::move(rules))) {}

OpenStreams::Admission OpenStreams::Admit(const PresentedCredentials& presented) {
  std::shared_ptr<const DeviceAccess> access;
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    access = access_;
    generation = generation_;
  }
  return {AdmitDevice(*access, presented), generation};
}

absl::Status OpenStreams::Register(StreamId id, PresentedCredentials presented,
                                   const std::string& device, uint64_t generation, End end) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (generation != generation_) {
    if (absl::Status still = Still(presented, device, Index(*access_)); !still.ok()) return still;
  }
  streams_.emplace(id, Open{std::move(presented), device, std::move(end)});
  return absl::OkStatus();
}

void OpenStreams::Unregister(StreamId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  streams_.erase(id);
}

std::vector<OpenStreams::Ending> OpenStreams::Replace(DeviceAccess rules) {
  auto access = std::make_shared<const DeviceAccess>(std::move(rules));
  const TokenIndex index = Index(*access);
  std::lock_guard<std::mutex> lock(mutex_);
  access_ = std::move(access);
  ++generation_;
  std::vector<Ending> ending;
  for (auto it = streams_.begin(); it != streams_.end();) {
    const absl::Status still = Still(it->second.presented, it->second.device, index);
    if (still.ok()) {
      ++it;
      continue;
    }
    ending.push_back({it->first, it->second.device, ToGrpcStatus(still), it->second.end});
    it = streams_.erase(it);
  }
  return ending;
}

size_t OpenStreams::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return streams_.size();
}

OpenStreams::TokenIndex OpenStreams::Index(const DeviceAccess& access) {
  TokenIndex index;
  for (const BearerToken& token : access.device_tokens) index[token.sha256_hex] = token.name;
  return index;
}

absl::Status OpenStreams::Still(const PresentedCredentials& presented, const std::string& device,
                                const TokenIndex& index) const {
  auto now = AdmitDeviceBy(
      *access_, presented, [&](const std::string& digest) -> absl::StatusOr<std::string> {
        const auto it = index.find(digest);
        if (it == index.end()) {
          return absl::UnauthenticatedError("the bearer token is not one configured");
        }
        return it->second;
      });
  if (!now.ok()) return now.status();
  if (*now != device) {
    return absl::UnauthenticatedError(
        absl::StrCat("the bearer token now names ", *now, ", not ", device));
  }
  return absl::OkStatus();
}

namespace {

// The address through which alarm callbacks are ordered after their Set, for TSan only.
[[maybe_unused]] char alarm_hand_off;

// Runs `on_fire` on a gRPC thread once `after` has passed, unless the alarm is cancelled or
// destroyed first. gRPC orders the callback after Set by synchronization TSan does not see
// (base/thread_sanitizer.h): what the callback captured was written before the release.
void SetAlarm(grpc::Alarm& alarm, std::chrono::nanoseconds after, std::function<void()> on_fire) {
  std::function<void(bool)> callback = [on_fire = std::move(on_fire)](bool fired) {
    TOPHAT_TSAN_ACQUIRE(&alarm_hand_off);
    if (fired) on_fire();
  };
  TOPHAT_TSAN_RELEASE(&alarm_hand_off);
  alarm.Set(std::chrono::system_clock::now() +
                std::chrono::duration_cast<std::chrono::system_clock::duration>(after),
            std::move(callback));
}

class ConnectReactor;

// Shared by the reactor and the engine: the engine may outlive the call (it learns of the
// detach a step later), so it talks to this object, which forgets the reactor in OnDone.
class StreamChannel final : public MessageSink,
                            public std::enable_shared_from_this<StreamChannel> {
 public:
  StreamChannel(ConnectReactor* reactor, Engine* engine, StreamId stream,
                const CloudServiceOptions& options, std::shared_ptr<OutgoingTotals> totals,
                std::shared_ptr<DevicePacer> pacer, std::string device_key)
      : reactor_(reactor),
        engine_(engine),
        stream_(stream),
        options_(options),
        totals_(std::move(totals)),
        pacer_(std::move(pacer)),
        device_key_(std::move(device_key)) {
    totals_->streams.fetch_add(1);
    pacer_->Register(device_key_);
  }
  ~StreamChannel() override {
    ReleaseQueuedLocked(0);
    totals_->streams.fetch_sub(1);
    pacer_->Unregister(device_key_);
  }

  void Send(v1::CloudMessage message) override;
  void Finish(const absl::Status& status) override;
  void Consumed(int64_t bytes) override;
  bool Congested() const override { return congested_.load(std::memory_order_relaxed); }

  // Reactor side.
  void OnWriteDone(bool ok);
  // Counts a message handed to the engine; false when the reactor should stop reading.
  bool OnReadQueued(int64_t bytes);
  void Detach();
  // Ends the stream from the cloud's side with `status` (a reload's refusal): its sessions
  // are freed now, its queued results dropped. Nothing when it is already ending.
  void End(grpc::Status status);

 private:
  struct Queued {
    v1::CloudMessage message;
    int64_t bytes;
    uint64_t bulk_session = 0;  // set for messages in bulk_: the session they count under
  };
  // Queues `message` behind those of its class: prompt results are bulk, and so is anything
  // of a session with prompt results still queued (a session's messages keep their order);
  // the rest goes ahead of the bulk.
  void EnqueueLocked(v1::CloudMessage message, int64_t bytes);
  void StartNextWriteLocked();
  void FinishLocked(grpc::Status status);
  // Drops every queued message but the one being written (when one is), and their bytes
  // from the totals.
  void DropQueueLocked();
  // Returns queued bytes to the totals until `keep` remain queued.
  void ReleaseQueuedLocked(int64_t keep);
  // The agent does not read: free its sessions, end the stream, cancel it if even that
  // cannot be written.
  void EndUnreadLocked(const std::string& why);
  // Detaches the stream from the engine, drops its queue and finishes it with `status`; a
  // call whose last write the agent does not take within unread_timeout_s is cancelled.
  void EndLocked(grpc::Status status);
  void CancelCall();
  // Whether the unread results pass `fraction` of the stream's bound (or of its share of the
  // bound over all streams, when that one is passed).
  bool OverBoundLocked(double fraction) const;
  // While congested: after limits.unread_stream_timeout_s, a stream that took nothing is ended.
  void ArmStallCheckLocked();
  std::chrono::milliseconds UnreadTimeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(options_.unread_timeout_s * 1000));
  }
  void OnStallCheck(int64_t writes_at_arm);
  // The pacer's wait is over: read again unless backpressure still holds the stream.
  void OnPaced();
  // Holds `message` back when it is a refusal past the device's refusal rate, or a later
  // message of a session whose refusal is held (a session's messages keep their order).
  // True when it was held.
  bool DeferLocked(v1::CloudMessage& message);
  // Queues the held messages whose time has come, and sets the alarm for the next.
  void ReleaseDeferredLocked();
  void ResumeReadLocked();
  // Queues a message to be written (Send, once it is not held back).
  void QueueLocked(v1::CloudMessage message);

  std::recursive_mutex mutex_;
  ConnectReactor* reactor_;  // null once the call is done
  Engine* const engine_;
  const StreamId stream_;
  const CloudServiceOptions options_;
  const std::shared_ptr<OutgoingTotals> totals_;
  const std::shared_ptr<DevicePacer> pacer_;  // the service's, never null
  const std::string device_key_;              // the pacer's key
  bool paced_ = false;                        // reading waits for pace_alarm_
  std::unique_ptr<grpc::Alarm> pace_alarm_;
  // Refusals past the device's refusal rate, and later messages of their sessions, with the
  // time each may be sent (in order). While kMaxDeferred are held the stream is read no
  // further (deferred_full_), so a device cannot make this grow without bound.
  struct Deferred {
    v1::CloudMessage message;
    TokenBucket::Clock::time_point release;
  };
  static constexpr size_t kMaxDeferred = 1024;
  std::deque<Deferred> deferred_;
  std::unordered_map<uint64_t, int> deferred_per_session_;
  std::unique_ptr<grpc::Alarm> deferred_alarm_;
  bool deferred_full_ = false;
  // Decode results, receipts, admissions, errors and control go before prompt results: a
  // decode round's answer must not wait on the downlink behind the results of another
  // request's long prompt. current_ is being written while writing_.
  std::deque<Queued> urgent_;
  std::deque<Queued> bulk_;
  std::unordered_map<uint64_t, int> bulk_per_session_;  // messages of each session in bulk_
  std::optional<Queued> current_;
  grpc::ByteBuffer current_bytes_;  // current_'s message, serialized: what gRPC is writing
  int64_t queued_bytes_ = 0;  // of current_, urgent_ and bulk_
  grpc::Alarm cancel_alarm_;
  bool writing_ = false;
  bool finishing_ = false;
  bool finished_ = false;
  grpc::Status final_status_;
  int64_t inflight_bytes_ = 0;
  bool read_paused_ = false;
  // Congestion (Congested()): set and cleared under mutex_, read by the engine thread.
  std::atomic<bool> congested_{false};
  int64_t writes_done_ = 0;  // progress, for the stall check
  bool stall_check_armed_ = false;
  std::unique_ptr<grpc::Alarm> stall_alarm_;
};

class ConnectReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `device`: who the stream is (AdmitDevice); "" for an anonymous plaintext stream.
  // `presented`: what the stream presented, which admitted it as `device` (AdmitDevice) by the
  // rules of `generation` (OpenStreams::Admit).
  ConnectReactor(Engine* engine, StreamId stream, const CloudServiceOptions& options,
                 std::shared_ptr<OutgoingTotals> totals, std::shared_ptr<DevicePacer> pacer,
                 std::shared_ptr<OpenStreams> open, grpc::CallbackServerContext* context,
                 PresentedCredentials presented, std::string device, uint64_t generation)
      : engine_(engine),
        stream_(stream),
        device_(std::move(device)),
        context_(context),
        open_(std::move(open)) {
    channel_ = std::make_shared<StreamChannel>(
        this, engine, stream, options, std::move(totals), std::move(pacer),
        device_.empty() ? "stream " + std::to_string(stream) : device_);
    // Registered before the engine knows it: from here on a reload holds it to its rules.
    // A reload since the stream was admitted is caught here, by a second look.
    std::weak_ptr<StreamChannel> weak = channel_;
    absl::Status still = open_->Register(stream_, std::move(presented), device_, generation,
                                         [weak](grpc::Status status) {
                                           if (auto channel = weak.lock()) {
                                             channel->End(std::move(status));
                                           }
                                         });
    if (!still.ok()) {
      spdlog::warn("stream from {} refused by the config reloaded as it connected: {}",
                   context_->peer(), std::string(still.message()));
      detached_ = true;  // never attached
      TOPHAT_TSAN_RELEASE(this);  // constructed before any reaction
      channel_->Finish(still);
      return;
    }
    spdlog::info("stream {} connected from {} ({})", stream_, context_->peer(),
                 device_.empty() ? std::string("no device identity: plaintext")
                                 : "device " + device_);
    engine_->AttachStream(stream_, channel_, device_);
    TOPHAT_TSAN_RELEASE(this);  // constructed before any reaction
    Read();
  }

  void OnReadDone(bool ok) override {
    TOPHAT_TSAN_ACQUIRE(this);
    TOPHAT_TSAN_ACQUIRE(&incoming_bytes_);  // filled for the Read() that led here
    if (!ok) {
      // The agent half-closed or the call broke: its sessions are over.
      Detach();
      channel_->Finish(absl::OkStatus());
      return;
    }
    ++messages_read_;
    const grpc::Status parsed =
        grpc::GenericDeserialize<grpc::ProtoBufferReader, v1::AgentMessage>(&incoming_bytes_,
                                                                            &incoming_);
    if (!parsed.ok()) {
      // Not one of ours: a client of another protocol or a broken one. The stream ends, with
      // an error that says why; its sessions go as on any end of the stream.
      const std::string why = absl::StrCat(
          "message ", messages_read_, " on the stream is not a tophat.v1.AgentMessage (",
          parsed.error_message(), "); the stream is ended");
      spdlog::warn("stream {} ({}): {}", stream_, context_->peer(), why);
      Detach();
      channel_->Finish(absl::InvalidArgumentError(why));
      return;
    }
    if (incoming_.has_forward() && incoming_.forward().phase() == v1::PHASE_PREFILL) {
      // The receipt the agent paces its prompt chunks by (Hello.acknowledges_chunks): now,
      // not after the engine computed the chunk, so the uplink is never left idle waiting.
      v1::CloudMessage receipt;
      v1::ChunkReceived* received = receipt.mutable_received();
      received->set_session_id(incoming_.forward().session_id());
      received->set_sequence_number(incoming_.forward().sequence_number());
      received->set_received_at_seconds(
          std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
              .count());
      channel_->Send(std::move(receipt));
    }
    // Every message counts until the engine is done with it: a chunk's payload until it is
    // computed, and a fixed cost per message of any kind (IntakeBytes).
    const int64_t bytes = IntakeBytes(incoming_);
    engine_->Deliver(stream_, std::move(incoming_));
    incoming_.Clear();
    if (channel_->OnReadQueued(bytes)) Read();
  }

  void ResumeRead() { Read(); }
  void Cancel() { context_->TryCancel(); }

  void OnWriteDone(bool ok) override {
    TOPHAT_TSAN_ACQUIRE(this);
    channel_->OnWriteDone(ok);
  }

  void OnCancel() override {
    TOPHAT_TSAN_ACQUIRE(this);
    Detach();
    channel_->Finish(absl::CancelledError("the call was cancelled"));
  }

  void OnDone() override {
    TOPHAT_TSAN_ACQUIRE(this);
    TOPHAT_TSAN_ACQUIRE(&incoming_bytes_);  // after the last read's reaction
    Detach();
    channel_->Detach();
    open_->Unregister(stream_);
    spdlog::info("stream {} done", stream_);
    delete this;
    // Its queued results, unread chunks and buffers go back to the system (after the
    // engine's detach, which may run first or later, it does the same).
    ReleaseFreedMemory();
  }

 private:
  void Detach() {
    if (!detached_.exchange(true)) engine_->DetachStream(stream_);
  }
  // The next message into incoming_bytes_; OnReadDone follows, maybe on another thread.
  void Read() {
    TOPHAT_TSAN_RELEASE(&incoming_bytes_);
    StartRead(&incoming_bytes_);
  }

  Engine* engine_;
  const StreamId stream_;
  std::string device_;  // AdmitDevice: certificate or token; "" for anonymous plaintext
  grpc::CallbackServerContext* context_;
  std::shared_ptr<StreamChannel> channel_;
  std::shared_ptr<OpenStreams> open_;
  grpc::ByteBuffer incoming_bytes_;  // what the read gets
  v1::AgentMessage incoming_;        // parsed from it
  int64_t messages_read_ = 0;
  std::atomic<bool> detached_{false};
};

// The lock is held across StartWrite/StartRead/Finish so that the reactor cannot be
// deleted (OnDone) between the check of reactor_ and the call. It is recursive because
// gRPC may run a reaction inline on the calling thread.
void StreamChannel::Send(v1::CloudMessage message) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (reactor_ == nullptr || finishing_) return;
  // This layer sends the receipts (ConnectReactor::OnReadDone), so it is the one to say so.
  if (message.has_hello()) message.mutable_hello()->set_acknowledges_chunks(true);
  if (DeferLocked(message)) return;
  QueueLocked(std::move(message));
}

void StreamChannel::QueueLocked(v1::CloudMessage message) {
  // Framing and field overhead besides the serialized bytes; a queue of tiny messages
  // costs memory too.
  const int64_t bytes = static_cast<int64_t>(message.ByteSizeLong()) + 64;
  // Congestion stops the engine from computing more for this stream, so only work already
  // under way when it began can pass the bound; twice it is something else.
  if (queued_bytes_ + bytes > 2 * options_.max_queued_bytes_per_stream) {
    EndUnreadLocked(absl::StrCat("more than twice limits.max_queued_bytes_per_stream (",
                                 options_.max_queued_bytes_per_stream,
                                 " bytes) of results are waiting for the agent to read them"));
    return;
  }
  EnqueueLocked(std::move(message), bytes);
  queued_bytes_ += bytes;
  totals_->queued_bytes.fetch_add(bytes);
  if (options_.metrics != nullptr) options_.metrics->outgoing_queued_bytes.Increment(bytes);
  if (!congested_.load(std::memory_order_relaxed) && OverBoundLocked(1.0)) {
    congested_.store(true, std::memory_order_relaxed);
    if (options_.metrics != nullptr) options_.metrics->streams_congested.Increment();
    spdlog::debug("stream {}: {} bytes of results unread; its work waits until they are read",
                  stream_, queued_bytes_);
    ArmStallCheckLocked();
  }
  StartNextWriteLocked();
}

void StreamChannel::EnqueueLocked(v1::CloudMessage message, int64_t bytes) {
  // Receipts, control and hello keep no order with any session's results.
  const uint64_t session = message.has_received() ? 0 : SessionOf(message).value_or(0);
  bool bulk = message.has_result() && message.result().phase() == v1::PHASE_PREFILL;
  if (!bulk && session != 0 && bulk_per_session_.contains(session)) bulk = true;
  if (bulk) {
    ++bulk_per_session_[session];
    bulk_.push_back({std::move(message), bytes, session});
  } else {
    urgent_.push_back({std::move(message), bytes, 0});
  }
}

bool StreamChannel::OverBoundLocked(double fraction) const {
  if (queued_bytes_ > fraction * static_cast<double>(options_.max_queued_bytes_per_stream)) {
    return true;
  }
  // Past the bound over all streams only those above an equal share are held back, so a
  // stream that reads what it is sent is never held for another's backlog.
  const int64_t total = totals_->queued_bytes.load();
  if (total <= fraction * static_cast<double>(options_.max_queued_bytes_total)) return false;
  const int64_t share =
      options_.max_queued_bytes_total / std::max<int64_t>(1, totals_->streams.load());
  return queued_bytes_ > fraction * static_cast<double>(share);
}

void StreamChannel::ArmStallCheckLocked() {
  if (stall_check_armed_) return;
  stall_check_armed_ = true;
  const int64_t writes_at_arm = writes_done_;
  std::weak_ptr<StreamChannel> weak = weak_from_this();
  // The previous alarm may be the one whose callback is running; gRPC keeps its own
  // reference to a firing alarm, so replacing ours here is safe.
  stall_alarm_ = std::make_unique<grpc::Alarm>();
  SetAlarm(*stall_alarm_, UnreadTimeout(), [weak, writes_at_arm] {
    if (auto channel = weak.lock()) channel->OnStallCheck(writes_at_arm);
  });
}

void StreamChannel::OnStallCheck(int64_t writes_at_arm) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  stall_check_armed_ = false;
  if (!congested_.load(std::memory_order_relaxed) || finishing_ || reactor_ == nullptr) return;
  if (writes_done_ == writes_at_arm) {
    EndUnreadLocked(absl::StrCat("it took none of its results for ", options_.unread_timeout_s,
                                 " s (limits.unread_stream_timeout_s) while ", queued_bytes_,
                                 " bytes waited, more than limits.max_queued_bytes_per_stream (",
                                 options_.max_queued_bytes_per_stream, ") or its share of ",
                                 "limits.max_queued_bytes_total"));
    return;
  }
  ArmStallCheckLocked();  // slow, but reading: look again later
}

void StreamChannel::ReleaseQueuedLocked(int64_t keep) {
  const int64_t released = queued_bytes_ - keep;
  if (released <= 0) return;
  queued_bytes_ = keep;
  totals_->queued_bytes.fetch_sub(released);
  if (options_.metrics != nullptr) options_.metrics->outgoing_queued_bytes.Decrement(released);
}

void StreamChannel::DropQueueLocked() {
  deferred_.clear();
  deferred_per_session_.clear();
  urgent_.clear();
  bulk_.clear();
  bulk_per_session_.clear();
  if (writing_ && current_.has_value()) {
    ReleaseQueuedLocked(current_->bytes);
  } else {
    current_.reset();
    ReleaseQueuedLocked(0);
  }
}

void StreamChannel::EndUnreadLocked(const std::string& why) {
  spdlog::warn("stream {}: ending it: {}", stream_, why);
  if (options_.metrics != nullptr) options_.metrics->streams_not_reading.Increment();
  EndLocked(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                         "the agent is not reading its stream: " + why));
}

void StreamChannel::End(grpc::Status status) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (reactor_ == nullptr || finishing_) return;
  EndLocked(std::move(status));
}

void StreamChannel::EndLocked(grpc::Status status) {
  // Its sessions' KV and its place in the batch go now, not when the call is finally done.
  engine_->DetachStream(stream_);
  DropQueueLocked();
  FinishLocked(std::move(status));
  if (writing_) {
    // The status can only follow the message being written, which the agent is not taking.
    std::weak_ptr<StreamChannel> weak = weak_from_this();
    SetAlarm(cancel_alarm_, UnreadTimeout(), [weak] {
      if (auto channel = weak.lock()) channel->CancelCall();
    });
  }
}

void StreamChannel::CancelCall() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (reactor_ == nullptr || finished_) return;
  spdlog::warn("stream {}: the agent took nothing for {} s; cancelling the call", stream_,
               options_.unread_timeout_s);
  reactor_->Cancel();
}

void StreamChannel::StartNextWriteLocked() {
  if (writing_ || reactor_ == nullptr || finished_) return;
  if (!urgent_.empty()) {
    current_ = std::move(urgent_.front());
    urgent_.pop_front();
  } else if (!bulk_.empty()) {
    current_ = std::move(bulk_.front());
    bulk_.pop_front();
    auto it = bulk_per_session_.find(current_->bulk_session);
    if (it != bulk_per_session_.end() && --it->second <= 0) bulk_per_session_.erase(it);
  } else {
    return;
  }
  bool own_buffer = false;
  const grpc::Status serialized =
      grpc::GenericSerialize<grpc::ProtoBufferWriter, v1::CloudMessage>(
          current_->message, &current_bytes_, &own_buffer);
  if (!serialized.ok()) {
    // Only a message past protobuf's 2 GiB can fail here; the engine never makes one.
    spdlog::error("stream {}: a result could not be serialized: {}", stream_,
                  serialized.error_message());
    current_.reset();
    FinishLocked(grpc::Status(grpc::StatusCode::INTERNAL,
                              "a result could not be serialized: " + serialized.error_message()));
    return;
  }
  // The serialized copy is what is written; the message itself (a result's payload) goes now
  // rather than when the write is done. Its bytes still count until then.
  current_->message = v1::CloudMessage();
  writing_ = true;
  reactor_->StartWrite(&current_bytes_);
}

void StreamChannel::FinishLocked(grpc::Status status) {
  if (finishing_ || reactor_ == nullptr) return;
  // Held refusals are not worth writing: the end of the stream ends their sessions too.
  deferred_.clear();
  deferred_per_session_.clear();
  finishing_ = true;
  final_status_ = std::move(status);
  if (!writing_) {
    DropQueueLocked();
    finished_ = true;
    reactor_->Finish(final_status_);
  }
}

void StreamChannel::OnWriteDone(bool ok) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  writing_ = false;
  if (current_.has_value()) {
    ReleaseQueuedLocked(queued_bytes_ - current_->bytes);
    current_.reset();
  }
  current_bytes_.Clear();
  ++writes_done_;
  if (congested_.load(std::memory_order_relaxed) && !OverBoundLocked(0.5)) {
    congested_.store(false, std::memory_order_relaxed);
    engine_->Wake();  // the engine picks its work up again (it sleeps while none is runnable)
  }
  if (!ok) {  // the client is gone; a failed read or OnCancel finishes the call
    DropQueueLocked();
  }
  if ((!urgent_.empty() || !bulk_.empty()) && !finished_) {
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
  if (deferred_.size() >= kMaxDeferred) {
    deferred_full_ = true;
    return false;
  }
  const auto wait = pacer_->Take(device_key_);
  if (wait > TokenBucket::Clock::duration::zero()) {
    paced_ = true;
    if (options_.metrics != nullptr) options_.metrics->reads_paced.Increment();
    std::weak_ptr<StreamChannel> weak = weak_from_this();
    pace_alarm_ = std::make_unique<grpc::Alarm>();
    SetAlarm(*pace_alarm_, wait, [weak] {
      if (auto channel = weak.lock()) channel->OnPaced();
    });
    return false;
  }
  return true;
}

void StreamChannel::OnPaced() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  paced_ = false;
  ResumeReadLocked();
}

void StreamChannel::ResumeReadLocked() {
  if (!read_paused_ && !paced_ && !deferred_full_ && reactor_ != nullptr && !finishing_) {
    reactor_->ResumeRead();
  }
}

void StreamChannel::Consumed(int64_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  inflight_bytes_ -= bytes;
  if (read_paused_ && inflight_bytes_ <= options_.max_inflight_bytes_per_stream / 2) {
    read_paused_ = false;
    ResumeReadLocked();
  }
}

bool StreamChannel::DeferLocked(v1::CloudMessage& message) {
  const std::optional<uint64_t> session = SessionOf(message);
  if (!session.has_value()) return false;
  TokenBucket::Clock::time_point release;
  if (deferred_per_session_.contains(*session)) {
    release = deferred_.back().release;  // behind its session's held refusal
  } else {
    if (!message.has_error() || message.error().session_alive() ||
        message.error().code() != static_cast<int32_t>(absl::StatusCode::kResourceExhausted)) {
      return false;
    }
    const TokenBucket::Clock::duration wait = pacer_->TakeRefusal(device_key_);
    if (wait <= TokenBucket::Clock::duration::zero()) return false;
    release = TokenBucket::Clock::now() + wait;
    if (!deferred_.empty()) release = std::max(release, deferred_.back().release);
    if (options_.metrics != nullptr) options_.metrics->refusals_paced.Increment();
  }
  ++deferred_per_session_[*session];
  deferred_.push_back({std::move(message), release});
  if (deferred_.size() == 1) ReleaseDeferredLocked();  // arms the alarm
  return true;
}

void StreamChannel::ReleaseDeferredLocked() {
  const auto now = TokenBucket::Clock::now();
  while (!deferred_.empty() && deferred_.front().release <= now) {
    Deferred& front = deferred_.front();
    const uint64_t session = SessionOf(front.message).value_or(0);
    if (--deferred_per_session_[session] == 0) deferred_per_session_.erase(session);
    v1::CloudMessage message = std::move(front.message);
    deferred_.pop_front();
    QueueLocked(std::move(message));
    if (finishing_) return;  // the stream ended (QueueLocked found it not reading)
  }
  if (deferred_full_ && deferred_.size() <= kMaxDeferred / 2) {
    deferred_full_ = false;
    ResumeReadLocked();
  }
  if (deferred_.empty()) return;
  std::weak_ptr<StreamChannel> weak = weak_from_this();
  deferred_alarm_ = std::make_unique<grpc::Alarm>();
  SetAlarm(*deferred_alarm_, deferred_.front().release - now, [weak] {
    if (auto channel = weak.lock()) {
      std::lock_guard<std::recursive_mutex> lock(channel->mutex_);
      if (channel->reactor_ != nullptr && !channel->finishing_) channel->ReleaseDeferredLocked();
    }
  });
}

void StreamChannel::Detach() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  reactor_ = nullptr;
  writing_ = false;  // no OnWriteDone comes after OnDone
  DropQueueLocked();
  current_bytes_.Clear();
}

}  // namespace

void DevicePacer::Fit(Device& device, TokenBucket::Clock::time_point now) {
  const auto fit = [&](std::optional<TokenBucket>& bucket, double per_second) {
    if (per_second <= 0) {
      bucket.reset();
    } else if (bucket.has_value()) {
      bucket->SetRate(per_second, std::max(1.0, per_second), now);
    } else {
      bucket.emplace(per_second, std::max(1.0, per_second), now);
    }
  };
  fit(device.messages, per_second_);
  fit(device.refusals, per_second_ > 0 ? refusals_per_second_ : 0);
}

void DevicePacer::Register(const std::string& device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, added] = devices_.try_emplace(device);
  if (added) Fit(it->second, TokenBucket::Clock::now());
  ++it->second.streams;
}

void DevicePacer::Unregister(const std::string& device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = devices_.find(device);
  if (it != devices_.end() && --it->second.streams <= 0) devices_.erase(it);
}

void DevicePacer::SetRates(double per_second, double refusals_per_second) {
  std::lock_guard<std::mutex> lock(mutex_);
  per_second_ = per_second;
  refusals_per_second_ = refusals_per_second;
  const TokenBucket::Clock::time_point now = TokenBucket::Clock::now();
  for (auto& [name, device] : devices_) Fit(device, now);
}

TokenBucket::Clock::duration DevicePacer::TakeRefusal(const std::string& device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = devices_.find(device);
  if (it == devices_.end() || !it->second.refusals.has_value()) {
    return TokenBucket::Clock::duration::zero();
  }
  return it->second.refusals->Take(TokenBucket::Clock::now());
}

TokenBucket::Clock::duration DevicePacer::Take(const std::string& device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = devices_.find(device);
  if (it == devices_.end() || !it->second.messages.has_value()) {
    return TokenBucket::Clock::duration::zero();
  }
  return it->second.messages->Take(TokenBucket::Clock::now());
}

// A stream refused before it reaches the engine: it ends at once with `status`.
class RefusedReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RefusedReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CloudServiceImpl::Connect(
    grpc::CallbackServerContext* context) {
  PresentedCredentials presented{.certified = PeerIdentity(*context->auth_context()),
                                 .certificate = PeerCertificateId(*context->auth_context())};
  const auto& metadata = context->client_metadata();
  if (const auto found = metadata.find(kAuthorizationMetadata); found != metadata.end()) {
    presented.token_digest =
        BearerDigest(absl::string_view(found->second.data(), found->second.size()));
  }
  OpenStreams::Admission admission = open_->Admit(presented);
  absl::StatusOr<std::string>& device = admission.device;
  if (!device.ok()) {
    // Rate-limited: a client retrying a bad token must not flood the log.
    std::lock_guard<std::mutex> lock(refusal_log_mutex_);
    int64_t suppressed = 0;
    if (refusal_log_.Allow(LogRate::Clock::now(), &suppressed)) {
      spdlog::warn("stream from {} refused: {}{}", context->peer(), std::string(device.status().message()),
                   suppressed > 0 ? absl::StrCat(" (", suppressed, " more refused since)") : "");
    }
    return new RefusedReactor(ToGrpcStatus(device.status()));
  }
  return new ConnectReactor(engine_, next_stream_++, options_, totals_, pacer_, open_, context,
                            std::move(presented), *std::move(device), admission.generation);
}

void CloudServiceImpl::ReportAccess(const DeviceAccess& access) {
  if (options_.metrics == nullptr) return;
  options_.metrics->crl.Report(access.revoked_certificates.get());
}

int CloudServiceImpl::UpdateAccess(DeviceAccess access) {
  ReportAccess(access);
  const std::vector<OpenStreams::Ending> ending = open_->Replace(std::move(access));
  for (const OpenStreams::Ending& stream : ending) {
    spdlog::warn("stream {} ({}): ended by the reloaded config: {}", stream.id,
                 stream.device.empty() ? std::string("plaintext") : "device " + stream.device,
                 stream.status.error_message());
    stream.end(stream.status);
    if (options_.metrics != nullptr) options_.metrics->streams_revoked.Increment();
  }
  return static_cast<int>(ending.size());
}

}  // namespace tophat
