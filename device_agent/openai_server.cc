#include "device_agent/openai_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <thread>
#include <unordered_map>
#include <variant>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "device_agent/app_request.h"
#include "device_agent/choices.h"
#include "device_agent/openai_conversations.h"
#include "device_agent/openai_request.h"
#include "device_agent/openai_responses.h"
#include "models/tokenizers/tokenizer.h"
#include "proto/channel_security.h"
#include "telemetry/http_listener.h"
#include "telemetry/metric_builders.h"

namespace tophat {
namespace {

// Ordered: keys as written, so that a completions token's alternatives stay likeliest first
// (and every answer reads in OpenAI's order).
using Json = nlohmann::ordered_json;

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string NewCompletionId(OpenAiEndpoint endpoint) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("%s-%016x",
                         endpoint == OpenAiEndpoint::kChatCompletions ? "chatcmpl" : "cmpl",
                         rng());
}

// A tool call's id, as OpenAI's look: "call_" and 24 letters and digits.
std::string NewToolCallId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % kAlphabet.size()];
  return id;
}

// An answer's calls as OpenAI lists them (message.tool_calls; a stream's delta adds "index").
Json ToolCallsJson(const std::vector<ToolCall>& calls, bool streamed) {
  Json out = Json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    Json call = {{"id", NewToolCallId()},
                 {"type", "function"},
                 {"function", {{"name", calls[k].name}, {"arguments", calls[k].arguments}}}};
    if (streamed) call["index"] = k;
    out.push_back(std::move(call));
  }
  return out;
}

