#include "device_agent/cloud_connection.h"

#include <algorithm>
#include <optional>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "proto/channel_security.h"
#include "proto/session_of.h"

namespace tophat {

void SessionMailbox::Push(MailboxEvent event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(event));
  }
  cv_.notify_one();
}

std::optional<MailboxEvent> SessionMailbox::Pop(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_until(lock, deadline, [&] { return !events_.empty(); })) return std::nullopt;
  MailboxEvent event = std::move(events_.front());
  events_.pop_front();
  return event;
}

void SessionMailbox::Interrupt() { Push({.kind = MailboxEvent::Kind::kInterrupted}); }

namespace {

int64_t Ticks(std::chrono::steady_clock::time_point t) { return t.time_since_epoch().count(); }

}  // namespace

absl::Status CloudConnection::CheckCloudCertificate(const std::optional<CertificateId>& certificate,
                                                    const RevokedCertificates* revoked,
                                                    const std::string& name) {
  if (revoked == nullptr || !certificate.has_value() || !revoked->Revoked(*certificate)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "the cloud at ", name, " presents a revoked certificate (serial ", certificate->serial,
      ", issued by ", certificate->issuer, "; cloud_tls.crl_file)"));
}

std::optional<std::string> CloudConnection::EndStreamIfRevoked(const RevokedCertificates& revoked) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!connected_ || context_ == nullptr || !ended_because_.empty()) return std::nullopt;
  absl::Status refusal = CheckCloudCertificate(stream_certificate_, &revoked, stream_name_);
  if (refusal.ok()) return std::nullopt;
  ended_because_ = refusal.ToString();
  // The reader's Read returns false, and it closes the stream as any that ended.
  context_->TryCancel();
  return ended_because_;
}

CloudConnection::CloudConnection(CloudConnectionOptions options)
    : options_(std::move(options)), pacer_(options_.pacing_lead_s) {
  token_ = options_.token;
  revoked_ = options_.revoked;
  if (!options_.resolve) Dial(options_.address);
  if (options_.one_way_delay_s > 0 || options_.uplink_bytes_per_second > 0 ||
      options_.downlink_bytes_per_second > 0) {
    uplink_ = std::make_unique<DelayLine>(options_.one_way_delay_s,
                                          options_.uplink_bytes_per_second, "tophat-linkup");
    downlink_ = std::make_unique<DelayLine>(options_.one_way_delay_s,
                                            options_.downlink_bytes_per_second, "tophat-linkdn");
  }
  sender_ = std::thread([this] { SendLoop(); });
  thread_ = std::thread([this] { Run(); });
}

void CloudConnection::Dial(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options_.max_message_bytes));
  // Reconnect promptly after a cloud restart; gRPC's own backoff would wait up to 2 minutes.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(options_.max_backoff_s * 1000));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(options_.initial_backoff_s * 1000));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              static_cast<int>(options_.initial_backoff_s * 1000));
  if (options_.keepalive_s > 0) {
    // Pings even while no call is active, so that a dead link is found before a request
    // needs it; the cloud is configured to accept them (server/cloud_main.cc).
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(options_.keepalive_s * 1000));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                static_cast<int>(options_.keepalive_timeout_s * 1000));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  if (!options_.server_name.empty()) {
    args.SetString(GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, options_.server_name);
  }
  channel_ = grpc::CreateCustomChannel(
      address,
      options_.credentials != nullptr ? options_.credentials : grpc::InsecureChannelCredentials(),
      args);
  stub_ = v1::CloudService::NewStub(channel_);
  dialed_ = address;
}

CloudConnection::~CloudConnection() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  state_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lock(outbox_mutex_);
    outbox_stopping_ = true;
  }
  outbox_cv_.notify_all();
  if (sender_.joinable()) sender_.join();
  // The lines' threads call back into this object; stop them before anything goes.
  uplink_.reset();
  downlink_.reset();
}

std::shared_ptr<SessionMailbox> CloudConnection::Register(uint64_t session_id) {
  auto mailbox = std::make_shared<SessionMailbox>();
  std::lock_guard<std::mutex> lock(mutex_);
  mailboxes_[session_id] = mailbox;
  return mailbox;
}

