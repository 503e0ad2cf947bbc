// tophat::Client: the C++ SDK apps use to reach their local tophat-agent. Depends only on
// gRPC and the generated protocol (no LibTorch), so apps stay small.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tophat/v1/agent.grpc.pb.h"

namespace tophat {

struct GenerateResult {
  std::string request_id;
  std::vector<uint32_t> token_ids;
  std::string text;
  // With GenerateRequest.logprobs: one per token_ids entry.
  std::vector<v1::TokenLogprobs> logprobs;
  // With GenerateRequest.prompt_logprobs: one per prompt token after the first.
  std::vector<v1::TokenLogprobs> prompt_logprobs;
  v1::FinishReason finish_reason = v1::FINISH_REASON_UNSPECIFIED;
  std::string error;     // with FINISH_REASON_ERROR
  v1::RequestStats stats;  // measured by the agent
  // Measured here, from the call's start: when each token arrived.
  std::vector<double> token_arrival_seconds;

  bool ok() const { return finish_reason != v1::FINISH_REASON_ERROR; }
  double time_to_first_token_seconds() const {
    return token_arrival_seconds.empty() ? 0.0 : token_arrival_seconds.front();
  }
  double mean_inter_token_seconds() const;
};

// How to reach an agent whose app port has TLS and tokens (agent config `app_tls`,
// `app_tokens`); the defaults suit a local agent on plaintext loopback or a unix: socket.
struct ClientOptions {
  double timeout_s = 10;  // how long Connect waits for the agent to come up
  std::string token;      // this app's bearer token, sent on every call ("" sends none)
  std::string ca_file;    // PEM of the CA that signed the agent's certificate: TLS when set
  std::string server_name;  // the name the agent's certificate must carry; "": address's host
};

class Client {
 public:
  // Connects to the agent at `address`, waiting up to `timeout_s` for it to come up.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& address,
                                                         double timeout_s = 10);
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& address,
                                                         const ClientOptions& options);

  // Runs one request. `on_update` sees every streamed message (tokens and text as they come).
  // Transport failures are an error status; a request the agent failed is a result with
  // finish_reason FINISH_REASON_ERROR and `error` set.
  absl::StatusOr<GenerateResult> Generate(
      const v1::GenerateRequest& request,
      const std::function<void(const v1::GenerateResponse&)>& on_update = {});
  // Runs one request of request.n() choices (GenerateRequest.n: the prompt computed once,
  // each choice forking it): result j is choice j's, as Generate returns one. `on_update`
  // sees every streamed message, whose `choice` names its choice. Generate refuses n above 1.
  absl::StatusOr<std::vector<GenerateResult>> GenerateChoices(
      const v1::GenerateRequest& request,
      const std::function<void(const v1::GenerateResponse&)>& on_update = {});

  absl::StatusOr<bool> Cancel(const std::string& request_id);
  absl::StatusOr<v1::HealthResponse> Health();
  absl::StatusOr<v1::InfoResponse> Info();

 private:
  Client(std::shared_ptr<grpc::Channel> channel, std::string token);
  // A context carrying the token, if any.
  void Prepare(grpc::ClientContext& context) const;
  std::shared_ptr<grpc::Channel> channel_;
  const std::string token_;
  std::unique_ptr<v1::AgentService::Stub> stub_;
};

}  // namespace tophat