void SendError(httplib::Response& res, const OpenAiError& error) {
  res.status = error.http_status;
  // A message is UTF-8 by construction (fuzz/openai_request_fuzzer holds every refusal to
  // that); should one slip, its bad bytes become U+FFFD rather than the refusal a 500.
  res.set_content(error.ToJson().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

// 413 for a body past max_body bytes: from its Content-Length when it had one (refused
// before reading), or from httplib's own count of a chunked body.
OpenAiError BodyTooLarge(std::optional<uint64_t> length, int64_t max_body) {
  return OpenAiError{
      .http_status = 413,
      .message = absl::StrCat("the request body", length ? absl::StrCat(" (", *length, " bytes)") : "",
                              " is larger than this endpoint reads (", max_body,
                              " bytes; max_prompt_bytes)")};
}

OpenAiError ServerError(int status, std::string message) {
  return OpenAiError{.http_status = status,
                     .type = status == 503 ? "service_unavailable" : "server_error",
                     .message = std::move(message)};
}

std::string FinishReasonText(v1::FinishReason reason, bool stopped_by_sequence) {
  if (stopped_by_sequence) return "stop";
  switch (reason) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_STOP:
    case v1::FINISH_REASON_CANCELLED:
    case v1::FINISH_REASON_ERROR:
    case v1::FINISH_REASON_UNSPECIFIED:
    case v1::FinishReason_INT_MIN_SENTINEL_DO_NOT_USE_:
    case v1::FinishReason_INT_MAX_SENTINEL_DO_NOT_USE_:
      return "stop";
  }
  return "stop";
}

// The usage of a request's choices, `n` a prompt: each prompt counted once (its first
// choice's), as OpenAI counts them, and every choice's generated tokens.
// `reasoning`: each choice's reasoning tokens, for a thinking model (empty otherwise).
Json Usage(std::span<const v1::GenerateResponse> choices, int64_t n,
           std::span<const int64_t> reasoning = {}) {
  int64_t prompt = 0, cached = 0, generated = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    const v1::RequestStats& stats = choices[i].stats();
    if (i % static_cast<size_t>(n) == 0) {
      prompt += stats.prompt_tokens();
      // OpenAI's prompt caching field: the positions an earlier turn had computed.
      cached += stats.reused_prompt_tokens();
    }
    generated += stats.generated_tokens();
  }
  Json usage = {{"prompt_tokens", prompt},
                {"completion_tokens", generated},
                {"total_tokens", prompt + generated},
                {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  if (!reasoning.empty()) {
    int64_t reasoning_tokens = 0;
    for (const int64_t count : reasoning) reasoning_tokens += count;
    usage["completion_tokens_details"] = {{"reasoning_tokens", reasoning_tokens}};
  }
  return usage;
}

// A /v1/responses request's own part: its answer is written as a response object (or its
// events) and, with `store`, kept with the conversation it ends.
struct ResponsesTurn {
  ResponsesTurn(std::string id, bool store, ResponseBuilder builder)
      : id(std::move(id)), store(store), builder(std::move(builder)) {}
  std::string id;
  bool store = true;
  // Earlier turns' conversation (previous_response_id's) and this turn's input.
  std::vector<ChatMessage> conversation;
  ResponseBuilder builder;
  // A background response's: set by POST .../cancel or DELETE, read by its generation.
  std::atomic<bool> cancel_requested{false};
  // A background response made with `stream`: its events, which its clients follow.
  std::shared_ptr<ResponseEventLog> events;
  // A response made with `conversation`: that conversation's id, and this turn's input, which
  // is added to it with the answer once the answer completes.
  std::string conversation_id;
  std::vector<ChatMessage> input;
};

// A finished response: with `store`, kept with its conversation, for later turns; made with
// `conversation`, its input and output added to that conversation once it completed (an
// answer cut by max_output_tokens included, a cancelled one not).
void Keep(ResponseStore& store, ConversationStore& conversations, const ResponsesTurn& turn,
          const std::string& caller) {
  const std::string status = turn.builder.response().value("status", "");
  if (!turn.conversation_id.empty() && (status == "completed" || status == "incomplete")) {
    std::vector<Json> items = ChatMessagesAsItems(
        turn.input, [](std::string_view prefix, size_t) { return NewItemId(prefix); });
    for (const Json& item : turn.builder.response()["output"]) items.push_back(item);
    // A conversation deleted meanwhile takes nothing.
    conversations.Append(turn.conversation_id, caller, std::move(items));
  }
  if (!turn.store) return;
  std::vector<ChatMessage> conversation = turn.conversation;
  conversation.push_back(turn.builder.answer());
  store.Put(turn.id, caller,
            {.conversation = std::move(conversation),
             .response = turn.builder.response(),
             .events = turn.events});
}

// A response's usage, from its one request's stats.
Json ResponseUsage(const v1::GenerateResponse& done, int64_t reasoning_tokens) {
  return ResponsesUsage(done.stats().prompt_tokens(), done.stats().reused_prompt_tokens(),
                        done.stats().generated_tokens(), reasoning_tokens);
}

// One prompt of a request, as token ids, and with echo the text its answers start with.
struct PromptPlan {
  std::vector<int32_t> ids;
  std::optional<std::string> echo_text;
};

// The log-probabilities of a request's tokens, in the endpoint's shape: chat's
// {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}, or
// completions' {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}.
// Tokens are named by TokenText (the text each adds after the token before it), or as
// "token_id:N" with return_tokens_as_token_ids.
class LogprobsRenderer {
 public:
  LogprobsRenderer(const Tokenizer& tokenizer, bool chat, bool as_ids,
                   std::optional<int32_t> last_prompt_token)
      : tokenizer_(tokenizer), chat_(chat), as_ids_(as_ids), previous_(last_prompt_token) {
    Clear();
  }

  // Adds the token `id`, generated with `logprob`.
  void Add(int32_t id, const TokenLogprob& logprob) { Add(id, &logprob); }

  // Adds an echoed prompt (completions): its first token has no log-probability (null), each
  // later one the entry before it in `logprobs`, which has one per token after the first.
  void AddPrompt(std::span<const int32_t> prompt, std::span<const TokenLogprob> logprobs) {
    for (size_t i = 0; i < prompt.size(); ++i) {
      Add(prompt[i], i > 0 && i - 1 < logprobs.size() ? &logprobs[i - 1] : nullptr);
    }
  }

  bool empty() const { return pending_[chat_ ? "content" : "tokens"].empty(); }

  // What was added since the last Take.
  Json Take() {
    Json taken = std::move(pending_);
    Clear();
    return taken;
  }

 private:
  // `logprob`: null for a prompt's first token (completions only).
  void Add(int32_t id, const TokenLogprob* entry) {
    const std::string text = Name(id);
    if (entry == nullptr) {
      pending_["tokens"].push_back(text);
      pending_["token_logprobs"].push_back(nullptr);
      pending_["top_logprobs"].push_back(nullptr);
      AddOffset(text);
      previous_ = id;
      return;
    }
    const TokenLogprob& logprob = *entry;
    if (chat_) {
      Json top = Json::array();
      for (size_t i = 0; i < logprob.top_ids.size(); ++i) {
        const std::string alternative = Name(logprob.top_ids[i]);
        top.push_back({{"token", alternative},
                       {"logprob", Finite(logprob.top_logprobs[i])},
                       {"bytes", Bytes(alternative)}});
      }
      pending_["content"].push_back({{"token", text},
                                     {"logprob", Finite(logprob.logprob)},
                                     {"bytes", Bytes(text)},
                                     {"top_logprobs", std::move(top)}});
    } else {
      Json top = Json::object();
      for (size_t i = 0; i < logprob.top_ids.size(); ++i) {
        top[Name(logprob.top_ids[i])] = Finite(logprob.top_logprobs[i]);
      }
      pending_["tokens"].push_back(text);
      pending_["token_logprobs"].push_back(Finite(logprob.logprob));
      pending_["top_logprobs"].push_back(std::move(top));
      AddOffset(text);
    }
    previous_ = id;
  }

  void AddOffset(const std::string& text) {
    pending_["text_offset"].push_back(text_offset_);
    // In characters, as OpenAI counts them: every byte that does not continue one.
    text_offset_ += std::count_if(text.begin(), text.end(), [](char c) {
      return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    });
  }

  void Clear() {
    pending_ = chat_ ? Json{{"content", Json::array()}}
                     : Json{{"tokens", Json::array()},
                            {"token_logprobs", Json::array()},
                            {"top_logprobs", Json::array()},
                            {"text_offset", Json::array()}};
  }
  // Alternatives are named after the same previous token as the one generated.
  std::string Name(int32_t id) const {
    if (as_ids_) return absl::StrCat("token_id:", id);
    return TokenText(tokenizer_, previous_, id);
  }
  static Json Bytes(const std::string& text) {
    Json bytes = Json::array();
    for (const char c : text) bytes.push_back(static_cast<int>(static_cast<unsigned char>(c)));
    return bytes;
  }
  // JSON has no -infinity: OpenAI writes -9999.0 for a token the model rules out.
  static double Finite(float logprob) {
    return std::isfinite(logprob) ? static_cast<double>(logprob) : -9999.0;
  }

  const Tokenizer& tokenizer_;
  const bool chat_;
  const bool as_ids_;
  std::optional<int32_t> previous_;
  int64_t text_offset_ = 0;
  Json pending_;
};

// Feeds a request's tokens to its stop-sequence filter one token's text at a time, so that
// log-probabilities end with the token that completed a stop sequence, and collects what is
// safe to send.
struct TokenSink {
  StopSequenceFilter& filter;
  LogprobsRenderer* logprobs;  // null: none asked for
  // With echo: the prompt, which starts the answer, before the first event's tokens (and not
  // through the stop sequences, which end only generated text).
  std::optional<std::string> echo_text;
  std::span<const int32_t> prompt;
  // A thinking model's "</think>": the tokens up to it (and it) are counted as reasoning
  // (usage's reasoning_tokens).
  std::optional<int32_t> reasoning_end;
  int64_t reasoning_tokens = 0;
  // gpt-oss's answer: read by channel, its reasoning kept here until taken, its content
  // through the stop sequences.
  HarmonyReader* harmony = nullptr;
  std::string harmony_reasoning;

  std::string TakeReasoning() { return std::exchange(harmony_reasoning, {}); }
  // The answer's reasoning and content from text that is not a token's (what the
  // detokenizer held back to the end), then the reader's end.
  HarmonyReader::Parts FinishHarmony(std::string_view text) {
    HarmonyReader::Parts parts = harmony->Push(-1, text);
    HarmonyReader::Parts rest = harmony->Flush();
    reasoning_tokens = harmony->reasoning_tokens();
    return {.reasoning = TakeReasoning() + parts.reasoning + rest.reasoning,
            .content = parts.content + rest.content};
  }

  // The text `event` released; false once a stop sequence completed.
  std::string Push(const TokenEvent& event) {
    if (reasoning_end && !filter.stopped()) {
      for (const int32_t id : event.token_ids) {
        if (!reasoning_end) break;
        ++reasoning_tokens;
        if (id == *reasoning_end) reasoning_end.reset();
      }
    }
    std::string released;
    if (echo_text) {
      released = *std::move(echo_text);
      echo_text.reset();
      if (logprobs != nullptr) logprobs->AddPrompt(prompt, event.prompt_logprobs);
    }
    if (event.token_texts.size() != event.token_ids.size()) {
      // Not decoded token by token (an outline's parts, which have no log-probabilities).
      if (harmony != nullptr) return released + Harmony(-1, event.text);
      return released + filter.Push(event.text);
    }
    for (size_t i = 0; i < event.token_ids.size() && !filter.stopped(); ++i) {
      released += harmony != nullptr ? Harmony(event.token_ids[i], event.token_texts[i])
                                     : filter.Push(event.token_texts[i]);
      if (logprobs != nullptr && i < event.logprobs.size()) {
        logprobs->Add(event.token_ids[i], event.logprobs[i]);
      }
    }
    return released;
  }

 private:
  // One token through the reader: its reasoning kept, its content filtered.
  std::string Harmony(int32_t id, std::string_view text) {
    HarmonyReader::Parts parts = harmony->Push(id, text);
    harmony_reasoning += parts.reasoning;
    return filter.Push(parts.content);
  }
};

// What tophat does not do with gpt-oss's harmony format yet, refused by name rather than done
// wrong: an outline would be read from the reasoning. `responses`: the request came through
// the Responses API, which names its parameters differently.
std::optional<OpenAiError> HarmonyRefuses(const OpenAiRequest& request, bool responses) {
  if (!request.reasoning_effort.empty() && request.reasoning_effort != "low" &&
      request.reasoning_effort != "medium" && request.reasoning_effort != "high") {
    return OpenAiError{
        .param = responses ? "reasoning" : "reasoning_effort",
        .message = absl::StrCat(responses ? "reasoning.effort" : "reasoning_effort", " \"",
                                request.reasoning_effort,
                                "\": gpt-oss reasons at \"low\", \"medium\" or \"high\" effort")};
  }
  if (request.outline_max_points != 0) {
    return OpenAiError{.param = "tophat_outline",
                       .message =
                           "tophat_outline: not for gpt-oss, which reasons before it "
                           "answers (its outline would be read from its reasoning)"};
  }
  return std::nullopt;
}

// The tools a constrained call may name: all of them, or under tool_choice naming a function,
// that one.
void AddCallableTools(const OpenAiRequest& request, v1::ToolCallFormat& format) {
  for (const OpenAiTool& tool : request.tools) {
    if (request.tool_choice == ToolChoice::kFunction && tool.name != request.tool_choice_function) {
      continue;
    }
    v1::ToolCallFormat::Tool& added = *format.add_tools();
    added.set_name(tool.name);
    added.set_parameters(tool.parameters);
  }
}

// gpt-oss's answer's calls (ReadHarmonyCalls) into `calls`, or their bodies after `content`;
// "stop" becomes "tool_calls" where there are calls.
void TakeHarmonyCalls(const HarmonyReader& reader, const std::optional<ToolCallReader>& tools,
                      std::string& content, std::vector<ToolCall>& calls,
                      std::string& finish_reason) {
  ToolCallReading reading = ReadHarmonyCalls(reader.calls(), tools ? &*tools : nullptr);
  content += reading.content;
  calls = std::move(reading.calls);
  if (!calls.empty() && finish_reason == "stop") finish_reason = "tool_calls";
}

// One request's answer, built the same way whether it streams or not.
struct Completion {
  OpenAiEndpoint endpoint;
  std::string id;
  int64_t created = 0;
  std::string model;

  bool chat() const { return endpoint == OpenAiEndpoint::kChatCompletions; }

  // The object around the choices, as OpenAI's answers carry it.
  Json Envelope(bool streamed, Json choices) const {
    return Json{{"id", id},
                {"object", !chat() ? "text_completion"
                           : streamed ? "chat.completion.chunk"
                                      : "chat.completion"},
                {"created", created},
                {"model", model},
                {"choices", std::move(choices)}};
  }

  // `reasoning`: a thinking model's reasoning the chunk adds (delta.reasoning, vLLM's name).
  Json Chunk(int64_t index, const std::string& text, const Json& finish_reason, bool first,
             Json logprobs = nullptr, Json tool_calls = nullptr,
             const std::string& reasoning = "") const {
    Json choice = {
        {"index", index}, {"finish_reason", finish_reason}, {"logprobs", std::move(logprobs)}};
    if (chat()) {
      Json delta = Json::object();
      if (first) delta["role"] = "assistant";
      if (!reasoning.empty()) delta["reasoning"] = reasoning;
      if (!text.empty() ||
          (first && finish_reason.is_null() && tool_calls.is_null() && reasoning.empty())) {
        delta["content"] = text;
      }
      if (!tool_calls.is_null()) delta["tool_calls"] = std::move(tool_calls);
      choice["delta"] = delta;
    } else {
      choice["text"] = text;
    }
    return Envelope(/*streamed=*/true, Json::array({choice}));
  }

  // The last event of a stream with stream_options.include_usage: no choices, the usage.
  Json UsageChunk(const Json& usage) const {
    Json chunk = Envelope(/*streamed=*/true, Json::array());
    chunk["usage"] = usage;
    return chunk;
  }

  // One choice of a whole (not streamed) answer.
  // `reasoning`: a thinking model's (message.reasoning, null when it wrote none); its content
  // is then null when it wrote none (cut off while thinking).
  Json Choice(int64_t index, const std::string& text, const std::string& finish_reason,
              Json logprobs, Json tool_calls = nullptr,
              const std::optional<std::string>& reasoning = std::nullopt) const {
    Json choice = {
        {"index", index}, {"finish_reason", finish_reason}, {"logprobs", std::move(logprobs)}};
    if (chat() && !tool_calls.is_null()) {
      // OpenAI's content is null beside calls with nothing to say.
      choice["message"] = {{"role", "assistant"},
                           {"content", text.empty() ? Json(nullptr) : Json(text)},
                           {"tool_calls", std::move(tool_calls)}};
      if (reasoning) {
        choice["message"]["reasoning"] = reasoning->empty() ? Json(nullptr) : Json(*reasoning);
      }
    } else if (chat() && reasoning) {
      choice["message"] = {{"role", "assistant"},
                           {"content", text.empty() ? Json(nullptr) : Json(text)},
                           {"reasoning", reasoning->empty() ? Json(nullptr) : Json(*reasoning)}};
    } else if (chat()) {
      choice["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
      choice["text"] = text;
    }
    return choice;
  }

  Json Whole(Json choices, const Json& usage) const {
    Json whole = Envelope(/*streamed=*/false, std::move(choices));
    whole["usage"] = usage;
    return whole;
  }
};

// Each tool's JSON as the app sent it, which the chat template writes.
std::vector<std::string> ToolTexts(std::span<const OpenAiTool> tools) {
  std::vector<std::string> texts;
  for (const OpenAiTool& tool : tools) texts.push_back(tool.json);
  return texts;
}

// A token id a field names that the tokenizer cannot decode.
OpenAiError OutsideVocabulary(const Tokenizer& tokenizer, std::string param, int64_t id) {
  std::string message = absl::StrCat(param, ": token id ", id, " is outside the vocabulary of ",
                                     tokenizer.vocab_size());
  return OpenAiError{.param = std::move(param), .message = std::move(message)};
}

// A text prompt's token ids: the tokenizer's BOS (with `add_bos`) and the text encoded; or
// the 400 naming `prompt`.
std::variant<std::vector<int32_t>, OpenAiError> TextPromptIds(const Tokenizer& tokenizer,
                                                              const std::string& text,
                                                              bool add_bos) {
  auto encoded = tokenizer.Encode(text);
  if (!encoded.ok()) {
    return OpenAiError{.param = "prompt", .message = std::string(encoded.status().message())};
  }
  std::vector<int32_t> ids;
  if (const auto bos = tokenizer.bos_id(); bos && add_bos) ids.push_back(*bos);
  ids.insert(ids.end(), encoded->begin(), encoded->end());
  return ids;
}

std::string Event(const Json& json) { return absl::StrCat("data: ", json.dump(), "\n\n"); }

// A Responses stream's event: named by its type, as OpenAI's are.
std::string ResponseEvent(const Json& json) {
  return absl::StrCat("event: ", json["type"].get<std::string>(), "\ndata: ", json.dump(), "\n\n");
}

// 429: the endpoint already runs max_concurrent_requests completions.
OpenAiError Busy(int64_t max_concurrent_requests) {
  return OpenAiError{.http_status = 429,
                     .type = "requests",
                     .code = "rate_limit_exceeded",
                     .message = absl::StrCat("this agent already runs ", max_concurrent_requests,
                                             " completions (max_concurrent_requests); retry "
                                             "later")};
}

// OpenAI's 404 for a response this agent does not hold (or another app's).
OpenAiError ResponseNotFound(const std::string& id) {
  return OpenAiError{.http_status = 404,
                     .message = absl::StrCat("Response with id '", id, "' not found.")};
}

OpenAiError ConversationNotFound(const std::string& id, std::string param = "") {
  return OpenAiError{.http_status = 404,
                     .param = std::move(param),
                     .message = absl::StrCat("Conversation with id '", id,
                                             "' not found (it was deleted or forgotten, or is "
                                             "another app's).")};
}

OpenAiError ItemNotFound(const std::string& item_id, const std::string& conversation_id) {
  return OpenAiError{
      .http_status = 404,
      .message = absl::StrCat("Item with id '", item_id, "' not found in conversation '",
                              conversation_id, "'.")};
}

// A list's query (limit 1 to 100, order asc or desc, after an item's id), or the 400 naming
// the bad one.
std::variant<InputItemsQuery, OpenAiError> ItemsQueryOf(const httplib::Request& req) {
  InputItemsQuery query;
  if (req.has_param("limit")) {
    const std::string limit = req.get_param_value("limit");
    if (!absl::SimpleAtoi(limit, &query.limit) || query.limit < 1 || query.limit > 100) {
      return OpenAiError{.param = "limit",
                         .message = absl::StrCat("limit must be 1 to 100, not '", limit, "'")};
    }
  }
  if (req.has_param("order")) {
    const std::string order = req.get_param_value("order");
    if (order != "asc" && order != "desc") {
      return OpenAiError{
          .param = "order",
          .message = absl::StrCat("order must be 'asc' or 'desc', not '", order, "'")};
    }
    query.ascending = order == "asc";
  }
  query.after = req.get_param_value("after");
  return query;
}

}  // namespace

// Background responses running (background: true), each on its own thread: found by id to be
// cancelled, and joined once done (when the next starts) or when the server stops.
struct BackgroundResponses {
  struct Running {
    std::string app;
    std::shared_ptr<ResponsesTurn> turn;
    std::thread thread;
    bool done = false;
  };

  // Runs `work` on a thread of its own as `app`'s response `id`.
  void Start(const std::string& id, const std::string& app, std::shared_ptr<ResponsesTurn> turn,
             std::function<void()> work) {
    std::unique_lock<std::mutex> lock(mutex);
    // The finished ones: each set `done` as its last act, so a join returns at once.
    for (auto it = running.begin(); it != running.end();) {
      if (!it->second.done) {
        ++it;
        continue;
      }
      if (it->second.thread.joinable()) it->second.thread.join();
      it = running.erase(it);
    }
    Running& entry = running[id];
    if (gauge != nullptr) gauge->Increment();
    entry.app = app;
    entry.turn = std::move(turn);
    // The thread marks its entry under the lock, which is held until it is in place.
    entry.thread = std::thread([this, id, work = std::move(work)] {
      work();
      {
        std::lock_guard<std::mutex> done_lock(mutex);
        // Before `done`: once a cancel has returned, the gauge no longer counts it.
        if (gauge != nullptr) gauge->Decrement();
        running[id].done = true;
      }
      changed.notify_all();
    });
  }

  // Cancels `app`'s response `id` if it runs, and waits until it has ended and its answer
  // (or its cancel) is kept. False when `app` runs no such response.
  bool CancelAndWait(const std::string& id, const std::string& app, Agent& agent) {
    std::unique_lock<std::mutex> lock(mutex);
    const auto it = running.find(id);
    if (it == running.end() || it->second.app != app) return false;
    if (!it->second.done) {
      it->second.turn->cancel_requested = true;
      lock.unlock();
      agent.Cancel(id, app);  // a request waiting for a cloud sees the flag instead
      lock.lock();
      changed.wait(lock, [&] {
        // A Start may have joined and dropped it since it was done.
        const auto found = running.find(id);
        return found == running.end() || found->second.done;
      });
    }
    return true;
  }

  // Cancels every response still running and joins every thread.
  void StopAll(Agent& agent) {
    std::vector<std::pair<std::string, std::string>> cancelled;  // (id, app)
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (auto& [id, entry] : running) {
        if (!entry.done) {
          entry.turn->cancel_requested = true;
          cancelled.emplace_back(id, entry.app);
        }
        if (entry.thread.joinable()) threads.push_back(std::move(entry.thread));
      }
    }
    if (!cancelled.empty()) {
      spdlog::info("openai: stopping: cancelling {} background response(s) still running",
                   cancelled.size());
    }
    for (const auto& [id, app] : cancelled) agent.Cancel(id, app);
    for (std::thread& thread : threads) thread.join();
  }

  std::mutex mutex;
  std::condition_variable changed;
  std::unordered_map<std::string, Running> running;
  prometheus::Gauge* gauge = nullptr;  // tophat_openai_background_responses; null: none
};

namespace {

// The ids of openai.thinking_budget_message: none of them may end the reasoning or the answer
// (the budget forces "</think>" after them), and at most kMaxReasoningBudgetEndIds.
absl::StatusOr<std::vector<uint32_t>> BudgetMessageIds(const Tokenizer& tokenizer,
                                                       std::string_view message) {
  const auto refused = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("openai.thinking_budget_message: ", why));
  };
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(message);
  if (!ids.ok()) return refused(std::string(ids.status().message()));
  if (ids->size() > static_cast<size_t>(kMaxReasoningBudgetEndIds)) {
    return refused(absl::StrCat(ids->size(), " tokens, more than the ",
                                kMaxReasoningBudgetEndIds, " a spent budget may force"));
  }
  const std::optional<int32_t> reasoning_end = tokenizer.PieceToId(ReasoningMarkers{}.end);
  std::vector<uint32_t> out;
  for (const int32_t id : *ids) {
    if (id == reasoning_end || id == tokenizer.eos_id()) {
      return refused(absl::StrCat("its token ", id, " would end ",
                                  id == reasoning_end ? "the reasoning itself" : "the answer",
                                  ": the budget writes ", ReasoningMarkers{}.end,
                                  " after the message"));
    }
    out.push_back(static_cast<uint32_t>(id));
  }
  return out;
}