void CloudConnection::Register(uint64_t session_id, std::shared_ptr<SessionMailbox> mailbox) {
  std::lock_guard<std::mutex> lock(mutex_);
  mailboxes_[session_id] = std::move(mailbox);
}

void CloudConnection::Unregister(uint64_t session_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  mailboxes_.erase(session_id);
}

absl::StatusOr<CloudConnection::Connected> CloudConnection::WaitConnected(
    std::chrono::steady_clock::time_point deadline, uint64_t after_epoch) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto ready = [&] { return connected_.load() && epoch_ > after_epoch; };
  state_cv_.wait_until(lock, deadline, [&] { return ready() || stopping_; });
  if (!ready()) {
    return absl::UnavailableError(
        absl::StrCat("no connection to the cloud at ", options_.address, ": ", last_error_));
  }
  return Connected{.epoch = epoch_, .hello = hello_};
}

absl::Status CloudConnection::Send(uint64_t epoch, v1::AgentMessage message, SentStamp sent) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!connected_ || epoch != epoch_) {
      return absl::UnavailableError(absl::StrCat("the cloud stream ", epoch, " is gone"));
    }
  }
  {
    std::lock_guard<std::mutex> lock(outbox_mutex_);
    const int64_t bytes = static_cast<int64_t>(message.ByteSizeLong());
    const bool frees_cloud_memory = message.has_close() || message.has_cancel() || message.has_park();
    if (!frees_cloud_memory &&
        ((options_.max_outbox_messages > 0 && outbox_messages_ >= options_.max_outbox_messages) ||
         (options_.max_outbox_bytes > 0 && outbox_messages_ > 0 &&
          outbox_bytes_ + bytes > options_.max_outbox_bytes))) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the agent's outbox to the cloud is full: ", outbox_messages_, " message(s), ",
          outbox_bytes_, " bytes not yet written (max_outbox_messages ",
          options_.max_outbox_messages, ", max_outbox_bytes ", options_.max_outbox_bytes,
          "); the cloud or the uplink is not keeping up"));
    }
    const std::optional<uint64_t> session = SessionOf(message);
    bool bulk = pacing_ && message.has_forward() &&
                message.forward().phase() == v1::PHASE_PREFILL;
    if (session.has_value() && bulk_per_session_.contains(*session)) {
      if (message.has_cancel()) {
        // Its chunks would only be refused by a cloud that has dropped the session.
        std::erase_if(bulk_, [&](const Outgoing& o) {
          if (o.bulk_session != *session) return false;
          CountOutboxLocked(o, -1);
          return true;
        });
        bulk_per_session_.erase(*session);
      } else {
        bulk = true;  // behind its session's queued chunks
      }
    }
    Outgoing out{.message = std::move(message),
                 .epoch = epoch,
                 .sent = std::move(sent),
                 .queued = std::chrono::steady_clock::now(),
                 .bytes = bytes};
    CountOutboxLocked(out, +1);
    if (bulk) {
      out.bulk_session = *session;
      ++bulk_per_session_[*session];
      bulk_.push_back(std::move(out));
    } else {
      urgent_.push_back(std::move(out));
    }
  }
  outbox_cv_.notify_one();
  return absl::OkStatus();
}

void CloudConnection::CountOutboxLocked(const Outgoing& out, int sign) {
  outbox_bytes_ += sign * out.bytes;
  outbox_messages_ += sign;
}

