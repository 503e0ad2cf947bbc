// The app-facing gRPC service of tophat-agent (tophat.v1.AgentService). Generate runs the
// request on the gRPC handler thread: a device serves a handful of apps, and the handler
// thread is where the request's device compute happens anyway.
#pragma once

#include <grpcpp/grpcpp.h>

#include "device_agent/agent.h"
#include "tophat/v1/agent.grpc.pb.h"

namespace tophat {

class AgentServiceImpl final : public v1::AgentService::Service {
 public:
  explicit AgentServiceImpl(Agent* agent) : agent_(agent) {}

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Cancel(grpc::ServerContext* context, const v1::CancelRequest* request,
                      v1::CancelResponse* response) override;
  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest* request,
                      v1::HealthResponse* response) override;
  grpc::Status Info(grpc::ServerContext* context, const v1::InfoRequest* request,
                    v1::InfoResponse* response) override;

 private:
  Agent* agent_;
};

}  // namespace tophat
