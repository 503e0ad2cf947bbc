// Where the engine sends a stream's outgoing messages. The gRPC reactor implements it
// (server/cloud_service.cc); benchmarks use a sink that just counts.
#pragma once

#include "absl/status/status.h"
#include "tophat/v1/cloud.pb.h"

namespace tophat {

// What one message from an agent counts against its stream's intake bound
// (limits.max_inflight_bytes_per_stream) from the moment it is read until the engine is done
// with it: a forward chunk its payload (held until computed) plus this, any other message
// this alone (its event in the engine's intake, a Truncate's marker behind pending chunks).
// So a stream can have at most max_inflight_bytes_per_stream / 1 KiB messages in the engine,
// whatever kind they are: the bound is on messages as well as bytes.
inline constexpr int64_t kIntakeMessageBytes = 1024;

inline int64_t IntakeBytes(const v1::AgentMessage& message) {
  return kIntakeMessageBytes +
         (message.has_forward() ? static_cast<int64_t>(message.forward().states().data().size())
                                : 0);
}

class MessageSink {
 public:
  virtual ~MessageSink() = default;
  // Queues a message for the stream. Never blocks; drops it if the stream is gone.
  virtual void Send(v1::CloudMessage message) = 0;
  // Ends the whole stream with `status` after the queued messages are written.
  virtual void Finish(const absl::Status& status) = 0;
  // The engine finished with inbound messages that counted `bytes` (IntakeBytes; flow
  // control).
  virtual void Consumed(int64_t bytes) = 0;
  // True while the stream holds more unread results than its bound: the engine computes
  // none of its work until the agent has read them down (flow control toward a slow
  // reader: its requests wait, they do not fail). Read from the engine thread.
  virtual bool Congested() const { return false; }
};

}  // namespace tophat