void CloudConnection::SendLoop() {
  pthread_setname_np(pthread_self(), "tophat-uplink");
  std::unique_lock<std::mutex> lock(outbox_mutex_);
  while (!outbox_stopping_) {
    const auto now = std::chrono::steady_clock::now();
    const double bytes_per_second =
        options_.measured_uplink_bytes_per_second
            ? options_.measured_uplink_bytes_per_second()
            : 0;
    std::optional<Outgoing> next;
    if (!urgent_.empty()) {
      next = std::move(urgent_.front());
      urgent_.pop_front();
    } else if (!bulk_.empty() && (!pacing_ || pacer_.MayRelease(now, bytes_per_second))) {
      next = std::move(bulk_.front());
      bulk_.pop_front();
      auto it = bulk_per_session_.find(next->bulk_session);
      if (it != bulk_per_session_.end() && --it->second <= 0) bulk_per_session_.erase(it);
    }
    if (next.has_value()) CountOutboxLocked(*next, -1);
    if (!next.has_value()) {
      if (bulk_.empty()) {
        outbox_cv_.wait(lock);
      } else {
        // A receipt or a new message wakes it; the estimate may change meanwhile too.
        auto until = now + std::chrono::milliseconds(100);
        if (auto at = pacer_.ReleaseAt(bytes_per_second)) until = std::min(until, *at);
        outbox_cv_.wait_until(lock, until);
      }
      continue;
    }
    if (next->epoch != outbox_epoch_) continue;  // its stream is gone: the owner replays
    const size_t bytes = OnWireBytes(next->message.ByteSizeLong());
    const bool paced = pacing_ && next->message.has_forward() &&
                       next->message.forward().phase() == v1::PHASE_PREFILL;
    if (paced) {
      pacer_.Released(next->message.forward().session_id(),
                      next->message.forward().sequence_number(), bytes, now, bytes_per_second);
    }
    if (next->sent != nullptr) next->sent->store(Ticks(now));
    lock.unlock();
    if (paced && options_.on_chunk_paced) {
      options_.on_chunk_paced(std::chrono::duration<double>(now - next->queued).count());
    }
    if (uplink_ == nullptr) {
      Write(next->epoch, next->message).IgnoreError();  // a lost stream: a disconnect event
    } else {
      uplink_->Push(bytes, [this, epoch = next->epoch, message = std::move(next->message)] {
        Write(epoch, message).IgnoreError();
      });
    }
    lock.lock();
  }
}

void CloudConnection::ForgetStream(uint64_t epoch) {
  {
    std::lock_guard<std::mutex> lock(outbox_mutex_);
    if (outbox_epoch_ == epoch) outbox_epoch_ = 0;
    const auto gone = [&](const Outgoing& o) {
      if (o.epoch != epoch) return false;
      CountOutboxLocked(o, -1);
      return true;
    };
    std::erase_if(urgent_, gone);
    std::erase_if(bulk_, gone);
    bulk_per_session_.clear();
    for (const Outgoing& o : bulk_) ++bulk_per_session_[o.bulk_session];
    pacer_.Reset();
  }
  outbox_cv_.notify_all();
}

void CloudConnection::Acknowledged(const v1::ChunkReceived& received, uint64_t epoch) {
  {
    std::lock_guard<std::mutex> lock(outbox_mutex_);
    if (epoch != outbox_epoch_) return;
    pacer_.Acknowledged(received.session_id(), received.sequence_number(),
                        std::chrono::steady_clock::now());
  }
  outbox_cv_.notify_all();
}

void CloudConnection::Downlink(size_t bytes, std::function<void()> deliver) {
  if (downlink_ == nullptr) {
    deliver();
  } else {
    downlink_->Push(bytes, std::move(deliver));
  }
}

absl::Status CloudConnection::Write(uint64_t epoch, const v1::AgentMessage& message) {
  std::lock_guard<std::mutex> write_lock(write_mutex_);
  grpc::ClientReaderWriter<v1::AgentMessage, v1::CloudMessage>* stream = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (connected_ && epoch == epoch_) stream = stream_.get();
  }
  if (stream == nullptr) {
    return absl::UnavailableError(absl::StrCat("the cloud stream ", epoch, " is gone"));
  }
  if (!stream->Write(message)) {
    return absl::UnavailableError(absl::StrCat("writing to the cloud stream ", epoch, " failed"));
  }
  return absl::OkStatus();
}

v1::Control CloudConnection::control() {
  std::lock_guard<std::mutex> lock(mutex_);
  return hello_.control();
}

void CloudConnection::Broadcast(MailboxEvent event) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [id, mailbox] : mailboxes_) mailbox->Push(event);
}

