#include "device_agent/agent_service.h"

namespace tophat {

grpc::Status AgentServiceImpl::Generate(grpc::ServerContext* context,
                                        const v1::GenerateRequest* request,
                                        grpc::ServerWriter<v1::GenerateResponse>* writer) {
  v1::GenerateResponse final_response = agent_->Generate(
      *request, [&](const TokenEvent& event) {
        if (context->IsCancelled()) return false;
        v1::GenerateResponse response;
        response.set_request_id(event.request_id);
        for (int32_t id : event.token_ids) response.add_token_ids(static_cast<uint32_t>(id));
        response.set_text(event.text);
        return writer->Write(response);
      });
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  writer->Write(final_response);
  return grpc::Status::OK;
}

grpc::Status AgentServiceImpl::Cancel(grpc::ServerContext*, const v1::CancelRequest* request,
                                      v1::CancelResponse* response) {
  if (request->request_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request_id: empty");
  }
  response->set_found(agent_->Cancel(request->request_id()));
  return grpc::Status::OK;
}

grpc::Status AgentServiceImpl::Health(grpc::ServerContext*, const v1::HealthRequest*,
                                      v1::HealthResponse* response) {
  *response = agent_->Health();
  return grpc::Status::OK;
}

grpc::Status AgentServiceImpl::Info(grpc::ServerContext*, const v1::InfoRequest*,
                                    v1::InfoResponse* response) {
  *response = agent_->Info();
  return grpc::Status::OK;
}

}  // namespace tophat
