// tophat-agent's local OpenAI-compatible HTTP endpoint (cpp-httplib), for the apps, scripts
// and UIs that speak the OpenAI API rather than the SDK:
//   POST /v1/chat/completions   messages rendered with the model's chat template
//   POST /v1/completions        a text prompt
//   POST /v1/responses          OpenAI's Responses API: a chat completion in another shape,
//                               kept for later turns (GET and DELETE /v1/responses/{id}),
//                               or generated in the background (polled, or its stream
//                               followed and resumed; POST /v1/responses/{id}/cancel)
//   /v1/conversations           OpenAI's Conversations API: conversations kept as items,
//                               which a response made with `conversation` continues
//   GET  /v1/models             the one model this agent serves
//   GET  /health                200 while the cloud is connected, else 503
// Streaming answers are server-sent events (`data: {...}` chunks, then `data: [DONE]`).
// Request bodies are checked by ParseOpenAiRequest (openai_request.h); each request runs
// through Agent::Generate on its HTTP handler thread, as the gRPC app API does. A client that
// goes away mid-stream cancels its request (the cloud frees its KV). docs/openai.md.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "configs/bearer_tokens.h"
#include "device_agent/agent.h"
#include "device_agent/kept_files.h"
#include "device_agent/openai_conversations.h"
#include "device_agent/openai_request.h"
#include "device_agent/openai_responses.h"
#include "models/tokenizers/chat_template.h"
#include "models/tokenizers/harmony.h"
#include "telemetry/http_request_deadline.h"

namespace httplib {
class Server;
struct Response;
}
namespace prometheus {
class Counter;
class Gauge;
class Registry;
}  // namespace prometheus

namespace tophat {

struct BackgroundResponses;  // openai_server.cc

struct OpenAiServerOptions {
  std::string address;     // host:port; port 0 picks a free one
  std::string model_name;  // "" : the agent's model id (Agent::Info)
  // Where the chat template comes from (tokenizer_config.json); empty: the endpoint serves
  // /v1/completions only and answers chat requests with an error saying why.
  std::filesystem::path template_dir;
  // With tokens, every call but /health needs `Authorization: Bearer <token>` (the app
  // tokens of the gRPC app port, the same set, which a reload may replace) and runs as that
  // app. Null or empty: no tokens.
  std::shared_ptr<const BearerTokenSet> app_tokens;
  // Completions running at once through this endpoint; one more is refused at once with 429
  // (OpenAI's error shape, Retry-After), never queued out of sight. The agent's
  // max_concurrent_requests.
  int64_t max_concurrent_requests = 16;
  // Largest request body read, checked against Content-Length before reading it (and while
  // reading a chunked body): 413 past it. The agent's max_prompt_bytes x 2 + 64 KiB (JSON
  // escaping and the messages' framing) by default.
  int64_t max_body_bytes = (2 << 20) + (64 << 10);
  // A connection that sends nothing for this long is closed (httplib's per-read timeout);
  // an idle keep-alive connection likewise.
  int idle_timeout_s = 5;
  // A connection whose whole request (headers and body) has not arrived this long after it
  // opened, or after its previous answer, is closed: a client that sends a byte a second
  // never trips the per-read timeout, and would hold a worker for as long as it liked
  // (openai.request_deadline_s).
  double request_deadline_s = 10;
  // The most bytes of /v1/responses answers kept for later turns (previous_response_id),
  // with their conversations; the least recently used are forgotten past it. 0 keeps none
  // (openai.max_stored_response_bytes).
  int64_t max_stored_response_bytes = 64 << 20;
  // A folder the kept responses and conversations are also written to, one file each, so
  // that the next process takes them back (made 0700 when missing); "": memory only
  // (openai.store_dir).
  std::string store_dir;
  // Written at the end of a thinking model's reasoning when a request's thinking_token_budget
  // is spent, before "</think>" (Qwen's model cards suggest "Considering the limited time by
  // the user, I have to give the solution based on the thinking directly now.\n"; llama.cpp's
  // reasoning budget message): the model answers after a sentence that says why it stopped
  // rather than mid-thought. Tokenized once, at the start; "": "</think>" alone
  // (openai.thinking_budget_message).
  std::string thinking_budget_message;
  // The thinking_token_budget each OpenAI reasoning effort stands for (reasoning_effort,
  // reasoning.effort); -1: no bound. An effort not here is refused, naming the config key
  // (openai.reasoning_effort_budgets).
  std::map<std::string, int64_t, std::less<>> reasoning_effort_budgets = {
      {"none", 0}, {"high", -1}, {"xhigh", -1}};
  // Where the kept responses' gauges go (tophat_openai_stored_responses, ..._bytes and
  // ..._forgotten_total); null: none.
  prometheus::Registry* registry = nullptr;
};

class OpenAiServer {
 public:
  // `agent` outlives the server. Errors name the address (in use, not local) or the template.
  static absl::StatusOr<std::unique_ptr<OpenAiServer>> Start(Agent* agent,
                                                             OpenAiServerOptions options);
  ~OpenAiServer();  // stops listening; requests in flight finish or see their client gone