// gpt-oss's token ids the endpoint needs: its control tokens, the tokens before the
// <|message|> that opens its final channel ("<|channel|>final"), and those that end a message
// of reasoning and start the next ("<|end|><|start|>assistant"). INVALID_ARGUMENT naming a
// control token the vocabulary lacks.
struct HarmonyIds {
  HarmonyTokens tokens;
  std::vector<uint32_t> final_prefix;
  std::vector<uint32_t> reasoning_end;
};
absl::StatusOr<HarmonyIds> HarmonyIdsOf(const Tokenizer& tokenizer) {
  absl::StatusOr<HarmonyTokens> tokens = HarmonyTokens::Find(tokenizer);
  if (!tokens.ok()) return tokens.status();
  absl::StatusOr<std::vector<int32_t>> final_name = tokenizer.Encode("final");
  if (!final_name.ok()) return final_name.status();
  absl::StatusOr<std::vector<int32_t>> assistant = tokenizer.Encode("assistant");
  if (!assistant.ok()) return assistant.status();
  HarmonyIds ids{
      .tokens = *tokens,
      .final_prefix = {static_cast<uint32_t>(tokens->channel)},
      .reasoning_end = {static_cast<uint32_t>(tokens->end), static_cast<uint32_t>(tokens->start)}};
  ids.final_prefix.insert(ids.final_prefix.end(), final_name->begin(), final_name->end());
  ids.reasoning_end.insert(ids.reasoning_end.end(), assistant->begin(), assistant->end());
  return ids;
}

}  // namespace

absl::StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Start(Agent* agent,
                                                                  OpenAiServerOptions options) {
  if (options.model_name.empty()) options.model_name = agent->Info().model_id();
  auto server = std::unique_ptr<OpenAiServer>(new OpenAiServer(agent, std::move(options)));
  if (!server->options_.template_dir.empty()) {
    auto loaded = ChatTemplate::Load(server->options_.template_dir);
    if (loaded.ok()) {
      server->chat_template_ = *std::move(loaded);
      if (server->chat_template_->family() == ChatFamily::kHarmony) {
        absl::StatusOr<HarmonyIds> ids = HarmonyIdsOf(agent->tokenizer());
        if (ids.ok()) {
          server->harmony_tokens_ = ids->tokens;
          server->harmony_final_prefix_ = std::move(ids->final_prefix);
          server->harmony_reasoning_end_ = std::move(ids->reasoning_end);
        } else {
          // Its answers could not be read: chat is unavailable, completions are served.
          server->chat_template_.reset();
          server->chat_template_error_ = std::string(ids.status().message());
          spdlog::warn("openai: /v1/chat/completions unavailable: {}",
                       server->chat_template_error_);
        }
      }
    } else if (absl::IsNotFound(loaded.status())) {
      // A model without a template still serves /v1/completions.
      server->chat_template_error_ = std::string(loaded.status().message());
      spdlog::warn("openai: /v1/chat/completions unavailable: {}", server->chat_template_error_);
    } else {
      return loaded.status();
    }
  } else {
    server->chat_template_error_ = "no chat template configured";
  }
  if (!server->options_.thinking_budget_message.empty()) {
    absl::StatusOr<std::vector<uint32_t>> ids =
        BudgetMessageIds(agent->tokenizer(), server->options_.thinking_budget_message);
    if (!ids.ok()) return ids.status();
    server->thinking_budget_end_ids_ = *std::move(ids);
    if (!server->chat_template_ || server->chat_template_->thinking() == ThinkingStyle::kNone) {
      spdlog::warn(
          "openai: openai.thinking_budget_message is set, and the model's chat template does "
          "not think: the message is never used");
    }
  }
  server->responses_ = std::make_unique<ResponseStore>(server->options_.max_stored_response_bytes);
  server->conversations_ =
      std::make_unique<ConversationStore>(server->options_.max_stored_response_bytes);
  if (!server->options_.store_dir.empty()) {
    // What the last process kept, taken back before the first request.
    const std::filesystem::path dir = server->options_.store_dir;
    auto lock = FolderLock::Take(dir);
    if (!lock.ok()) {
      return absl::Status(lock.status().code(),
                          absl::StrCat("openai.store_dir: ", lock.status().message()));
    }
    server->store_lock_ = std::make_unique<FolderLock>(*std::move(lock));
    auto response_files = KeptFiles::Open(dir / "responses");
    if (!response_files.ok()) {
      return absl::Status(response_files.status().code(),
                          absl::StrCat("openai.store_dir: ", response_files.status().message()));
    }
    auto conversation_files = KeptFiles::Open(dir / "conversations");
    if (!conversation_files.ok()) {
      return absl::Status(
          conversation_files.status().code(),
          absl::StrCat("openai.store_dir: ", conversation_files.status().message()));
    }
    const RestoredObjects responses = server->responses_->KeepIn(*std::move(response_files));
    const RestoredObjects conversations =
        server->conversations_->KeepIn(*std::move(conversation_files));
    for (const auto* restored : {&responses, &conversations}) {
      for (const std::string& why : restored->set_aside) {
        spdlog::warn("openai: openai.store_dir: cannot read back {}", why);
      }
      server->store_files_set_aside_ += static_cast<int64_t>(restored->set_aside.size());
    }
    spdlog::info("openai: took back {} kept responses and {} conversations ({} bytes) from {}",
                 responses.kept, conversations.kept,
                 server->responses_->bytes() + server->conversations_->bytes(), dir.string());
  }
  if (prometheus::Registry* registry = server->options_.registry) {
    server->store_metrics_ = std::make_unique<StoreMetrics>(StoreMetrics{
        .responses = AddGauge(*registry, "tophat_openai_stored_responses",
                              "/v1/responses answers kept for later turns"),
        .bytes = AddGauge(*registry, "tophat_openai_stored_response_bytes",
                          "Bytes the kept /v1/responses answers and their conversations "
                          "take (openai.max_stored_response_bytes bounds them)"),
        .forgotten = AddCounter(*registry, "tophat_openai_stored_responses_forgotten_total",
                                "Kept /v1/responses answers forgotten for the bound (least "
                                "recently used first); a later turn naming one is refused"),
        .conversations = AddGauge(*registry, "tophat_openai_conversations",
                                  "/v1/conversations kept (each bounded with the others by "
                                  "openai.max_stored_response_bytes)"),
        .file_errors = AddCounter(
            *registry, "tophat_openai_store_file_errors_total",
            "Kept responses' and conversations' files (openai.store_dir) that could not be "
            "written or removed (the object stays in memory), or read back at start (set "
            "aside as FILE.unreadable)")});
    server->StoreChanged();
    server->background_->gauge =
        &AddGauge(*registry, "tophat_openai_background_responses",
                  "/v1/responses answers generating in the background (background: true) now");
  }
  server->server_ = std::make_unique<httplib::Server>();
  httplib::Server& http = *server->server_;
  // Workers: one per completion that may run, plus some for the refusals, /health and
  // /v1/models, so that a full endpoint still answers 429 at once instead of queueing
  // connections no worker will take for as long as the streams run.
  const auto workers = static_cast<size_t>(std::max<int64_t>(1, server->options_.max_concurrent_requests)) + 8;
  http.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  http.set_payload_max_length(static_cast<size_t>(std::max<int64_t>(1, server->options_.max_body_bytes)));
  http.set_read_timeout(server->options_.idle_timeout_s, 0);
  http.set_keep_alive_timeout(server->options_.idle_timeout_s);
  http.set_keep_alive_max_count(100);
  const int64_t max_body = server->options_.max_body_bytes;
  // httplib's own refusals (413 past the body limit for a chunked body, 400 for a request it
  // cannot parse) carry OpenAI's error shape too.
  http.set_error_handler([max_body](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      SendError(res, BodyTooLarge(std::nullopt, max_body));
    } else if (res.status >= 400) {
      SendError(res, OpenAiError{.http_status = res.status,
                                 .message = absl::StrCat("HTTP ", res.status)});
    }
  });
  server->request_deadline_ = std::make_unique<HttpRequestDeadline>(
      "openai", std::chrono::duration_cast<HttpRequestDeadline::Clock::duration>(
                    std::chrono::duration<double>(server->options_.request_deadline_s)),
      std::chrono::milliseconds(250));
  // A body past the limit is refused from its Content-Length before any of it is read (httplib's
  // own check, below, first reads and discards the whole body), and the connection is closed
  // once the refusal is written: what the client sends after it is that body, not a request.
  http.set_pre_routing_handler([raw = server.get(), max_body](const httplib::Request& req,
                                                              httplib::Response& res) {
    uint64_t length = 0;
    if (!absl::SimpleAtoi(req.get_header_value("Content-Length"), &length) ||
        length <= static_cast<uint64_t>(max_body)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    raw->request_deadline_->RequestRead(req.remote_addr, req.remote_port);
    raw->request_deadline_->CloseAfterAnswer(req.remote_addr, req.remote_port);
    SendError(res, BodyTooLarge(length, max_body));
    res.set_header("Connection", "close");
    return httplib::Server::HandlerResponse::Handled;
  });
  server->Route();
  auto port = ListenOnThread(*server->server_, server->options_.address, server->thread_);
  if (!port.ok()) {
    return absl::Status(port.status().code(),
                        absl::StrCat("openai.address: ", port.status().message()));
  }
  server->port_ = *port;
  server->request_deadline_->Watch(server->port_);
  spdlog::info("openai: serving model \"{}\" on {} (port {}; chat template: {})",
               server->options_.model_name, server->options_.address, server->port_,
               server->chat_template_ ? ChatFamilyName(server->chat_template_->family())
                                      : std::string_view("none"));
  return server;
}