void CloudConnection::Run() {
  pthread_setname_np(pthread_self(), "tophat-cloudrx");
  double backoff = options_.initial_backoff_s;
  std::string last_logged;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
    }
    absl::Status failure;
    if (options_.resolve) {
      // Again before every attempt: the cloud may be back on another address.
      absl::StatusOr<std::string> address = options_.resolve();
      if (!address.ok()) {
        failure = absl::Status(address.status().code(),
                               absl::StrCat("the cloud at ", options_.address, ": ",
                                            address.status().message()));
      } else if (*address != dialed_) {
        spdlog::info("cloud {}: dialling {}", options_.address, *address);
        Dial(*address);
      }
    }
    // How errors name this cloud: its address, and what it resolved to.
    const std::string name = dialed_.empty() || dialed_ == options_.address
                                 ? options_.address
                                 : absl::StrCat(options_.address, " (", dialed_, ")");
    grpc::ClientContext* raw_context = nullptr;
    std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::CloudMessage>> stream;
    v1::CloudMessage first;
    bool read_ok = false;
    std::optional<CertificateId> certificate;  // the cloud's (none over plaintext)
    if (failure.ok()) {
      auto context = std::make_unique<grpc::ClientContext>();
      context->set_wait_for_ready(false);
      if (!options_.token_file.empty()) {
        // Only this thread reads and writes the token.
        auto token = ReadTokenFile(options_.token_file, "cloud_tls.token_file");
        if (token.ok()) {
          token_ = *std::move(token);
        } else {
          spdlog::warn("cloud {}: {}; sending the token read before", name,
                       std::string(token.status().message()));
        }
      }
      if (!token_.empty()) {
        context->AddMetadata(kAuthorizationMetadata, BearerMetadataValue(token_));
      }
      if (!options_.crl_file.empty()) {
        auto revoked = LoadRevocationLists(options_.crl_file, "cloud_tls.crl_file",
                                           options_.ca_file, "cloud_tls.ca_file");
        if (revoked.ok()) {
          revoked_ = std::make_shared<const RevokedCertificates>(*std::move(revoked));
          if (options_.on_revocation_lists_read) options_.on_revocation_lists_read(*revoked_);
        } else {
          spdlog::warn("cloud {}: {}; checking against the CRLs read before", name,
                       std::string(revoked.status().message()));
        }
      }
      raw_context = context.get();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        context_ = std::move(context);
        ended_because_.clear();
      }
      stream = stub_->Connect(raw_context);
      read_ok = stream->Read(&first);
      if (!read_ok) {
        grpc::Status status = stream->Finish();
        failure = absl::UnavailableError(absl::StrCat(
            "cannot reach the cloud at ", name, ": ",
            status.error_message().empty() ? "stream closed" : status.error_message()));
      } else if (!first.has_hello()) {
        failure = absl::InternalError("the cloud's first message was not a Hello");
      } else {
        const std::shared_ptr<const grpc::AuthContext> auth = raw_context->auth_context();
        certificate = auth != nullptr ? PeerCertificateId(*auth) : std::nullopt;
        failure = CheckCloudCertificate(certificate, revoked_.get(), name);
        if (failure.ok() && options_.check_hello) {
          failure = options_.check_hello(first.hello());
          // Named, so that of several clouds the one refused is known.
          if (!failure.ok()) {
            failure = absl::Status(failure.code(),
                                   absl::StrCat("the cloud at ", name, ": ", failure.message()));
          }
        }
      }
    }
    if (!failure.ok()) {
      if (read_ok) {
        raw_context->TryCancel();
        stream->Finish();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        last_error_ = std::string(failure.message());
        context_.reset();
      }
      if (last_error_ != last_logged) {
        spdlog::warn("cloud: {} (retrying with backoff)", failure.ToString());
        last_logged = last_error_;
      }
      std::unique_lock<std::mutex> lock(mutex_);
      state_cv_.wait_for(lock, std::chrono::duration<double>(backoff), [&] { return stopping_; });
      backoff = std::min(backoff * 2, options_.max_backoff_s);
      continue;
    }

    uint64_t epoch = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stream_ = std::move(stream);
      stream_name_ = name;
      stream_certificate_ = std::move(certificate);
      hello_ = first.hello();
      load_ = first.hello().load();
      placed_since_report_ = 0;
      epoch = options_.epochs != nullptr ? ++*options_.epochs : epoch_ + 1;
      epoch_ = epoch;
      ++streams_opened_;
      {
        // Before anyone can Send on the new stream (mutex_, then outbox_mutex_: the only
        // place both are held).
        std::lock_guard<std::mutex> outbox_lock(outbox_mutex_);
        outbox_epoch_ = epoch;
        pacing_ = options_.pace_uplink && first.hello().acknowledges_chunks();
        pacer_.Reset();
      }
      connected_ = true;
    }
    if (streams_opened_ > 1) ++reconnects_;
    state_cv_.notify_all();
    spdlog::info("cloud: connected to {} (stream {}, middle layers [{}, {}))", name,
                 epoch, first.hello().first_layer(), first.hello().end_layer());
    last_logged.clear();
    backoff = options_.initial_backoff_s;
    if (options_.on_state_change) options_.on_state_change(true);
    if (options_.on_load) options_.on_load(first.hello().load());

    grpc::ClientReaderWriter<v1::AgentMessage, v1::CloudMessage>* reader = stream_.get();
    v1::CloudMessage message;
    while (reader->Read(&message)) {
      const size_t bytes = OnWireBytes(message.ByteSizeLong());
      Downlink(bytes, [this, epoch, moved = std::move(message)]() mutable {
        Route(std::move(moved), epoch);
      });
      message.Clear();
    }

    // The stream is over. Take the write lock so no writer is inside Write() on it.
    grpc::Status status;
    {
      std::lock_guard<std::mutex> write_lock(write_mutex_);
      std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::CloudMessage>> done;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        connected_ = false;
        done = std::move(stream_);
      }
      status = done->Finish();
      std::lock_guard<std::mutex> lock(mutex_);
      last_error_ =
          absl::StrCat("stream ", epoch, " ended: ",
                       !ended_because_.empty()          ? ended_because_
                       : status.error_message().empty() ? std::string("closed by the cloud")
                                                        : status.error_message());
      context_.reset();
    }
    spdlog::warn("cloud: {}", last_error_);
    ForgetStream(epoch);
    // After the messages that were still on the way down.
    Downlink(0, [this, epoch] {
      Broadcast({.kind = MailboxEvent::Kind::kDisconnected, .epoch = epoch});
    });
    if (options_.on_state_change) options_.on_state_change(false);
  }
}