  int port() const { return port_; }
  const std::string& model_name() const { return options_.model_name; }

 private:
  OpenAiServer(Agent* agent, OpenAiServerOptions options);
  void Route();
  // A chat's messages rendered with the model's template and encoded: a chat completion's
  // prompt; or the error object (400 without a template or for messages it refuses).
  // `tools`: each tool's JSON as the app sent it.
  std::variant<std::vector<int32_t>, OpenAiError> ChatPromptIds(
      const std::vector<ChatMessage>& messages, std::span<const std::string> tools = {},
      const ChatRenderOptions& options = {}) const;
  // Answers with a background response's events from index `next` on, as server-sent events,
  // and those still to come until its log closes, the client goes or the server stops.
  void FollowEvents(httplib::Response& res, std::shared_ptr<const ResponseEventLog> events,
                    size_t next) const;

  Agent* agent_;
  OpenAiServerOptions options_;
  std::optional<ChatTemplate> chat_template_;
  // The template is gpt-oss's: its control tokens, for reading answers (HarmonyReader); the
  // tokens before the <|message|> that opens its final channel ("<|channel|>final"), after
  // which a format holds; and those that end a message of reasoning and start the next
  // ("<|end|><|start|>assistant"), which a spent thinking budget forces before them.
  std::optional<HarmonyTokens> harmony_tokens_;
  std::vector<uint32_t> harmony_final_prefix_;
  std::vector<uint32_t> harmony_reasoning_end_;
  // options_.thinking_budget_message's token ids (GenerateRequest.reasoning_budget_end_ids).
  std::vector<uint32_t> thinking_budget_end_ids_;
  std::string chat_template_error_;  // why chat is unavailable, when it is
  std::unique_ptr<HttpRequestDeadline> request_deadline_;  // outlives server_'s handlers
  // openai.store_dir held for this process (null: memory only). Declared first of the
  // stores so that it is let go after them.
  std::unique_ptr<FolderLock> store_lock_;
  std::unique_ptr<ResponseStore> responses_;               // outlives server_'s handlers
  std::unique_ptr<ConversationStore> conversations_;       // outlives server_'s handlers
  // /v1/responses with background: true, generating on threads of their own (which use
  // responses_ and the agent): stopped by the destructor once server_ is.
  std::unique_ptr<BackgroundResponses> background_;
  // Set as the server stops: streams following a background response end then.
  std::atomic<bool> stopping_ = false;
  // responses_'s size on the agent's metrics endpoint (null without a registry).
  struct StoreMetrics {
    prometheus::Gauge& responses;
    prometheus::Gauge& bytes;
    prometheus::Counter& forgotten;
    prometheus::Gauge& conversations;
    prometheus::Counter& file_errors;
  };
  // Files of openai.store_dir that could not be read back at start.
  int64_t store_files_set_aside_ = 0;
  std::unique_ptr<StoreMetrics> store_metrics_;
  std::mutex store_metrics_mutex_;
  // Sets store_metrics_ from responses_, after a change.
  void StoreChanged();
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int64_t> completions_running_{0};
};

}  // namespace tophat