OpenAiServer::OpenAiServer(Agent* agent, OpenAiServerOptions options)
    : agent_(agent),
      options_(std::move(options)),
      background_(std::make_unique<BackgroundResponses>()) {}

void OpenAiServer::StoreChanged() {
  if (!store_metrics_) return;
  // The counters move by what changed since they were last set: one handler at a time, or
  // two would both add the same change.
  std::lock_guard<std::mutex> lock(store_metrics_mutex_);
  store_metrics_->responses.Set(static_cast<double>(responses_->size()));
  store_metrics_->bytes.Set(static_cast<double>(responses_->bytes()));
  const double forgotten = static_cast<double>(responses_->forgotten());
  store_metrics_->forgotten.Increment(forgotten - store_metrics_->forgotten.Value());
  store_metrics_->conversations.Set(static_cast<double>(conversations_->size()));
  const double file_errors = static_cast<double>(
      store_files_set_aside_ + responses_->file_errors() + conversations_->file_errors());
  store_metrics_->file_errors.Increment(file_errors - store_metrics_->file_errors.Value());
}

OpenAiServer::~OpenAiServer() {
  // Streams following a background response end now, rather than with its generation.
  stopping_ = true;
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
  // No handler starts one now: the background responses still running are cancelled.
  if (background_) background_->StopAll(*agent_);
}

std::variant<std::vector<int32_t>, OpenAiError> OpenAiServer::ChatPromptIds(
    const std::vector<ChatMessage>& messages, std::span<const std::string> tools,
    const ChatRenderOptions& options) const {
  if (!chat_template_) {
    return OpenAiError{.param = "messages",
                       .message = absl::StrCat("this model has no chat template (",
                                               chat_template_error_, "); use /v1/completions")};
  }
  auto rendered = chat_template_->Render(messages, tools, options);
  if (!rendered.ok()) {
    const std::string message(rendered.status().message());
    return OpenAiError{.param = message.starts_with("tools:") ? "tools" : "messages",
                       .message = message};
  }
  auto ids = EncodeChat(agent_->tokenizer(), *rendered);
  if (!ids.ok()) return ServerError(500, std::string(ids.status().message()));
  return *std::move(ids);
}

void OpenAiServer::FollowEvents(httplib::Response& res,
                                std::shared_ptr<const ResponseEventLog> events, size_t next) const {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [this, events, next](size_t, httplib::DataSink& sink) mutable {
        while (true) {
          // Woken by new events; between them, every quarter second to see whether the
          // client or the server has gone.
          ResponseEventLog::Read read = events->From(next, std::chrono::milliseconds(250));
          for (const Json& event : read.events) {
            const std::string text = ResponseEvent(event);
            if (!sink.write(text.data(), text.size())) return false;
          }
          next += read.events.size();
          if (read.ended) break;
          if (stopping_ || !sink.is_writable()) return false;
        }
        sink.done();
        return true;
      });
}

