#include "device_agent/agent_service.h"

#include <spdlog/spdlog.h>

#include "proto/channel_security.h"
#include "proto/grpc_status.h"

namespace tophat {
namespace {

void ToProto(const TokenLogprob& logprob, v1::TokenLogprobs& entry) {
  entry.set_logprob(logprob.logprob);
  for (int32_t id : logprob.top_ids) entry.add_top_ids(static_cast<uint32_t>(id));
  for (float value : logprob.top_logprobs) entry.add_top_logprobs(value);
}

}  // namespace

absl::StatusOr<std::string> AgentServiceImpl::Caller(const grpc::ServerContext& context) const {
  const std::shared_ptr<const std::vector<BearerToken>> tokens = app_tokens_->Get();
  if (tokens->empty()) return std::string();
  auto caller = AuthenticateBearer(context, *tokens);
  if (!caller.ok()) spdlog::warn("app call from {} refused: {}", context.peer(), std::string(caller.status().message()));
  return caller;
}

grpc::Status AgentServiceImpl::Generate(grpc::ServerContext* context,
                                        const v1::GenerateRequest* request,
                                        grpc::ServerWriter<v1::GenerateResponse>* writer) {
  auto caller = Caller(*context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  v1::GenerateResponse final_response = agent_->Generate(
      *request,
      [&](const TokenEvent& event) {
        if (context->IsCancelled()) return false;
        v1::GenerateResponse response;
        response.set_request_id(event.request_id);
        for (int32_t id : event.token_ids) response.add_token_ids(static_cast<uint32_t>(id));
        response.set_text(event.text);
        for (const TokenLogprob& logprob : event.logprobs) {
          ToProto(logprob, *response.add_logprobs());
        }
        for (const TokenLogprob& logprob : event.prompt_logprobs) {
          ToProto(logprob, *response.add_prompt_logprobs());
        }
        return writer->Write(response);
      },
      *caller, [context] { return context->IsCancelled(); });
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  writer->Write(final_response);
  return grpc::Status::OK;
}

grpc::Status AgentServiceImpl::Cancel(grpc::ServerContext* context, const v1::CancelRequest* request,
                                      v1::CancelResponse* response) {
  auto caller = Caller(*context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (request->request_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request_id: empty");
  }
  response->set_found(agent_->Cancel(request->request_id(), *caller));
  return grpc::Status::OK;
}

// Open to every caller: a liveness probe carries no token, and Health tells nothing about
// any request or file.
grpc::Status AgentServiceImpl::Health(grpc::ServerContext*, const v1::HealthRequest*,
                                      v1::HealthResponse* response) {
  *response = agent_->Health();
  return grpc::Status::OK;
}

grpc::Status AgentServiceImpl::Info(grpc::ServerContext* context, const v1::InfoRequest*,
                                    v1::InfoResponse* response) {
  auto caller = Caller(*context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  *response = agent_->Info();
  return grpc::Status::OK;
}

}  // namespace tophat
