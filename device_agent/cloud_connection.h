// The agent's one stream to tophat-cloud. A background thread connects (with exponential
// backoff), checks the cloud's Hello against the device bundle, reads every CloudMessage
// and routes it to the mailbox of the session it names. When the stream breaks, every
// mailbox gets a "disconnected" event carrying the stream's epoch, and the thread reconnects;
// requests then replay their hidden states to rebuild the cloud's KV (device_agent/agent.cc).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "device_agent/link_emulator.h"
#include "device_agent/sent_stamp.h"
#include "proto/certificate_revocation.h"
#include "scheduler/uplink_pacer.h"
#include "tophat/v1/cloud.grpc.pb.h"

namespace tophat {

// What a session's owner receives: a message that arrived on stream `epoch`, or the loss of
// stream `epoch`. Owners drop messages from streams older than the one they now use: a cloud
// that was draining may still answer for a session that has since moved on.
struct MailboxEvent {
  enum class Kind { kMessage, kDisconnected, kInterrupted } kind = Kind::kMessage;
  v1::CloudMessage message;
  uint64_t epoch = 0;
  // When the message arrived (after the emulated link, if any): transfer times are measured
  // against this, not against when the request thread got round to it.
  std::chrono::steady_clock::time_point received{};
};

// One session's inbox. Written by the connection's reader thread, read by one request thread.
class SessionMailbox {
 public:
  void Push(MailboxEvent event);
  // Waits for the next event until `deadline`; nullopt on timeout.
  std::optional<MailboxEvent> Pop(std::chrono::steady_clock::time_point deadline);
  // Wakes the reader with a kInterrupted event (request cancelled).
  void Interrupt();

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<MailboxEvent> events_;
};

struct CloudConnectionOptions {
  // Where the cloud is; with `resolve`, the name this connection goes by in logs, errors and
  // metrics.
  std::string address = "127.0.0.1:7100";
  // When set, asked for the address to dial before every connection attempt (a DNS name's
  // slot: device_agent/dns_clouds.h); an error counts as a failed attempt.
  std::function<absl::StatusOr<std::string>()> resolve;
  // How the link is secured (proto/channel_security.h); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // The name the cloud's certificate must carry, when it is not the address's host.
  std::string server_name;
  // This device's bearer token, sent on every stream ("" sends none; proto/channel_security.h).
  std::string token;
  // When set, where the token comes from (cloud_tls.token_file): read again before every
  // connection attempt, so that a rotated token is sent from the next stream on (the cloud
  // ends the streams of a token its reloaded config no longer lists). A file that cannot be
  // read then leaves the last token read in use, with a warning.
  std::string token_file;
  // When set (cloud_tls.crl_file), the CRLs a cloud's certificate is checked against once its
  // Hello has come, read again before every connection attempt (a file that cannot be read
  // then leaves the last CRLs read in use, with a warning); their CAs are in `ca_file`. A
  // revoked cloud is refused as a failed attempt (PERMISSION_DENIED).
  std::string crl_file;
  std::string ca_file;
  std::shared_ptr<const RevokedCertificates> revoked;  // as read at start-up
  // Called (on the reader thread) with the CRLs each time crl_file was read again.
  std::function<void(const RevokedCertificates&)> on_revocation_lists_read;
  double initial_backoff_s = 0.1;
  double max_backoff_s = 2.0;
  double keepalive_s = 10;  // HTTP/2 ping interval on the link (0: none)
  double keepalive_timeout_s = 20;  // see AgentConfig::Reconnect
  // The cloud's limits.max_message_bytes bounds what it accepts; the agent's own channel
  // limit must not be the tighter one.
  int64_t max_message_bytes = 1LL << 30;
  // Checks the cloud's Hello against the device bundle; an error refuses the cloud.
  std::function<absl::Status(const v1::Hello&)> check_hello;
  // Called (on the reader thread) on every connect and disconnect.
  std::function<void(bool connected)> on_state_change;
  // Called (on the reader thread) with each load the cloud reports, its Hello's included.
  std::function<void(const v1::CloudLoad&)> on_load;
  // Called (on the reader thread) with a SessionError for a session no request holds now: a
  // parked session the cloud let go (evicted, expired). Returns whether it was one the agent
  // kept (else the error is logged as a warning).
  std::function<bool(uint64_t epoch, const v1::SessionError&)> on_unclaimed_error;
  // Prompt chunks wait for the cloud's receipts (uplink_pacer.h) when the cloud sends them;
  // false: every message goes in the order it was sent (transport.pace_uplink).
  bool pace_uplink = true;
  double pacing_lead_s = 0.02;
  // The uplink's measured bytes per second (0: unknown), for the pacer; null: unknown.
  std::function<double()> measured_uplink_bytes_per_second;
  // Called (on the sender thread) with each paced prompt chunk's wait in the outbox.
  std::function<void(double seconds)> on_chunk_paced;
  // The outbox (messages sent but not yet written to the stream) holds at most this many
  // bytes and messages; past either, Send refuses with RESOURCE_EXHAUSTED (the cloud or the
  // uplink is not keeping up) and the request that sent fails. Close, Cancel and Park are
  // always taken: they give the cloud's memory back. 0: no bound.
  int64_t max_outbox_bytes = 256LL << 20;
  int64_t max_outbox_messages = 65536;
  // Where stream epochs come from: shared by the connections to several clouds, so that an
  // epoch names one stream of one cloud (a parked conversation's, a lost one's). Null: this
  // connection's own count.
  std::shared_ptr<std::atomic<uint64_t>> epochs;
  // Emulated link (link_emulator.h); all zero sends and delivers at once.
  double one_way_delay_s = 0;
  double uplink_bytes_per_second = 0;
  double downlink_bytes_per_second = 0;
};

class CloudConnection {
 public:
  explicit CloudConnection(CloudConnectionOptions options);
  ~CloudConnection();  // stops the reader thread and cancels the stream

