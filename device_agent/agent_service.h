// The app-facing gRPC service of tophat-agent (tophat.v1.AgentService). Generate runs the
// request on the gRPC handler thread: a device serves a handful of apps, and the handler
// thread is where the request's device compute happens anyway.
#pragma once

#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"

#include "device_agent/agent.h"
#include "tophat/v1/agent.grpc.pb.h"

namespace tophat {

class AgentServiceImpl final : public v1::AgentService::Service {
 public:
  // With `app_tokens` (the set may be replaced by a reload while calls run), every call but
  // Health must carry one of them (proto/channel_security.h) and each app reaches only its
  // own requests; without (an empty set), callers are one anonymous app.
  AgentServiceImpl(Agent* agent, std::shared_ptr<const BearerTokenSet> app_tokens)
      : agent_(agent), app_tokens_(std::move(app_tokens)) {}

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Cancel(grpc::ServerContext* context, const v1::CancelRequest* request,
                      v1::CancelResponse* response) override;
  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest* request,
                      v1::HealthResponse* response) override;
  grpc::Status Info(grpc::ServerContext* context, const v1::InfoRequest* request,
                    v1::InfoResponse* response) override;

 private:
  // The calling app's name, "" without app tokens; Unauthenticated for a missing or wrong token.
  absl::StatusOr<std::string> Caller(const grpc::ServerContext& context) const;
  // Generate for request.n() > 1 choices (device_agent/choices.h): their messages interleaved
  // on the one stream, each naming its choice, each choice's last message as it ends.
  grpc::Status GenerateChoices(grpc::ServerContext& context, const v1::GenerateRequest& request,
                               const std::string& caller,
                               grpc::ServerWriter<v1::GenerateResponse>& writer);

  Agent* agent_;
  const std::shared_ptr<const BearerTokenSet> app_tokens_;  // never null
};

}  // namespace tophat
