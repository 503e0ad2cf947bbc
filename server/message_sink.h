// Where the engine sends a stream's outgoing messages. The gRPC reactor implements it
// (server/cloud_service.cc); benchmarks use a sink that just counts.
#pragma once

#include "absl/status/status.h"
#include "tophat/v1/cloud.pb.h"

namespace tophat {

class MessageSink {
 public:
  virtual ~MessageSink() = default;
  // Queues a message for the stream. Never blocks; drops it if the stream is gone.
  virtual void Send(v1::CloudMessage message) = 0;
  // Ends the whole stream with `status` after the queued messages are written.
  virtual void Finish(const absl::Status& status) = 0;
  // The engine finished with an inbound message of `bytes` bytes (flow control).
  virtual void Consumed(int64_t bytes) = 0;
  // True while the stream holds more unread results than its bound: the engine computes
  // none of its work until the agent has read them down (flow control toward a slow
  // reader: its requests wait, they do not fail). Read from the engine thread.
  virtual bool Congested() const { return false; }
};

}  // namespace tophat