void OpenAiServer::Route() {
  // The caller's app name, or an error already written to `res`.
  const auto authenticate = [this](const httplib::Request& req,
                                   httplib::Response& res) -> std::optional<std::string> {
    if (options_.app_tokens == nullptr) return std::string();
    const std::shared_ptr<const std::vector<BearerToken>> tokens = options_.app_tokens->Get();
    if (tokens->empty()) return std::string();
    auto caller = AuthenticateBearerValue(req.get_header_value("Authorization"), *tokens);
    if (caller.ok()) return *caller;
    SendError(res, OpenAiError{.http_status = 401,
                               .type = "invalid_request_error",
                               .code = "invalid_api_key",
                               .message = std::string(caller.status().message())});
    return std::nullopt;
  };

  // Every handler starts with it: the request is in, and its connection's deadline for sending
  // one (openai.request_deadline_s) is off until the answer is written (the logger).
  const auto answering = [this](const httplib::Request& req) {
    request_deadline_->RequestRead(req.remote_addr, req.remote_port);
  };
  server_->set_logger([this](const httplib::Request& req, const httplib::Response&) {
    request_deadline_->ResponseDone(req.remote_addr, req.remote_port);
  });

  server_->Get("/health", [this, answering](const httplib::Request& req, httplib::Response& res) {
    answering(req);
    const v1::HealthResponse health = agent_->Health();
    res.status = health.cloud_connected() ? 200 : 503;
    res.set_content(Json{{"status", health.cloud_connected() ? "ok" : "cloud_disconnected"},
                         {"active_requests", health.active_requests()}}
                        .dump(),
                    "application/json");
  });

  const auto model_object = [this] {
    return Json{{"id", options_.model_name},
                {"object", "model"},
                {"created", 0},
                {"owned_by", "tophat"},
                {"max_model_len", agent_->Info().max_context()}};
  };
  server_->Get("/v1/models", [authenticate, answering, model_object](
                                 const httplib::Request& req, httplib::Response& res) {
    answering(req);
    if (!authenticate(req, res)) return;
    res.set_content(Json{{"object", "list"}, {"data", Json::array({model_object()})}}.dump(),
                    "application/json");
  });
  // OpenAI's models.retrieve: the one model, or 404 for any other name.
  server_->Get("/v1/models/(.+)", [this, authenticate, answering, model_object](
                                      const httplib::Request& req, httplib::Response& res) {
    answering(req);
    if (!authenticate(req, res)) return;
    const std::string name = req.matches[1];
    if (name != options_.model_name) {
      return SendError(res, ModelNotFound(name, options_.model_name));
    }
    res.set_content(model_object().dump(), "application/json");
  });

  // A request that failed on the agent: 503 while the cloud is away (worth a retry), else 500.
  // A request the agent's planner refused (INVALID_ARGUMENT: what the parser here cannot
  // check, such as min_tokens above the agent's default max_tokens) is the client's: 400.
  const auto generation_error = [this](const v1::GenerateResponse& done) {
    constexpr std::string_view kInvalid = "INVALID_ARGUMENT: ";
    if (done.error().rfind(kInvalid, 0) == 0) {
      return OpenAiError{.message = done.error().substr(kInvalid.size())};
    }
    return ServerError(agent_->Health().cloud_connected() ? 500 : 503, done.error());
  };
  // Runs a parsed request for `caller` and writes its answer: chat's or completions', or
  // with `turn` a response object (or its events).
  const auto serve = [this, generation_error](
                         const OpenAiRequest& request, const std::optional<std::string>& caller,
                         httplib::Response& res, std::shared_ptr<ResponsesTurn> turn) {
    const OpenAiEndpoint endpoint = request.endpoint;
    // One of max_concurrent_requests places per choice running at once, held by the handler
    // and, for a stream, by its content provider, which httplib runs after the handler has
    // returned. A request of more choices than there are places runs them that many at a
    // time.
    const int64_t places = std::min(request.choices(), options_.max_concurrent_requests);
    struct Slot {
      std::atomic<int64_t>* running;
      int64_t places;
      ~Slot() { running->fetch_sub(places); }
    };
    const int64_t running = completions_running_.fetch_add(places) + places;
    const std::shared_ptr<Slot> slot(new Slot{&completions_running_, places});
    if (running > options_.max_concurrent_requests) {
      res.set_header("Retry-After", "1");
      return SendError(res, Busy(options_.max_concurrent_requests));
    }

    // Token ids here, not on the agent: the context check below can then answer 400.
    const Tokenizer& tokenizer = agent_->tokenizer();
    std::vector<PromptPlan> prompts;
    std::vector<uint32_t> stop_ids;
    // Under tool_choice "auto", "required" or a function: how the answer's calls are read.
    std::optional<ToolCallReader> tool_reader;
    // A thinking model's "</think>" id: its answer is split into reasoning and content.
    std::optional<int32_t> reasoning_end;
    // thinking_token_budget, or the one the reasoning effort stands for; -1: no bound.
    int64_t thinking_budget = request.thinking_token_budget;
    ChatRenderOptions chat_options = request.chat_options;
    // gpt-oss's answers are read by channel (HarmonyReader), and its template takes the
    // reasoning effort.
    const bool harmony =
        endpoint == OpenAiEndpoint::kChatCompletions && harmony_tokens_.has_value();
    if (harmony) {
      if (auto refused = HarmonyRefuses(request, turn != nullptr)) return SendError(res, *refused);
      if (!request.reasoning_effort.empty()) chat_options.reasoning_effort = request.reasoning_effort;
    } else if (!request.reasoning_effort.empty()) {
      // As the request named it.
      const std::string field = turn != nullptr ? "reasoning.effort" : "reasoning_effort";
      const std::string param = turn != nullptr ? "reasoning" : "reasoning_effort";
      if (request.thinking_token_budget >= 0) {
        return SendError(
            res, OpenAiError{.param = param,
                             .message = absl::StrCat(field,
                                                     " and thinking_token_budget both bound the "
                                                     "reasoning: give one")});
      }
      const auto budget = options_.reasoning_effort_budgets.find(request.reasoning_effort);
      if (budget == options_.reasoning_effort_budgets.end()) {
        return SendError(
            res, OpenAiError{.param = param,
                             .message = absl::StrCat(
                                 field, " \"", request.reasoning_effort,
                                 "\": this endpoint has no thinking budget for it (its "
                                 "operator sets one with openai.reasoning_effort_budgets.",
                                 request.reasoning_effort,
                                 "); thinking_token_budget bounds the reasoning directly")});
      }
      thinking_budget = budget->second;
    }
    if (endpoint == OpenAiEndpoint::kChatCompletions) {
      auto ids = ChatPromptIds(request.messages, ToolTexts(request.tools), chat_options);
      if (auto* error = std::get_if<OpenAiError>(&ids)) return SendError(res, *error);
      if (chat_template_->Thinks(request.chat_options)) {
        // The answer starts in the model's reasoning: it is split from the content, and a
        // format holds from the token after its end on.
        const ReasoningMarkers markers;
        const std::optional<int32_t> end = tokenizer.PieceToId(markers.end);
        if (!end) {
          return SendError(res, ServerError(500, absl::StrCat("the chat template thinks, and the "
                                                              "tokenizer has no ",
                                                              markers.end, " token")));
        }
        reasoning_end = *end;
        // An outline is read from the model's first answer, which would be its reasoning.
        if (request.outline_max_points != 0) {
          return SendError(res, OpenAiError{.param = "tophat_outline",
                                            .message = "tophat_outline: not while the model "
                                                       "thinks (chat_template_kwargs."
                                                       "enable_thinking false turns it off)"});
        }
      }
      // The template rendered the tools, so it has a layout for calls.
      // gpt-oss's calls are messages of their own, read by HarmonyReader; their arguments
      // are checked by the reader all the same.
      std::optional<ToolCallSyntax> syntax = chat_template_->tool_call_syntax();
      if (harmony && !request.tools.empty()) syntax = ToolCallSyntax{};
      if (request.tool_choice != ToolChoice::kNone && syntax) {
        absl::StatusOr<ToolCallReader> reader = ToolCallReader::Create(request, *syntax);
        if (!reader.ok()) {
          return SendError(res, OpenAiError{.param = "tools",
                                            .message = std::string(reader.status().message())});
        }
        tool_reader = *std::move(reader);
      }
      prompts.push_back({.ids = std::get<std::vector<int32_t>>(std::move(ids))});
      for (const std::string& end : chat_template_->turn_ends()) {
        if (const auto id = tokenizer.PieceToId(end)) stop_ids.push_back(static_cast<uint32_t>(*id));
      }
    }
    for (const CompletionPrompt& given : request.prompts) {
      PromptPlan& plan = prompts.emplace_back();
      if (given.ids) {
        for (const int64_t id : *given.ids) {
          if (id >= tokenizer.vocab_size()) {
            return SendError(res, OutsideVocabulary(tokenizer, "prompt", id));
          }
          plan.ids.push_back(static_cast<int32_t>(id));
        }
        if (request.echo) plan.echo_text = tokenizer.Decode(plan.ids).value_or("");
        continue;
      }
      if (request.echo) plan.echo_text = given.text;
      auto ids = TextPromptIds(tokenizer, given.text, /*add_bos=*/true);
      if (auto* error = std::get_if<OpenAiError>(&ids)) return SendError(res, *error);
      plan.ids = std::get<std::vector<int32_t>>(std::move(ids));
    }
    for (const auto& [id, bias] : request.logit_bias) {
      if (id >= tokenizer.vocab_size()) {
        return SendError(res, OutsideVocabulary(tokenizer, "logit_bias", id));
      }
    }
    for (const int64_t id : request.stop_token_ids) {
      if (id >= tokenizer.vocab_size()) {
        return SendError(res, OutsideVocabulary(tokenizer, "stop_token_ids", id));
      }
      stop_ids.push_back(static_cast<uint32_t>(id));
    }
    const int64_t max_context = agent_->Info().max_context();
    for (size_t p = 0; p < prompts.size(); ++p) {
      const int64_t length = static_cast<int64_t>(prompts[p].ids.size());
      const int64_t wanted =
          length + (request.prompt_only ? 0 : std::max<int64_t>(1, request.max_tokens));
      if (max_context > 0 && wanted > max_context) {
        return SendError(
            res,
            OpenAiError{.param = turn                                           ? "input"
                                 : endpoint == OpenAiEndpoint::kChatCompletions ? "messages"
                                                                                : "prompt",
                        .code = "context_length_exceeded",
                        .message = absl::StrCat(
                            "This model's maximum context length is ", max_context,
                            " tokens; the prompt", prompts.size() > 1 ? absl::StrCat(" ", p) : "",
                            " has ", length, " and ", request.max_tokens, " more were asked for")});
      }
    }

    v1::GenerateRequest generate;
    Completion completion{.endpoint = endpoint,
                          .id = turn ? turn->id : NewCompletionId(endpoint),
                          .created = UnixSeconds(),
                          .model = options_.model_name};
    generate.set_request_id(completion.id);
    generate.set_max_new_tokens(static_cast<uint32_t>(request.max_tokens));
    generate.mutable_sampling()->set_temperature(static_cast<float>(request.temperature));
    generate.mutable_sampling()->set_top_p(static_cast<float>(request.top_p));
    if (request.seed) generate.mutable_sampling()->set_seed(*request.seed);
    generate.mutable_sampling()->set_top_k(static_cast<uint32_t>(request.top_k));
    generate.mutable_sampling()->set_min_p(static_cast<float>(request.min_p));
    generate.mutable_sampling()->set_presence_penalty(static_cast<float>(request.presence_penalty));
    generate.mutable_sampling()->set_frequency_penalty(
        static_cast<float>(request.frequency_penalty));
    generate.mutable_sampling()->set_repetition_penalty(
        static_cast<float>(request.repetition_penalty));
    for (const auto& [id, bias] : request.logit_bias) {
      (*generate.mutable_sampling()->mutable_logit_bias())[static_cast<uint32_t>(id)] =
          static_cast<float>(bias);
    }
    generate.set_ignore_eos(request.ignore_eos);
    generate.set_min_new_tokens(static_cast<uint32_t>(request.min_tokens));
    generate.set_response_format(!request.json_schema.empty() ? v1::RESPONSE_FORMAT_JSON_SCHEMA
                                 : request.json_object           ? v1::RESPONSE_FORMAT_JSON_OBJECT
                                                                 : v1::RESPONSE_FORMAT_TEXT);
    generate.set_json_schema(request.json_schema);
    if (!request.regex.empty()) {
      generate.set_response_format(v1::RESPONSE_FORMAT_REGEX);
      generate.set_regex(request.regex);
    }
    if (!request.answer_choices.empty()) {
      generate.set_response_format(v1::RESPONSE_FORMAT_CHOICE);
      for (const std::string& choice : request.answer_choices) generate.add_choices(choice);
    }
    if (!request.grammar.empty()) {
      generate.set_response_format(v1::RESPONSE_FORMAT_GRAMMAR);
      generate.set_grammar(request.grammar);
    }
    if (!request.structural_tag.empty()) {
      generate.set_response_format(v1::RESPONSE_FORMAT_STRUCTURAL_TAG);
      generate.set_structural_tag(request.structural_tag);
    }
    // Decoding constrained to calls in the model's own layout: of the named function or any
    // tool; under "auto", text first, and a call the model starts is a whole, valid one.
    const bool call_required = tool_reader && (request.tool_choice == ToolChoice::kRequired ||
                                               request.tool_choice == ToolChoice::kFunction);
    if (tool_reader && harmony && call_required) {
      // gpt-oss reasons as it likes, then calls, in harmony's layout (HarmonyCallConstraint).
      generate.set_response_format(v1::RESPONSE_FORMAT_TOOL_CALLS);
      v1::ToolCallFormat& format = *generate.mutable_tool_calls();
      AddCallableTools(request, format);
      format.set_max_calls(1);
      v1::HarmonyCallLayout& layout = *format.mutable_harmony();
      layout.set_start(static_cast<uint32_t>(harmony_tokens_->start));
      layout.set_channel(static_cast<uint32_t>(harmony_tokens_->channel));
      layout.set_message(static_cast<uint32_t>(harmony_tokens_->message));
      layout.set_end(static_cast<uint32_t>(harmony_tokens_->end));
      layout.set_constrain(static_cast<uint32_t>(harmony_tokens_->constrain));
      layout.set_call(static_cast<uint32_t>(harmony_tokens_->call));
      // A budget ends the reasoning message after the operator's message; the layout then
      // opens the call (HarmonyCallConstraint), not the final channel.
      if (thinking_budget >= 0) {
        generate.set_reasoning_token_budget(static_cast<uint32_t>(thinking_budget));
        for (const uint32_t id : thinking_budget_end_ids_) {
          generate.add_reasoning_budget_end_ids(id);
        }
      }
    }
    if (tool_reader && !harmony) {
      generate.set_response_format(v1::RESPONSE_FORMAT_TOOL_CALLS);
      const ToolCallSyntax& syntax = tool_reader->syntax();
      v1::ToolCallFormat& format = *generate.mutable_tool_calls();
      format.set_open(syntax.open);
      format.set_between(syntax.between);
      format.set_close(syntax.close);
      if (syntax.separator) format.set_separator(*syntax.separator);
      AddCallableTools(request, format);
      const bool several = request.tool_choice != ToolChoice::kFunction &&
                           request.parallel_tool_calls && syntax.separator.has_value();
      format.set_max_calls(several ? kMaxOpenAiToolCalls : 1);
      format.set_text_first(!call_required);
      format.set_start_tag(syntax.start_tag);
    }
    if (request.logprobs >= 0 || request.prompt_only) {
      generate.set_logprobs(true);
      generate.set_top_logprobs(static_cast<uint32_t>(std::max<int64_t>(0, request.logprobs)));
      // Scoring without log-probabilities asked for still reads the prompt alone.
      generate.set_prompt_logprobs(request.echo);
      generate.set_prompt_only(request.prompt_only);
    }
    // gpt-oss's format holds in its final channel, after "<|channel|>final<|message|>", and
    // its budget counts the tokens before that; spent, it ends the message of reasoning
    // (after the budget message, if any) and opens the final one.
    if (harmony && !generate.tool_calls().has_harmony() &&
        (generate.response_format() != v1::RESPONSE_FORMAT_TEXT || thinking_budget >= 0)) {
      generate.set_format_after_token_id(static_cast<uint32_t>(harmony_tokens_->message));
      for (const uint32_t id : harmony_final_prefix_) generate.add_format_after_token_prefix(id);
      if (thinking_budget >= 0) {
        generate.set_reasoning_token_budget(static_cast<uint32_t>(thinking_budget));
        for (const uint32_t id : thinking_budget_end_ids_) {
          generate.add_reasoning_budget_end_ids(id);
        }
        for (const uint32_t id : harmony_reasoning_end_) generate.add_reasoning_budget_end_ids(id);
      }
    }
    // A thinking model's format holds after its </think>, and its budget counts the tokens
    // before it.
    if (reasoning_end &&
        (generate.response_format() != v1::RESPONSE_FORMAT_TEXT || thinking_budget >= 0)) {
      generate.set_format_after_token_id(static_cast<uint32_t>(*reasoning_end));
      if (thinking_budget >= 0) {
        generate.set_reasoning_token_budget(static_cast<uint32_t>(thinking_budget));
        for (const uint32_t id : thinking_budget_end_ids_) {
          generate.add_reasoning_budget_end_ids(id);
        }
      }
    }
    for (uint32_t id : stop_ids) generate.add_stop_token_ids(id);
    if (request.outline_max_points != 0) {
      generate.mutable_outline()->set_enabled(true);
      if (request.outline_max_points > 0) {
        generate.mutable_outline()->set_max_points(
            static_cast<uint32_t>(request.outline_max_points));
      }
    }

    // The renderer names the first generated token after the prompt's last; with echo, the
    // prompt's own tokens come first, the first named on its own.
    const auto make_logprobs = [&tokenizer, request, endpoint](const PromptPlan& prompt) {
      const std::optional<int32_t> last =
          request.echo || prompt.ids.empty() ? std::nullopt
                                             : std::optional<int32_t>(prompt.ids.back());
      return request.logprobs < 0
                 ? std::optional<LogprobsRenderer>()
                 : std::optional<LogprobsRenderer>(std::in_place, tokenizer,
                                                   endpoint == OpenAiEndpoint::kChatCompletions,
                                                   request.return_tokens_as_token_ids, last);
    };
    // Each choice its own request: prompt p's choice j is choice p * n + j (OpenAI's order),
    // with its own id (for Cancel) and, with a seed, seed + j.
    std::vector<ChoicePlan> choices;
    for (size_t p = 0; p < prompts.size(); ++p) {
      for (int64_t j = 0; j < request.n; ++j) {
        ChoicePlan& choice = choices.emplace_back(ChoicePlan{.generate = generate, .prompt = p});
        for (int32_t id : prompts[p].ids) {
          choice.generate.mutable_prompt_ids()->add_ids(static_cast<uint32_t>(id));
        }
        if (request.choices() > 1) {
          choice.generate.set_request_id(absl::StrCat(completion.id, "-", choices.size() - 1));
        }
        if (request.seed) choice.generate.mutable_sampling()->set_seed(*request.seed + j);
      }
    }
    const auto failed = [](const v1::GenerateResponse& done) {
      return done.finish_reason() == v1::FINISH_REASON_ERROR;
    };
    if (!request.stream) {
      std::vector<v1::GenerateResponse> done(choices.size());
      std::vector<Json> rendered(choices.size());
      std::vector<int64_t> reasoning_counts(reasoning_end || harmony ? choices.size() : 0);
      // A background response's cancel stops it, even while it waits for a cloud.
      const auto cancelled = [&turn] { return turn && turn->cancel_requested.load(); };
      const KeptPrompts kept = KeepPrompts(*agent_, choices, request.n, places, *caller, cancelled);
      RunEach(static_cast<int64_t>(choices.size()), places, [&](int64_t i) {
        const PromptPlan& prompt = prompts[choices[i].prompt];
        StopSequenceFilter filter(request.stop, request.include_stop_str_in_output);
        std::optional<LogprobsRenderer> logprobs = make_logprobs(prompt);
        TokenSink tokens{filter, logprobs ? &*logprobs : nullptr, prompt.echo_text, prompt.ids,
                         reasoning_end};
        std::optional<HarmonyReader> harmony_reader;
        if (harmony) tokens.harmony = &harmony_reader.emplace(*harmony_tokens_);
        std::string text;
        done[i] = GenerateChoice(
            *agent_, kept, choices[i],
            [&](const TokenEvent& event) {
              text += tokens.Push(event);
              return !filter.stopped() && !cancelled();
            },
            *caller, cancelled);
        // The last message's text: what the detokenizer held back (a character cut short).
        std::optional<std::string> reasoning;
        if (harmony_reader) {
          HarmonyReader::Parts parts = tokens.FinishHarmony(done[i].text());
          reasoning = std::move(parts.reasoning);
          text += filter.Push(parts.content);
        } else {
          text += filter.Push(done[i].text());
        }
        text += filter.Flush();
        std::string finish_reason = FinishReasonText(done[i].finish_reason(), filter.stopped());
        if (reasoning_end) {
          ReasoningSplitter::Parts parts = SplitReasoning(text);
          reasoning = std::move(parts.reasoning);
          text = std::move(parts.content);
        }
        std::vector<ToolCall> calls;
        if (harmony_reader) {
          TakeHarmonyCalls(*harmony_reader, tool_reader, text, calls, finish_reason);
        } else if (tool_reader) {
          ToolCallReading reading = tool_reader->Read(text);
          if (!reading.calls.empty()) {
            text = std::move(reading.content);
            calls = std::move(reading.calls);
            if (finish_reason == "stop") finish_reason = "tool_calls";
          }
        }
        if (turn) {  // one choice
          if (reasoning && !reasoning->empty()) turn->builder.Reasoning(*reasoning);
          turn->builder.Text(text, logprobs ? logprobs->Take()["content"] : Json::array());
          turn->builder.Finish("", calls, finish_reason == "length",
                               ResponseUsage(done[i], tokens.reasoning_tokens));
          if (cancelled() && done[i].finish_reason() == v1::FINISH_REASON_CANCELLED) {
            turn->builder.Cancel();
          }
          return;
        }
        if (reasoning_end || harmony) reasoning_counts[i] = tokens.reasoning_tokens;
        rendered[i] = completion.Choice(
            i, text, finish_reason, logprobs ? logprobs->Take() : Json(nullptr),
            calls.empty() ? Json(nullptr) : ToolCallsJson(calls, /*streamed=*/false), reasoning);
      });
      ForgetKeptPrompts(*agent_, kept, request.n, done);
      for (const v1::GenerateResponse& answer : done) {
        if (failed(answer)) return SendError(res, generation_error(answer));
      }
      if (turn) {
        Keep(*responses_, *conversations_, *turn, *caller);
        StoreChanged();
        res.set_content(turn->builder.response().dump(), "application/json");
        return;
      }
      res.set_content(
          completion.Whole(Json(std::move(rendered)), Usage(done, request.n, reasoning_counts))
              .dump(),
          "application/json");
      return;
    }

    // The answer as a stream: each chunk (a Responses turn's, each event) through `write`,
    // which says false once the client has gone. False when the client went away.
    const auto stream =
        [this, choices, completion, request, caller = *caller, generation_error, failed, slot,
         places, make_logprobs, prompts, tool_reader, call_required, reasoning_end, harmony,
         turn](const std::function<bool(const Json&)>& write) {
          // The choices stream at once, each chunk whole under the lock.
          std::mutex sink_mutex;
          std::atomic<bool> client_gone = false;
          const auto send = [&](const Json& chunk) {
            std::lock_guard<std::mutex> lock(sink_mutex);
            if (client_gone || !write(chunk)) client_gone = true;
            return !client_gone;
          };
          // A background response's cancel stops it, even while it waits for a cloud.
          const auto cancelled = [&turn] { return turn && turn->cancel_requested.load(); };
          const auto send_all = [&](const std::vector<Json>& events) {
            for (const Json& event : events) {
              if (!send(event)) return false;
            }
            return true;
          };
          if (turn) send_all(turn->builder.Start());
          std::vector<v1::GenerateResponse> done(choices.size());
          std::vector<int64_t> reasoning_counts(reasoning_end || harmony ? choices.size() : 0);
          // Nothing is written while the prompt is kept, so only a cancel can end it.
          const KeptPrompts kept =
              KeepPrompts(*agent_, choices, request.n, places, caller, cancelled);
          RunEach(static_cast<int64_t>(choices.size()), places, [&](int64_t i) {
            if (client_gone) return;  // a choice not yet begun when the client went
            const PromptPlan& prompt = prompts[choices[i].prompt];
            StopSequenceFilter filter(request.stop, request.include_stop_str_in_output);
            std::optional<LogprobsRenderer> logprobs = make_logprobs(prompt);
            TokenSink tokens{filter, logprobs ? &*logprobs : nullptr, prompt.echo_text, prompt.ids,
                             reasoning_end};
            std::optional<HarmonyReader> harmony_reader;
            if (harmony) tokens.harmony = &harmony_reader.emplace(*harmony_tokens_);
            // Text that may be a tool call is held back until the answer ends (gpt-oss's
            // calls are held by its reader).
            std::optional<ToolCallHoldback> holdback;
            if (tool_reader && !harmony) holdback.emplace(tool_reader->syntax(), call_required);
            const auto release = [&](const std::string& text) {
              return holdback ? holdback->Push(text) : text;
            };
            // A thinking model's answer: reasoning until </think>, then content. A response
            // (turn) streams its reasoning in a reasoning item before its message.
            std::optional<ReasoningSplitter> splitter;
            if (reasoning_end) splitter.emplace();
            const auto split = [&](const std::string& text) {
              if (harmony_reader) {
                return ReasoningSplitter::Parts{.reasoning = tokens.TakeReasoning(),
                                                .content = text};
              }
              if (!splitter) return ReasoningSplitter::Parts{.content = text};
              return splitter->Push(text);
            };
            const auto turn_events = [&](const ReasoningSplitter::Parts& parts,
                                         const Json& text_logprobs) {
              std::vector<Json> events = turn->builder.ReasoningText(parts.reasoning);
              for (Json& event : turn->builder.Text(parts.content, text_logprobs)) {
                events.push_back(std::move(event));
              }
              return events;
            };
            bool first = true;
            done[i] = GenerateChoice(
                *agent_, kept, choices[i],
                [&](const TokenEvent& event) {
                  const ReasoningSplitter::Parts parts = split(tokens.Push(event));
                  const std::string text = release(parts.content);
                  // A token whose text is held back (it may begin a stop sequence) still
                  // sends its log-probability.
                  const bool has_logprobs = logprobs && !logprobs->empty();
                  if (turn) {  // one choice
                    const Json text_logprobs =
                        has_logprobs ? logprobs->Take()["content"] : Json::array();
                    return send_all(turn_events({parts.reasoning, text}, text_logprobs)) &&
                           !filter.stopped() && !cancelled();
                  }
                  if (!text.empty() || !parts.reasoning.empty() || first || has_logprobs) {
                    if (!send(completion.Chunk(i, text, nullptr, first,
                                               has_logprobs ? logprobs->Take() : Json(nullptr),
                                               nullptr, parts.reasoning))) {
                      return false;
                    }
                    first = false;
                  }
                  return !filter.stopped();
                },
                caller, cancelled);
            if (client_gone) return;
            if (failed(done[i])) {
              if (turn) {
                send_all(turn->builder.Fail(generation_error(done[i]).message));
              } else {
                send(Json(generation_error(done[i]).ToJson()));
              }
              return;
            }
            std::string tail;
            std::string tail_reasoning;
            if (harmony_reader) {
              HarmonyReader::Parts parts = tokens.FinishHarmony(done[i].text());
              tail_reasoning = std::move(parts.reasoning);
              tail = filter.Push(parts.content);
            } else {
              tail = filter.Push(done[i].text());
            }
            tail += filter.Flush();
            if (splitter) {
              ReasoningSplitter::Parts parts = splitter->Push(tail);
              ReasoningSplitter::Parts rest = splitter->Flush();
              tail_reasoning = parts.reasoning + rest.reasoning;
              tail = parts.content + rest.content;
            }
            tail = release(tail);
            std::string finish_reason =
                FinishReasonText(done[i].finish_reason(), filter.stopped());
            std::vector<ToolCall> calls;
            if (harmony_reader) {
              TakeHarmonyCalls(*harmony_reader, tool_reader, tail, calls, finish_reason);
            } else if (holdback) {
              ToolCallReading reading = tool_reader->Read(holdback->text());
              if (reading.calls.empty()) {
                tail += holdback->held();  // not calls: the model's text
              } else {
                calls = std::move(reading.calls);
                if (finish_reason == "stop") finish_reason = "tool_calls";
              }
            }
            if (turn) {
              std::vector<Json> events = turn->builder.ReasoningText(tail_reasoning);
              for (Json& event :
                   turn->builder.Finish(tail, calls, finish_reason == "length",
                                        ResponseUsage(done[i], tokens.reasoning_tokens))) {
                events.push_back(std::move(event));
              }
              // A cancelled background response ends without its completion's events (it
              // did not complete): GET shows it cancelled, with what it had generated.
              const bool was_cancelled =
                  cancelled() && done[i].finish_reason() == v1::FINISH_REASON_CANCELLED;
              if (was_cancelled) turn->builder.Cancel();
              // Kept before its last event is sent: a client may ask for it at once.
              Keep(*responses_, *conversations_, *turn, caller);
              StoreChanged();
              if (!was_cancelled) send_all(events);
              return;
            }
            Json tool_calls =
                calls.empty() ? Json(nullptr) : ToolCallsJson(calls, /*streamed=*/true);
            if (!tail.empty() || !tail_reasoning.empty() || !tool_calls.is_null()) {
              send(completion.Chunk(i, tail, nullptr, first, nullptr, std::move(tool_calls),
                                    tail_reasoning));
              first = false;
            }
            send(completion.Chunk(i, "", finish_reason, first));
            if (reasoning_end || harmony) reasoning_counts[i] = tokens.reasoning_tokens;
          });
          ForgetKeptPrompts(*agent_, kept, request.n, done);
          if (client_gone) {
            spdlog::info("openai: {}: the client went away; request cancelled", completion.id);
            return false;
          }
          if (!turn && request.include_usage && std::none_of(done.begin(), done.end(), failed)) {
            send(completion.UsageChunk(Usage(done, request.n, reasoning_counts)));
          }
          return true;
        };
    if (turn && turn->events) {
      // A background response's: this is its own thread, and the events go to its log, which
      // the clients following it read (they come and go; the generation does not stop).
      stream([&turn](const Json& event) {
        turn->events->Append({event});
        return true;
      });
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [stream, turn](size_t, httplib::DataSink& sink) {
          const bool stayed = stream([&](const Json& chunk) {
            const std::string event = turn ? ResponseEvent(chunk) : Event(chunk);
            return sink.write(event.data(), event.size());
          });
          if (!stayed) return false;
          if (!turn) {  // a Responses stream ends with its last event, no [DONE]
            const std::string end = "data: [DONE]\n\n";
            sink.write(end.data(), end.size());
          }
          sink.done();
          return true;
        });
  };
  // vLLM's /tokenize and /detokenize, on the device's own tokenizer: an app can count a
  // prompt's tokens against the context (a chat's as its completion would render it) without
  // the text leaving the device.
  server_->Post("/tokenize", [this, authenticate, answering](const httplib::Request& req,
                                                             httplib::Response& res) {
    answering(req);
    if (!authenticate(req, res)) return;
    auto parsed = ParseTokenizeRequest(req.body, options_.model_name);
    if (auto* error = std::get_if<OpenAiError>(&parsed)) return SendError(res, *error);
    const TokenizeRequest& request = std::get<TokenizeRequest>(parsed);
    auto encoded =
        request.messages.empty()
            ? TextPromptIds(agent_->tokenizer(), request.prompt, request.add_special_tokens)
            : ChatPromptIds(request.messages, ToolTexts(request.tools), request.chat_options);
    if (auto* error = std::get_if<OpenAiError>(&encoded)) return SendError(res, *error);
    const std::vector<int32_t>& ids = std::get<std::vector<int32_t>>(encoded);
    res.set_content(Json{{"count", ids.size()},
                         {"max_model_len", agent_->Info().max_context()},
                         {"tokens", ids}}
                        .dump(),
                    "application/json");
  });
  server_->Post("/detokenize", [this, authenticate, answering](const httplib::Request& req,
                                                               httplib::Response& res) {
    answering(req);
    if (!authenticate(req, res)) return;
    auto parsed = ParseDetokenizeRequest(req.body, options_.model_name);
    if (auto* error = std::get_if<OpenAiError>(&parsed)) return SendError(res, *error);
    const Tokenizer& tokenizer = agent_->tokenizer();
    std::vector<int32_t> ids;
    for (const int64_t id : std::get<DetokenizeRequest>(parsed).tokens) {
      if (id >= tokenizer.vocab_size()) {
        return SendError(res, OutsideVocabulary(tokenizer, "tokens", id));
      }
      ids.push_back(static_cast<int32_t>(id));
    }
    auto text = tokenizer.Decode(ids);
    if (!text.ok()) {
      return SendError(res, OpenAiError{.param = "tokens",
                                        .message = std::string(text.status().message())});
    }
    res.set_content(Json{{"prompt", *text}}.dump(), "application/json");
  });
  const auto complete = [this, authenticate, answering, serve](OpenAiEndpoint endpoint,
                                                               const httplib::Request& req,
                                                               httplib::Response& res) {
    answering(req);
    const std::optional<std::string> caller = authenticate(req, res);
    if (!caller) return;
    auto parsed = ParseOpenAiRequest(endpoint, req.body, options_.model_name);
    if (auto* error = std::get_if<OpenAiError>(&parsed)) return SendError(res, *error);
    serve(std::get<OpenAiRequest>(parsed), caller, res, nullptr);
  };
  server_->Post("/v1/chat/completions",
                [complete](const httplib::Request& req, httplib::Response& res) {
                  complete(OpenAiEndpoint::kChatCompletions, req, res);
                });
  server_->Post("/v1/completions", [complete](const httplib::Request& req, httplib::Response& res) {
    complete(OpenAiEndpoint::kCompletions, req, res);
  });

  // OpenAI's Responses API: a chat completion in another shape, whose conversation the agent
  // keeps (previous_response_id names it) instead of the client sending it back.
  server_->Post("/v1/responses", [this, authenticate, answering, serve](const httplib::Request& req,
                                                                        httplib::Response& res) {
    answering(req);
    const std::optional<std::string> caller = authenticate(req, res);
    if (!caller) return;
    auto parsed = ParseResponsesRequest(req.body, options_.model_name);
    if (auto* error = std::get_if<OpenAiError>(&parsed)) return SendError(res, *error);
    OpenAiResponsesRequest& given = std::get<OpenAiResponsesRequest>(parsed);
    const std::string id = NewResponseId();
    auto turn = std::make_shared<ResponsesTurn>(
        id, given.store, ResponseBuilder(id, UnixSeconds(), options_.model_name, given.echo));
    if (!given.previous_response_id.empty()) {
      std::optional<ResponseStore::Stored> previous =
          responses_->Find(given.previous_response_id, *caller);
      if (!previous) {
        return SendError(res,
                         OpenAiError{.param = "previous_response_id",
                                     .code = "previous_response_not_found",
                                     .message = absl::StrCat(
                                         "Previous response with id '", given.previous_response_id,
                                         "' not found (it was not stored, was deleted or "
                                         "forgotten, or is another app's)")});
      }
      // A background response still running, or one that failed, has no answer to follow.
      const std::string status = previous->response.value("status", "");
      if (status == "in_progress" || status == "queued" || status == "failed") {
        return SendError(res, OpenAiError{.param = "previous_response_id",
                                          .message = absl::StrCat(
                                              "Previous response with id '",
                                              given.previous_response_id, "' is ", status,
                                              status == "failed" ? ": it has no answer to follow"
                                                                 : "; wait until it is done (GET "
                                                                   "/v1/responses/{id})")});
      }
      turn->conversation = std::move(previous->conversation);
    }
    if (!given.conversation_id.empty()) {
      std::optional<std::vector<Json>> items =
          conversations_->Items(given.conversation_id, *caller);
      if (!items)
        return SendError(res, ConversationNotFound(given.conversation_id, "conversation"));
      turn->conversation = ConversationItemsAsChat(*items);
      turn->conversation_id = given.conversation_id;
      turn->input = given.chat.messages;  // added to the conversation with the answer
    }
    turn->conversation.insert(turn->conversation.end(), given.chat.messages.begin(),
                              given.chat.messages.end());
    OpenAiRequest& request = given.chat;
    request.messages.clear();
    if (given.instructions) {
      request.messages.push_back({.role = "system", .content = *given.instructions});
    }
    request.messages.insert(request.messages.end(), turn->conversation.begin(),
                            turn->conversation.end());
    if (!given.background) return serve(request, caller, res, std::move(turn));
    // Background: answered now with the response in progress (kept, so that GET finds it),
    // generated on its own thread, which keeps the answer when it ends as a foreground
    // response's is kept, or the failure.
    if (completions_running_.load() >= options_.max_concurrent_requests) {
      res.set_header("Retry-After", "1");
      return SendError(res, Busy(options_.max_concurrent_requests));
    }
    if (request.stream) turn->events = std::make_shared<ResponseEventLog>();
    responses_->Put(id, *caller,
                    {.conversation = turn->conversation,
                     .response = turn->builder.response(),
                     .events = turn->events});
    StoreChanged();
    if (turn->events) {
      // Streamed as it is generated, from its log: a client that goes away stops reading, not
      // the generation, and may come back for the rest (GET ...?stream=true&starting_after).
      FollowEvents(res, turn->events, 0);
    } else {
      res.set_content(turn->builder.response().dump(), "application/json");
    }
    background_->Start(id, *caller, turn, [this, serve, request, caller = *caller, turn] {
      // Its followers end when the log does, however the generation ends.
      struct CloseLog {
        ResponsesTurn& turn;
        ~CloseLog() {
          if (turn.events) turn.events->Close();
        }
      } close_log{*turn};
      httplib::Response answer;
      try {
        serve(request, caller, answer, turn);
      } catch (const std::exception& e) {
        // On a handler's thread httplib turns this into a 500; on this one it would end
        // the agent. The response fails instead.
        spdlog::error("openai: {}: background response failed: {}", turn->id, e.what());
        answer.status = 500;
        answer.body = Json{{"error",
                            {{"message", absl::StrCat("internal error: ", e.what())},
                             {"code", "server_error"}}}}
                          .dump();
      }
      if (answer.status < 400) {
        // Kept by serve, but for a streamed answer that failed (its events say so).
        if (turn->builder.response().value("status", "") == "failed") {
          responses_->Put(turn->id, caller,
                          {.conversation = turn->conversation,
                           .response = turn->builder.response(),
                           .events = turn->events});
        } else if (turn->events) {
          // Kept again with all its events, which the bound now counts whole.
          if (auto kept = responses_->Find(turn->id, caller)) {
            responses_->Put(turn->id, caller, *std::move(kept));
          }
        }
        StoreChanged();
        return;
      }
      // Refused or failed before an answer (429 when the places filled meanwhile, an input
      // past the context, an error of the generation): kept as failed, with the error.
      const Json body = Json::parse(answer.body, nullptr, false);
      const Json* error = body.is_object() && body.contains("error") && body["error"].is_object()
                              ? &body["error"]
                              : nullptr;
      if (turn->cancel_requested) {
        turn->builder.Cancel();
      } else {
        // A stream's followers see it begin and fail.
        if (turn->events) turn->events->Append(turn->builder.Start());
        std::vector<Json> failure = turn->builder.Fail(
            error != nullptr && (*error)["message"].is_string()
                ? (*error)["message"].get<std::string>()
                : answer.body,
            error != nullptr && (*error)["code"].is_string() ? (*error)["code"].get<std::string>()
                                                             : "server_error");
        if (turn->events) turn->events->Append(std::move(failure));
      }
      responses_->Put(turn->id, caller,
                      {.conversation = turn->conversation,
                       .response = turn->builder.response(),
                       .events = turn->events});
      StoreChanged();
    });
  });
  server_->Post(
      "/v1/responses/([^/]+)/cancel",
      [this, authenticate, answering](const httplib::Request& req, httplib::Response& res) {
        answering(req);
        const std::optional<std::string> caller = authenticate(req, res);
        if (!caller) return;
        const std::string id = req.matches[1];
        // Returns once the generation has stopped and what it left is kept.
        background_->CancelAndWait(id, *caller, *agent_);
        std::optional<ResponseStore::Stored> stored = responses_->Find(id, *caller);
        if (!stored) return SendError(res, ResponseNotFound(id));
        if (stored->response.value("background", false) != true) {
          return SendError(res, OpenAiError{.message = absl::StrCat(
                                                "Response '", id,
                                                "' was not created with 'background': only a "
                                                "background response can be cancelled")});
        }
        // A response that ended before the cancel is returned as it ended (cancelling twice
        // returns the same), as OpenAI's.
        res.set_content(stored->response.dump(), "application/json");
      });
  server_->Get("/v1/responses/([^/]+)", [this, authenticate, answering](const httplib::Request& req,
                                                                        httplib::Response& res) {
    answering(req);
    const std::optional<std::string> caller = authenticate(req, res);
    if (!caller) return;
    const std::string id = req.matches[1];
    const std::string stream = req.get_param_value("stream");
    if (!stream.empty() && stream != "true" && stream != "false") {
      return SendError(res, OpenAiError{.param = "stream",
                                        .message = absl::StrCat("stream must be 'true' or "
                                                                "'false', not '",
                                                                stream, "'")});
    }
    int64_t starting_after = -1;
    if (req.has_param("starting_after")) {
      const std::string given = req.get_param_value("starting_after");
      if (!absl::SimpleAtoi(given, &starting_after) || starting_after < 0) {
        return SendError(res,
                         OpenAiError{.param = "starting_after",
                                     .message = absl::StrCat("starting_after must be an event's "
                                                             "sequence_number (0 or more), not '",
                                                             given, "'")});
      }
      if (stream != "true") {
        return SendError(res, OpenAiError{.param = "starting_after",
                                          .message = "starting_after needs stream=true"});
      }
    }
    std::optional<ResponseStore::Stored> stored = responses_->Find(id, *caller);
    if (!stored) return SendError(res, ResponseNotFound(id));
    if (stream == "true") {
      // A stream resumed: the events after starting_after (all of them without), as they
      // were sent, then those still to come.
      if (!stored->events) {
        return SendError(
            res, OpenAiError{.param = "stream",
                             .message = absl::StrCat("Response '", id,
                                                     "' was not created with 'background' and "
                                                     "'stream': it has no events to stream")});
      }
      return FollowEvents(res, stored->events, stored->events->IndexAfter(starting_after));
    }
    res.set_content(stored->response.dump(), "application/json");
  });
  server_->Get("/v1/responses/([^/]+)/input_items", [this, authenticate, answering](
                                                        const httplib::Request& req,
                                                        httplib::Response& res) {
    answering(req);
    const std::optional<std::string> caller = authenticate(req, res);
    if (!caller) return;
    const std::string id = req.matches[1];
    auto parsed = ItemsQueryOf(req);
    if (auto* error = std::get_if<OpenAiError>(&parsed)) return SendError(res, *error);
    const InputItemsQuery& query = std::get<InputItemsQuery>(parsed);
    std::optional<ResponseStore::Stored> stored = responses_->Find(id, *caller);
    if (!stored) return SendError(res, ResponseNotFound(id));
    std::optional<Json> page = InputItemsPage(id, stored->conversation, query);
    if (!page) {
      return SendError(res, OpenAiError{.param = "after",
                                        .message = absl::StrCat("No input item '", query.after,
                                                                "' in response '", id, "'")});
    }
    res.set_content(page->dump(), "application/json");
  });
  server_->Delete(
      "/v1/responses/([^/]+)",
      [this, authenticate, answering](const httplib::Request& req, httplib::Response& res) {
        answering(req);
        const std::optional<std::string> caller = authenticate(req, res);
        if (!caller) return;
        const std::string id = req.matches[1];
        // A background response still running is cancelled first.
        background_->CancelAndWait(id, *caller, *agent_);
        if (!responses_->Delete(id, *caller)) return SendError(res, ResponseNotFound(id));
        StoreChanged();
        res.set_content(Json{{"id", id}, {"object", "response"}, {"deleted", true}}.dump(),
                        "application/json");
      });

  // OpenAI's Conversations API: conversations kept as Responses items, per app, which a
  // response made with `conversation` reads before its input and then continues.
  // Each handler gets the caller's app name once the request is authenticated.
  using ConversationHandler =
      std::function<void(const httplib::Request&, httplib::Response&, const std::string&)>;
  const auto as_caller = [authenticate, answering](ConversationHandler handler) {
    return [authenticate, answering, handler](const httplib::Request& req, httplib::Response& res) {
      answering(req);
      const std::optional<std::string> caller = authenticate(req, res);
      if (caller) handler(req, res, *caller);
    };
  };
  const auto send_json = [](httplib::Response& res, const Json& json) {
    res.set_content(json.dump(), "application/json");
  };
  server_->Post("/v1/conversations",
                as_caller([this, send_json](const httplib::Request& req, httplib::Response& res,
                                            const std::string& caller) {
                  auto parsed = ParseConversationCreate(req.body);
                  if (auto* error = std::get_if<OpenAiError>(&parsed)) {
                    return SendError(res, *error);
                  }
                  ConversationCreateRequest& given = std::get<ConversationCreateRequest>(parsed);
                  std::optional<Json> created = conversations_->Create(
                      caller, UnixSeconds(), std::move(given.metadata), std::move(given.items));
                  StoreChanged();
                  if (!created) {
                    return SendError(res, OpenAiError{.param = "items",
                                                      .message = "the conversation is larger "
                                                                 "than "
                                                                 "openai.max_stored_response_"
                                                                 "bytes"});
                  }
                  send_json(res, *created);
                }));
  server_->Get("/v1/conversations/([^/]+)",
               as_caller([this, send_json](const httplib::Request& req, httplib::Response& res,
                                           const std::string& caller) {
                 const std::string id = req.matches[1];
                 std::optional<Json> found = conversations_->Get(id, caller);
                 if (!found) return SendError(res, ConversationNotFound(id));
                 send_json(res, *found);
               }));
  server_->Post("/v1/conversations/([^/]+)",
                as_caller([this, send_json](const httplib::Request& req, httplib::Response& res,
                                            const std::string& caller) {
                  const std::string id = req.matches[1];
                  auto metadata = ParseConversationUpdate(req.body);
                  if (auto* error = std::get_if<OpenAiError>(&metadata)) {
                    return SendError(res, *error);
                  }
                  std::optional<Json> updated =
                      conversations_->SetMetadata(id, caller, std::get<Json>(std::move(metadata)));
                  StoreChanged();
                  if (!updated) return SendError(res, ConversationNotFound(id));
                  send_json(res, *updated);
                }));
  server_->Delete(
      "/v1/conversations/([^/]+)",
      as_caller([this, send_json](const httplib::Request& req, httplib::Response& res,
                                  const std::string& caller) {
        const std::string id = req.matches[1];
        if (!conversations_->Delete(id, caller)) {
          return SendError(res, ConversationNotFound(id));
        }
        StoreChanged();
        send_json(res, Json{{"id", id}, {"object", "conversation.deleted"}, {"deleted", true}});
      }));
  server_->Post("/v1/conversations/([^/]+)/items",
                as_caller([this, send_json](const httplib::Request& req, httplib::Response& res,
                                            const std::string& caller) {
                  const std::string id = req.matches[1];
                  auto items = ParseConversationItemsAdd(req.body);
                  if (auto* error = std::get_if<OpenAiError>(&items)) {
                    return SendError(res, *error);
                  }
                  std::vector<Json> added = std::get<std::vector<Json>>(std::move(items));
                  const InputItemsQuery all{.limit = static_cast<int64_t>(added.size()),
                                            .ascending = true};
                  std::optional<Json> page = ItemsPage(added, all);
                  if (!conversations_->Append(id, caller, std::move(added))) {
                    StoreChanged();
                    return SendError(res, ConversationNotFound(id));
                  }
                  StoreChanged();
                  send_json(res, *page);
                }));
  server_->Get("/v1/conversations/([^/]+)/items",
               as_caller([this, send_json](const httplib::Request& req, httplib::Response& res,
                                           const std::string& caller) {
                 const std::string id = req.matches[1];
                 auto parsed = ItemsQueryOf(req);
                 if (auto* error = std::get_if<OpenAiError>(&parsed)) {
                   return SendError(res, *error);
                 }
                 std::optional<std::vector<Json>> items = conversations_->Items(id, caller);
                 if (!items) return SendError(res, ConversationNotFound(id));
                 const InputItemsQuery& query = std::get<InputItemsQuery>(parsed);
                 std::optional<Json> page = ItemsPage(*std::move(items), query);
                 if (!page) {
                   return SendError(
                       res, OpenAiError{.param = "after",
                                        .message = absl::StrCat("No item '", query.after,
                                                                "' in conversation '", id, "'")});
                 }
                 send_json(res, *page);
               }));
  server_->Get(
      "/v1/conversations/([^/]+)/items/([^/]+)",
      as_caller([this, send_json](const httplib::Request& req, httplib::Response& res,
                                  const std::string& caller) {
        const std::string id = req.matches[1];
        const std::string item_id = req.matches[2];
        if (!conversations_->Get(id, caller)) {
          return SendError(res, ConversationNotFound(id));
        }
        std::optional<Json> item = conversations_->Item(id, caller, item_id);
        if (!item) {
          return SendError(res, ItemNotFound(item_id, id));
        }
        send_json(res, *item);
      }));
  server_->Delete(
      "/v1/conversations/([^/]+)/items/([^/]+)",
      as_caller([this, send_json](const httplib::Request& req, httplib::Response& res,
                                  const std::string& caller) {
        const std::string id = req.matches[1];
        const std::string item_id = req.matches[2];
        if (!conversations_->Get(id, caller)) {
          return SendError(res, ConversationNotFound(id));
        }
        std::optional<Json> conversation = conversations_->DeleteItem(id, caller, item_id);
        if (!conversation) {
          return SendError(res, ItemNotFound(item_id, id));
        }
        StoreChanged();
        send_json(res, *conversation);
      }));
}

}  // namespace tophat
