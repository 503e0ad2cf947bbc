#include "sdk/client.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace tophat {
namespace {

absl::Status FromGrpc(const grpc::Status& status, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

}  // namespace

double GenerateResult::mean_inter_token_seconds() const {
  if (token_arrival_seconds.size() < 2) return 0.0;
  return (token_arrival_seconds.back() - token_arrival_seconds.front()) /
         static_cast<double>(token_arrival_seconds.size() - 1);
}

Client::Client(std::shared_ptr<grpc::Channel> channel, std::string token)
    : channel_(std::move(channel)), token_(std::move(token)),
      stub_(v1::AgentService::NewStub(channel_)) {}

void Client::Prepare(grpc::ClientContext& context) const {
  // Must match proto/channel_security.h's kAuthorizationMetadata and BearerMetadataValue;
  // the SDK stays free of the daemons' libraries.
  if (!token_.empty()) context.AddMetadata("authorization", "Bearer " + token_);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& address,
                                                        double timeout_s) {
  return Connect(address, ClientOptions{.timeout_s = timeout_s});
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& address,
                                                        const ClientOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments arguments;
  if (!options.ca_file.empty()) {
    std::ifstream in(options.ca_file);
    if (!in) return absl::NotFoundError(absl::StrCat("ca_file: cannot read ", options.ca_file));
    const std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (pem.find("-----BEGIN ") == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("ca_file: ", options.ca_file, " is not PEM (no -----BEGIN line)"));
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = pem;
    credentials = grpc::SslCredentials(ssl);
    if (!options.server_name.empty()) {
      arguments.SetSslTargetNameOverride(options.server_name);
    }
  }
  auto channel = grpc::CreateCustomChannel(address, credentials, arguments);
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000));
  if (!channel->WaitForConnected(deadline)) {
    return absl::UnavailableError(absl::StrCat("no tophat-agent answered at ", address, " within ",
                                               options.timeout_s, "s",
                                               options.ca_file.empty()
                                                   ? ""
                                                   : " (over TLS: is the agent's app_tls set, and "
                                                     "signed by ca_file?)"));
  }
  return std::unique_ptr<Client>(new Client(std::move(channel), options.token));
}

namespace {

// Adds a streamed message, which arrived `at` seconds into the call, to its choice's result.
void Accumulate(const v1::GenerateResponse& response, double at, GenerateResult& result) {
  if (!response.request_id().empty()) result.request_id = response.request_id();
  for (uint32_t id : response.token_ids()) {
    result.token_ids.push_back(id);
    result.token_arrival_seconds.push_back(at);
  }
  result.text += response.text();
  result.logprobs.insert(result.logprobs.end(), response.logprobs().begin(),
                         response.logprobs().end());
  result.prompt_logprobs.insert(result.prompt_logprobs.end(), response.prompt_logprobs().begin(),
                                response.prompt_logprobs().end());
  if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    result.finish_reason = response.finish_reason();
    result.error = response.error();
    result.stats = response.stats();
  }
}

}  // namespace

absl::StatusOr<GenerateResult> Client::Generate(
    const v1::GenerateRequest& request,
    const std::function<void(const v1::GenerateResponse&)>& on_update) {
  if (request.n() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Generate: n is ", request.n(), "; GenerateChoices returns each choice"));
  }
  absl::StatusOr<std::vector<GenerateResult>> results = GenerateChoices(request, on_update);
  if (!results.ok()) return results.status();
  return std::move(results->front());
}

absl::StatusOr<std::vector<GenerateResult>> Client::GenerateChoices(
    const v1::GenerateRequest& request,
    const std::function<void(const v1::GenerateResponse&)>& on_update) {
  grpc::ClientContext context;
  Prepare(context);
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub_->Generate(&context, request);
  std::vector<GenerateResult> results(std::max<uint32_t>(1, request.n()));
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    const double at =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (response.choice() >= results.size()) {
      context.TryCancel();
      reader->Finish();
      return absl::InternalError(absl::StrCat("Generate: the agent sent choice ", response.choice(),
                                              " of ", results.size()));
    }
    Accumulate(response, at, results[response.choice()]);
    if (on_update) on_update(response);
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpc(status, "Generate");
  for (size_t j = 0; j < results.size(); ++j) {
    if (results[j].finish_reason == v1::FINISH_REASON_UNSPECIFIED) {
      return absl::InternalError(
          absl::StrCat("Generate: the agent ended the stream without ",
                       results.size() > 1 ? absl::StrCat("choice ", j, "'s ") : std::string("a "),
                       "finish reason"));
    }
  }
  return results;
}

absl::StatusOr<bool> Client::Cancel(const std::string& request_id) {
  grpc::ClientContext context;
  Prepare(context);
  v1::CancelRequest request;
  request.set_request_id(request_id);
  v1::CancelResponse response;
  grpc::Status status = stub_->Cancel(&context, request, &response);
  if (!status.ok()) return FromGrpc(status, "Cancel");
  return response.found();
}

absl::StatusOr<v1::HealthResponse> Client::Health() {
  grpc::ClientContext context;
  Prepare(context);
  v1::HealthResponse response;
  grpc::Status status = stub_->Health(&context, v1::HealthRequest(), &response);
  if (!status.ok()) return FromGrpc(status, "Health");
  return response;
}

absl::StatusOr<v1::InfoResponse> Client::Info() {
  grpc::ClientContext context;
  Prepare(context);
  v1::InfoResponse response;
  grpc::Status status = stub_->Info(&context, v1::InfoRequest(), &response);
  if (!status.ok()) return FromGrpc(status, "Info");
  return response;
}

}  // namespace tophat