void CloudConnection::Route(v1::CloudMessage message, uint64_t epoch) {
  if (message.has_control()) {
    std::lock_guard<std::mutex> lock(mutex_);
    *hello_.mutable_control() = message.control();
    return;
  }
  if (message.has_load()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (epoch != epoch_) return;
      load_ = message.load();
      placed_since_report_ = 0;
    }
    if (options_.on_load) options_.on_load(message.load());
    return;
  }
  if (message.has_received()) {  // the pacer's, not a session's mailbox's
    Acknowledged(message.received(), epoch);
    return;
  }
  const std::optional<uint64_t> session = SessionOf(message);
  if (!session.has_value()) return;  // a second Hello, or a kind this build does not know
  const uint64_t session_id = *session;
  std::shared_ptr<SessionMailbox> mailbox;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = mailboxes_.find(session_id);
    if (it != mailboxes_.end()) mailbox = it->second;
  }
  if (mailbox != nullptr) {
    mailbox->Push({.kind = MailboxEvent::Kind::kMessage, .message = std::move(message),
                   .epoch = epoch, .received = std::chrono::steady_clock::now()});
  } else if (message.has_error()) {
    if (options_.on_unclaimed_error && options_.on_unclaimed_error(epoch, message.error())) {
      spdlog::debug("cloud: {}", message.error().message());
    } else {
      spdlog::warn("cloud error for session {}: {}", session_id, message.error().message());
    }
  }
}

CloudConnection::LoadView CloudConnection::load_view() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {.connected = connected_.load(),
          .epoch = epoch_,
          .load = load_,
          .placed_since_report = placed_since_report_};
}

void CloudConnection::CountPlacement() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++placed_since_report_;
}

}  // namespace tophat
