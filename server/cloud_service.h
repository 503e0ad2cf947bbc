// The gRPC face of tophat-cloud: the callback-API CloudService. Each Connect stream gets a
// reactor that forwards what it reads to the engine and writes what the engine sends, one
// write outstanding at a time. Reactor callbacks never block and never compute.
#pragma once

#include <atomic>
#include <cstdint>

#include <grpcpp/grpcpp.h>

#include "server/engine.h"
#include "tophat/v1/cloud.grpc.pb.h"

namespace tophat {

struct CloudServiceOptions {
  // Inbound payload bytes a stream may have queued in the engine before the reactor stops
  // reading from it (backpressure on an agent that sends faster than the cloud computes).
  int64_t max_inflight_bytes_per_stream = 256LL << 20;
  // Outgoing messages a stream may have queued; beyond it the agent is not reading and the
  // stream ends with RESOURCE_EXHAUSTED.
  int64_t max_queued_messages_per_stream = 4096;
};

class CloudServiceImpl final : public v1::CloudService::CallbackService {
 public:
  CloudServiceImpl(Engine* engine, CloudServiceOptions options)
      : engine_(engine), options_(options) {}

  grpc::ServerBidiReactor<v1::AgentMessage, v1::CloudMessage>* Connect(
      grpc::CallbackServerContext* context) override;

 private:
  Engine* engine_;
  CloudServiceOptions options_;
  std::atomic<StreamId> next_stream_{1};
};

}  // namespace tophat