  // Registers a session id for routing; events for it queue in the returned mailbox.
  std::shared_ptr<SessionMailbox> Register(uint64_t session_id);
  // The same with a mailbox the session already has (it moved here from another cloud).
  void Register(uint64_t session_id, std::shared_ptr<SessionMailbox> mailbox);
  void Unregister(uint64_t session_id);

  struct Connected {
    uint64_t epoch = 0;
    v1::Hello hello;
  };
  // Waits until a stream newer than `after_epoch` is up (or `deadline`): UNAVAILABLE naming
  // the last failure if not.
  absl::StatusOr<Connected> WaitConnected(std::chrono::steady_clock::time_point deadline,
                                          uint64_t after_epoch = 0);
  // True once the connection is shutting down (the agent stops): no stream will come.
  bool stopping() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stopping_;
  }

  // Queues `message` for stream `epoch`; the sender thread writes it. UNAVAILABLE if that
  // stream is gone; the owner then waits for its mailbox's disconnected event and replays. A
  // stream lost before the write drops it (and the owner replays). Prompt chunks wait for
  // the pacer; everything else goes ahead of them, except behind its own session's queued
  // chunks (a session's messages keep their order; a CancelSession drops them instead).
  // `sent`, when given, gets the time the message went onto the link.
  // UNAVAILABLE when stream `epoch` is gone (the mailbox says so too, and the request
  // replays); RESOURCE_EXHAUSTED when the outbox is full (max_outbox_bytes, _messages).
  absl::Status Send(uint64_t epoch, v1::AgentMessage message, SentStamp sent = nullptr);

  // The cloud's latest Control for this device (Hello's, or a later per-device one).
  v1::Control control();
  bool connected() const { return connected_; }
  uint64_t reconnects() const { return reconnects_; }
  const std::string& address() const { return options_.address; }

  // What new requests are placed by (scheduler/cloud_placement.h): the cloud's latest CloudLoad (Hello's,
  // then its reports), whether and on which stream it is connected, and the requests placed
  // on it since that report.
  struct LoadView {
    bool connected = false;
    uint64_t epoch = 0;
    v1::CloudLoad load;
    int64_t placed_since_report = 0;
  };
  LoadView load_view() const;
  // A request was placed here; counts until the cloud's next load report.
  void CountPlacement();

