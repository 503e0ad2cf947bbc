#include "device_agent/agent_service.h"

#include <spdlog/spdlog.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "device_agent/choices.h"
#include "device_agent/openai_request.h"
#include "proto/channel_security.h"
#include "proto/grpc_status.h"

namespace tophat {
namespace {

void ToProto(const TokenLogprob& logprob, v1::TokenLogprobs& entry) {
  entry.set_logprob(logprob.logprob);
  for (int32_t id : logprob.top_ids) entry.add_top_ids(static_cast<uint32_t>(id));
  for (float value : logprob.top_logprobs) entry.add_top_logprobs(value);
}

// A streamed message of tokens (and their log-probabilities) as they come.
v1::GenerateResponse ResponseOf(const TokenEvent& event) {
  v1::GenerateResponse response;
  response.set_request_id(event.request_id);
  for (int32_t id : event.token_ids) response.add_token_ids(static_cast<uint32_t>(id));
  response.set_text(event.text);
  for (const TokenLogprob& logprob : event.logprobs) ToProto(logprob, *response.add_logprobs());
  for (const TokenLogprob& logprob : event.prompt_logprobs) {
    ToProto(logprob, *response.add_prompt_logprobs());
  }
  return response;
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
  if (request->n() > 1) return GenerateChoices(*context, *request, *caller, *writer);
  v1::GenerateResponse final_response = agent_->Generate(
      *request,
      [&](const TokenEvent& event) {
        if (context->IsCancelled()) return false;
        return writer->Write(ResponseOf(event));
      },
      *caller, [context] { return context->IsCancelled(); });
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  writer->Write(final_response);
  return grpc::Status::OK;
}

grpc::Status AgentServiceImpl::GenerateChoices(grpc::ServerContext& context,
                                               const v1::GenerateRequest& request,
                                               const std::string& caller,
                                               grpc::ServerWriter<v1::GenerateResponse>& writer) {
  const int64_t n = request.n();
  if (n > kMaxOpenAiChoices) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("n: ", n, " choices, more than the ", kMaxOpenAiChoices, " allowed"));
  }
  if (request.outline().enabled()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "n: above 1 cannot be combined with outline");
  }
  const std::vector<ChoicePlan> choices = ChoicesOf(
      request, n, request.request_id().empty() ? agent_->NewRequestId() : request.request_id());
  const auto gone = [&context] { return context.IsCancelled(); };
  const KeptPrompts kept = KeepPrompts(*agent_, choices, n, 1, caller, gone);
  // The choices' threads share the one stream: a write at a time, and once one fails (the app
  // went away) every choice stops.
  std::mutex write_mutex;
  bool writable = true;
  const auto write = [&](v1::GenerateResponse& response, int64_t j) {
    response.set_choice(static_cast<uint32_t>(j));
    const std::lock_guard<std::mutex> lock(write_mutex);
    writable = writable && !context.IsCancelled() && writer.Write(response);
    return writable;
  };
  RunEach(n, n, [&](int64_t j) {
    v1::GenerateResponse done = GenerateChoice(
        *agent_, kept, choices[j],
        [&](const TokenEvent& event) {
          v1::GenerateResponse response = ResponseOf(event);
          return write(response, j);
        },
        caller, gone);
    // Cached tokens are the prompt's, before this request (ForgetKeptPrompts's rule): what
    // computing the kept prompt reused, on the first choice; the others count what they took
    // from it.
    if (j == 0 && kept[0]) {
      done.mutable_stats()->set_reused_prompt_tokens(
          static_cast<uint32_t>(kept[0]->reused_prompt_tokens));
    }
    write(done, j);
  });
  if (kept[0]) agent_->ForgetKeptPrompt(*kept[0]);
  if (context.IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
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
