// The gRPC face of tophat-cloud: the callback-API CloudService. Each Connect stream gets a
// reactor that forwards what it reads to the engine and writes what the engine sends, one
// write outstanding at a time. Reactor callbacks never block and never compute.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/log_rate.h"
#include "base/token_bucket.h"
#include "configs/bearer_tokens.h"
#include "proto/certificate_revocation.h"
#include "server/cloud_metrics.h"
#include "server/engine.h"
#include "tophat/v1/cloud.grpc.pb.h"

namespace tophat {

// Who may hold a stream on the agents' port.
struct DeviceAccess {
  // tls.device_tokens: when set, a stream without one of these bearer tokens is refused with
  // UNAUTHENTICATED, and the token names the device (it must agree with a certificate's name).
  std::vector<BearerToken> device_tokens;
  // tls.revoked_devices: refused with PERMISSION_DENIED, whatever they present.
  std::vector<std::string> revoked_devices;
  // tls.crl_file: certificates refused with PERMISSION_DENIED (null: no CRL).
  std::shared_ptr<const RevokedCertificates> revoked_certificates;
};

// What a stream presented: the name its certificate gives ("" without one: plaintext), which
// certificate that is, and the SHA-256 of its bearer token (an error saying what is wrong
// when it carried none, or not as "Bearer <token>"). Kept for the stream's life, so that a
// reload can check it again.
struct PresentedCredentials {
  std::string certified;
  std::optional<CertificateId> certificate;
  absl::StatusOr<std::string> token_digest =
      absl::UnauthenticatedError("no bearer token (authorization metadata) on the call");
};

// The device a stream is under `access`: its certificate's name, or its token's when
// device_tokens is set (both, and they must agree, when there are both); "" for a plaintext
// stream without tokens (each such stream is its own device). UNAUTHENTICATED for a missing,
// unknown or another device's token, PERMISSION_DENIED for a revoked device or certificate.
absl::StatusOr<std::string> AdmitDevice(const DeviceAccess& access,
                                        const PresentedCredentials& presented);

struct CloudServiceOptions {
  // What a stream's messages may hold in the engine (IntakeBytes) before the reactor stops
  // reading from it (backpressure on an agent that sends faster than the cloud computes;
  // limits.max_inflight_bytes_per_stream).
  int64_t max_inflight_bytes_per_stream = 256LL << 20;
  // Bytes of outgoing messages one stream may have queued behind the one gRPC is writing
  // (limits.max_queued_bytes_per_stream). Beyond it the stream is congested: the engine
  // computes none of its work until the agent has read the queue down to half, so a slow
  // link waits instead of failing. A congested stream that takes nothing for
  // unread_timeout_s is not reading: its sessions are freed and it ends with
  // RESOURCE_EXHAUSTED. Twice the bound ends it at once (memory, whatever the cause).
  int64_t max_queued_bytes_per_stream = 64LL << 20;
  // The same over all streams (limits.max_queued_bytes_total). When a message would pass
  // it, its stream is congested if it holds more than an equal share (total / streams); a
  // stream that reads what it is sent stays below its share and is never held by another.
  int64_t max_queued_bytes_total = 1LL << 30;
  // limits.unread_stream_timeout_s: how long a congested stream may take no result before it
  // is ended; and how long an ended stream whose last write the agent still does not take has
  // before its call is cancelled outright (HTTP/2 cannot send the status behind unread data).
  double unread_timeout_s = 10;
  // Messages one device (all its streams) may send per second, with bursts of as many
  // (limits.max_messages_per_second_per_device; 0: no limit). Above it the cloud reads its
  // streams more slowly, so HTTP/2 flow control holds the device back: nothing fails, and
  // its flood does not crowd the engine's intake.
  double max_messages_per_second_per_device = 5000;
  // Sessions refused for want of room (RESOURCE_EXHAUSTED: a per-device quota, KV, the
  // waiting list) one device is told of per second, with bursts of as many
  // (limits.max_refusals_per_second_per_device; 0: no limit, and none with the message limit
  // at 0). Past it a refusal is sent late, and the session's later messages wait behind it.
  // A device that asks again the moment it is refused, thousands of times a second, is
  // slowed to this rate without holding back its admitted sessions' chunks; its refusals no
  // longer take CPU from the cloud and the other devices.
  double max_refusals_per_second_per_device = 20;
  // Who may hold a stream (DeviceAccess); UpdateAccess replaces it while streams run.
  DeviceAccess access;
  CloudMetrics* metrics = nullptr;  // optional
};

// Per-device token buckets for max_messages_per_second_per_device and
// max_refusals_per_second_per_device. Thread-safe.
class DevicePacer {
 public:
  // `per_second` messages (0: no limit) and `refusals_per_second` refused sessions (0: no
  // limit; none either while messages have no limit).
  DevicePacer(double per_second, double refusals_per_second)
      : per_second_(per_second), refusals_per_second_(refusals_per_second) {}
  void Register(const std::string& device);
  void Unregister(const std::string& device);
  // How long the device's next message should wait (zero: none).
  TokenBucket::Clock::duration Take(const std::string& device);
  // How long the device's next refusal should wait before it is sent (zero: none).
  TokenBucket::Clock::duration TakeRefusal(const std::string& device);
  // New rates (a config reload), for the devices connected now too: each keeps what its
  // bucket holds (at most the new burst) and what it owes, and refills at the new rate.
  void SetRates(double per_second, double refusals_per_second);