  // Ends the open stream when `revoked` lists the certificate its cloud presented (the
  // agent's reload of cloud_tls.crl_file): its requests replay elsewhere or wait, and the
  // reader thread, which reads the CRL file again before it reconnects, refuses the cloud
  // until a CRL no longer lists it. Returns the refusal when it ended one.
  std::optional<std::string> EndStreamIfRevoked(const RevokedCertificates& revoked);

 private:
  void Run();
  void Broadcast(MailboxEvent event);
  absl::Status Write(uint64_t epoch, const v1::AgentMessage& message);
  // Hands one message from stream `epoch` to its session's mailbox.
  void Route(v1::CloudMessage message, uint64_t epoch);
  // Runs `deliver` now, or when the message would arrive over the emulated downlink.
  void Downlink(size_t bytes, std::function<void()> deliver);
  // Whether the cloud's certificate (the stream's peer; none over plaintext) is one `revoked`
  // lists: the refusal naming it, else OK.
  static absl::Status CheckCloudCertificate(const std::optional<CertificateId>& certificate,
                                            const RevokedCertificates* revoked,
                                            const std::string& name);
  // The sender thread: writes the outbox, urgent first, prompt chunks as the pacer allows.
  void SendLoop();
  // Drops what is queued for stream `epoch` (gone) and forgets its unacknowledged chunks.
  void ForgetStream(uint64_t epoch);
  void Acknowledged(const v1::ChunkReceived& received, uint64_t epoch);

  const CloudConnectionOptions options_;
  std::string token_;  // the bearer token sent; only the reader thread touches it (token_file)
  // The CRLs last read (crl_file); only the reader thread touches them.
  std::shared_ptr<const RevokedCertificates> revoked_;
  // The channel to `dialed_` (options_.address, or what `resolve` last gave); used by the
  // reader thread only.
  void Dial(const std::string& address);
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CloudService::Stub> stub_;
  std::string dialed_;

  mutable std::mutex mutex_;  // guards everything below except the atomics
  std::condition_variable state_cv_;
  std::unordered_map<uint64_t, std::shared_ptr<SessionMailbox>> mailboxes_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::CloudMessage>> stream_;
  v1::Hello hello_;
  v1::CloudLoad load_;
  int64_t placed_since_report_ = 0;
  uint64_t epoch_ = 0;
  uint64_t streams_opened_ = 0;
  std::string last_error_ = "not connected yet";
  bool stopping_ = false;
  // The open stream's cloud: its name in errors and the certificate it presented (none
  // over plaintext); why it was ended, when this side ended it ("": it was not).
  std::string stream_name_;
  std::optional<CertificateId> stream_certificate_;
  std::string ended_because_;

  std::mutex write_mutex_;  // one writer at a time on the stream
  std::atomic<bool> connected_{false};
  std::atomic<uint64_t> reconnects_{0};
  std::unique_ptr<DelayLine> uplink_;    // null without link emulation
  std::unique_ptr<DelayLine> downlink_;

  struct Outgoing {
    v1::AgentMessage message;
    uint64_t epoch = 0;
    uint64_t bulk_session = 0;  // in bulk_: the session it counts under
    SentStamp sent;
    std::chrono::steady_clock::time_point queued;
    int64_t bytes = 0;  // what it counts against max_outbox_bytes
  };
  // Counts a message into or out of the outbox (outbox_mutex_ held).
  void CountOutboxLocked(const Outgoing& out, int sign);
  int64_t outbox_bytes_ = 0;     // of urgent_ and bulk_
  int64_t outbox_messages_ = 0;
  std::mutex outbox_mutex_;  // guards the outbox and the pacer
  std::condition_variable outbox_cv_;
  std::deque<Outgoing> urgent_;
  std::deque<Outgoing> bulk_;  // prompt chunks, and what must follow them in their session
  std::unordered_map<uint64_t, int> bulk_per_session_;
  UplinkPacer pacer_;
  bool pacing_ = false;  // this stream's cloud acknowledges chunks and pacing is on
  uint64_t outbox_epoch_ = 0;  // the stream the outbox writes to; 0 while there is none
  bool outbox_stopping_ = false;
  std::thread sender_;
  std::thread thread_;
};

}  // namespace tophat