 private:
  struct Device {
    std::optional<TokenBucket> messages;  // none: messages are not paced
    std::optional<TokenBucket> refusals;  // none: refusals are not paced
    int streams = 0;
  };
  // Device's buckets made or changed to the rates (the lock held).
  void Fit(Device& device, TokenBucket::Clock::time_point now);

  double per_second_;           // under mutex_
  double refusals_per_second_;  // under mutex_
  std::mutex mutex_;
  std::unordered_map<std::string, Device> devices_;
};

// What all streams have queued together, shared by their channels (which the engine may
// hold a little longer than the service exists).
struct OutgoingTotals {
  std::atomic<int64_t> queued_bytes{0};
  std::atomic<int64_t> streams{0};
};

// The access rules and the streams open under them, with what each presented. A stream is
// admitted outside the lock, against the rules as they were when it asked (a snapshot), and
// registered under it; a reload in between is caught at registration by the rules'
// generation. Thread-safe.
class OpenStreams {
 public:
  using End = std::function<void(grpc::Status)>;
  struct Ending {
    StreamId id;
    std::string device;
    grpc::Status status;
    End end;
  };
  struct Admission {
    absl::StatusOr<std::string> device;
    uint64_t generation = 0;  // of the rules it was admitted by
  };

  explicit OpenStreams(DeviceAccess rules);

  Admission Admit(const PresentedCredentials& presented);
  // Adds a stream admitted as `device` by the rules of `generation`, unless they changed since
  // and no longer admit it as that device: then the refusal, and nothing is added. `end` ends
  // the stream with a status (its channel's End).
  absl::Status Register(StreamId id, PresentedCredentials presented, const std::string& device,
                        uint64_t generation, End end);
  void Unregister(StreamId id);
  // New rules; returns the open streams they no longer admit, forgotten here, to be ended by
  // the caller outside the lock (ending one may finish its call inline, whose OnDone
  // unregisters it). The open streams are checked against an index of the tokens, not in
  // constant time over all of them: 10,000 streams against 10,000 tokens would otherwise be
  // 10^8 comparisons under the lock that new streams wait on.
  std::vector<Ending> Replace(DeviceAccess rules);
  size_t size() const;

 private:
  struct Open {
    PresentedCredentials presented;
    std::string device;
    End end;
  };
  // The token name of each digest.
  using TokenIndex = std::unordered_map<std::string, std::string>;
  static TokenIndex Index(const DeviceAccess& access);
  // Whether the rules still admit `presented` as `device` (a token may now name another).
  absl::Status Still(const PresentedCredentials& presented, const std::string& device,
                     const TokenIndex& index) const;

  mutable std::mutex mutex_;
  std::shared_ptr<const DeviceAccess> access_;  // replaced whole, never changed
  uint64_t generation_ = 0;                     // bumped by every Replace
  std::unordered_map<StreamId, Open> streams_;
};

// Connect is registered raw (ByteBuffer in and out) so that a message the agent sent that is
// not an AgentMessage can be told from the agent half-closing its stream: gRPC's typed
// callback API reports both as a failed read, and would end the stream with OK. The reactor
// parses and serializes exactly as gRPC's generated code does.
class CloudServiceImpl final
    : public v1::CloudService::WithRawCallbackMethod_Connect<v1::CloudService::Service> {
 public:
  CloudServiceImpl(Engine* engine, CloudServiceOptions options)
      : engine_(engine),
        options_(options),
        totals_(std::make_shared<OutgoingTotals>()),
        pacer_(std::make_shared<DevicePacer>(options.max_messages_per_second_per_device,
                                             options.max_refusals_per_second_per_device)),
        open_(std::make_shared<OpenStreams>(options.access)) {
    ReportAccess(options.access);
    // The rules live in open_ alone: every stream keeps a copy of options_, which must not
    // carry the device tokens (10,000 streams x 10,000 tokens would be gigabytes).
    options_.access = {};
  }

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Connect(
      grpc::CallbackServerContext* context) override;

  // Bytes of results queued for agents and not yet handed to gRPC, all streams.
  int64_t outgoing_queued_bytes() const { return totals_->queued_bytes.load(); }

  // Replaces who may hold a stream (a config reload), for new streams and open ones alike:
  // an open stream that `access` no longer admits is ended with the refusal it would get
  // now (its sessions' KV freed at once), and the rest go on untouched. Returns how many
  // were ended. Thread-safe.
  int UpdateAccess(DeviceAccess access);
  // New per-device message and refusal rates (limits.max_messages_per_second_per_device,
  // max_refusals_per_second_per_device; 0: no limit), for connected devices too.
  void UpdateRates(double messages_per_second, double refusals_per_second) {
    pacer_->SetRates(messages_per_second, refusals_per_second);
  }

 private:
  // The access rules' gauges (the CRL's).
  void ReportAccess(const DeviceAccess& access);

  Engine* engine_;
  std::mutex refusal_log_mutex_;
  LogRate refusal_log_{5};  // refused streams' warnings
  CloudServiceOptions options_;
  std::shared_ptr<OutgoingTotals> totals_;
  std::shared_ptr<DevicePacer> pacer_;
  std::atomic<StreamId> next_stream_{1};
  // The access rules and the streams open under them; shared with the reactors, which leave
  // it when their calls are done.
  std::shared_ptr<OpenStreams> open_;
};

}  // namespace tophat
