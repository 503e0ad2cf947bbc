#include "device_agent/openai_responses.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tophat {
namespace {

using Json = nlohmann::ordered_json;

std::mt19937_64& Rng() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng;
}

// An id as OpenAI's look: a prefix and 48 hex digits.
std::string NewId(std::string_view prefix) {
  return absl::StrFormat("%s_%016x%016x%016x", prefix, Rng()(), Rng()(), Rng()());
}

// A call's id, as chat's tool calls have them: "call_" and 24 letters and digits.
std::string NewCallId() {
  constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[Rng()() % kAlphabet.size()];
  return id;
}

Json ReasoningPart(std::string_view text) {
  return Json{{"type", "reasoning_text"}, {"text", text}};
}

Json TextPart(const std::string& text, const Json& logprobs) {
  return Json{{"type", "output_text"},
              {"text", text},
              {"annotations", Json::array()},
              {"logprobs", logprobs}};
}

int64_t MessageBytes(const ChatMessage& message) {
  int64_t bytes =
      static_cast<int64_t>(sizeof(ChatMessage) + message.role.size() + message.content.size() +
                           message.tool_call_id.size() + message.reasoning.value_or("").size());
  for (const ToolCall& call : message.tool_calls) {
    bytes += static_cast<int64_t>(sizeof(ToolCall) + call.id.size() + call.name.size() +
                                  call.arguments.size());
  }
  return bytes;
}

}  // namespace

std::string NewResponseId() { return NewId("resp"); }

std::string NewItemId(std::string_view prefix) { return NewId(prefix); }

Json ResponsesUsage(int64_t input_tokens, int64_t cached_tokens, int64_t output_tokens,
                    int64_t reasoning_tokens) {
  return Json{{"input_tokens", input_tokens},
              {"input_tokens_details", {{"cached_tokens", cached_tokens}}},
              {"output_tokens", output_tokens},
              {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
              {"total_tokens", input_tokens + output_tokens}};
}

std::vector<Json> ChatMessagesAsItems(
    std::span<const ChatMessage> messages,
    const std::function<std::string(std::string_view prefix, size_t index)>& make_id) {
  std::vector<Json> items;
  const auto id = [&](std::string_view prefix) { return make_id(prefix, items.size()); };
  for (const ChatMessage& message : messages) {
    if (message.role == "tool") {
      items.push_back(Json{{"id", id("fco")},
                           {"type", "function_call_output"},
                           {"status", "completed"},
                           {"call_id", message.tool_call_id},
                           {"output", message.content}});
    } else if (message.role == "assistant") {
      if (!message.content.empty() || message.tool_calls.empty()) {
        items.push_back(Json{{"id", id("msg")},
                             {"type", "message"},
                             {"status", "completed"},
                             {"role", "assistant"},
                             {"content", Json::array({TextPart(message.content, Json::array())})}});
      }
      for (const ToolCall& call : message.tool_calls) {
        items.push_back(Json{{"id", id("fc")},
                             {"type", "function_call"},
                             {"status", "completed"},
                             {"call_id", call.id},
                             {"name", call.name},
                             {"arguments", call.arguments}});
      }
    } else {
      items.push_back(Json{
          {"id", id("msg")},
          {"type", "message"},
          {"status", "completed"},
          {"role", message.role},
          {"content", Json::array({Json{{"type", "input_text"}, {"text", message.content}}})}});
    }
  }
  return items;
}

std::optional<Json> ItemsPage(std::vector<Json> items, const InputItemsQuery& query) {
  if (!query.ascending) std::reverse(items.begin(), items.end());
  size_t begin = 0;
  if (!query.after.empty()) {
    const auto it = std::find_if(items.begin(), items.end(),
                                 [&](const Json& item) { return item["id"] == query.after; });
    if (it == items.end()) return std::nullopt;
    begin = static_cast<size_t>(it - items.begin()) + 1;
  }
  const size_t end =
      std::min(items.size(), begin + static_cast<size_t>(std::max<int64_t>(query.limit, 0)));
  Json data = Json::array();
  for (size_t i = begin; i < end; ++i) data.push_back(std::move(items[i]));
  Json page = {{"object", "list"}, {"data", data}};
  page["first_id"] = data.empty() ? Json(nullptr) : data.front()["id"];
  page["last_id"] = data.empty() ? Json(nullptr) : data.back()["id"];
  page["has_more"] = end < items.size();
  return page;
}

std::optional<Json> InputItemsPage(std::string_view response_id,
                                   std::span<const ChatMessage> conversation,
                                   const InputItemsQuery& query) {
  std::string_view suffix = response_id;
  if (suffix.starts_with("resp_")) suffix.remove_prefix(5);
  // Ids made from the response's and the item's place: the same on every call.
  const size_t inputs = conversation.empty() ? 0 : conversation.size() - 1;
  return ItemsPage(ChatMessagesAsItems(conversation.first(inputs),
                                       [&](std::string_view prefix, size_t index) {
                                         return absl::StrCat(std::string(prefix), "_",
                                                             std::string(suffix), "_", index);
                                       }),
                   query);
}

ResponseBuilder::ResponseBuilder(std::string id, int64_t created_at, std::string model, Json echo)
    : id_(std::move(id)) {
  response_ = Json{{"id", id_},
                   {"object", "response"},
                   {"created_at", created_at},
                   {"status", "in_progress"},
                   {"error", nullptr},
                   {"incomplete_details", nullptr}};
  for (auto& [key, value] : echo.items()) response_[key] = std::move(value);
  response_["model"] = std::move(model);
  response_["output"] = Json::array();
  if (!response_.contains("reasoning")) {
    response_["reasoning"] = {{"effort", nullptr}, {"summary", nullptr}};
  }
  response_["usage"] = nullptr;
}

Json ResponseBuilder::Event(std::string_view type, Json fields) {
  Json event = {{"type", type}};
  for (auto& [key, value] : fields.items()) event[key] = std::move(value);
  event["sequence_number"] = sequence_++;
  return event;
}

Json ResponseBuilder::Snapshot(std::string_view status) const {
  Json snapshot = response_;
  snapshot["status"] = status;
  snapshot["output"] = output_;
  return snapshot;
}

Json ResponseBuilder::MessageItem(std::string_view status) const {
  return Json{{"type", "message"},
              {"id", message_id_},
              {"status", status},
              {"role", "assistant"},
              {"content", status == "in_progress" ? Json::array()
                                                  : Json::array({TextPart(text_, logprobs_)})}};
}

std::vector<Json> ResponseBuilder::Start() {
  std::vector<Json> events;
  events.push_back(Event("response.created", {{"response", Snapshot("in_progress")}}));
  events.push_back(Event("response.in_progress", {{"response", Snapshot("in_progress")}}));
  return events;
}

Json ResponseBuilder::ReasoningItem(std::string_view status) const {
  return Json{{"type", "reasoning"},
              {"id", reasoning_id_},
              {"summary", Json::array()},
              {"content",
               status == "in_progress" ? Json::array() : Json::array({ReasoningPart(reasoning_)})},
              {"status", status}};
}

std::vector<Json> ResponseBuilder::ReasoningText(std::string_view delta) {
  std::vector<Json> events;
  if (delta.empty()) return events;
  if (reasoning_id_.empty()) {
    reasoning_id_ = NewId("rs");
    events.push_back(Event("response.output_item.added", {{"output_index", output_.size()},
                                                          {"item", ReasoningItem("in_progress")}}));
    events.push_back(Event("response.content_part.added", {{"item_id", reasoning_id_},
                                                           {"output_index", output_.size()},
                                                           {"content_index", 0},
                                                           {"part", ReasoningPart("")}}));
  }
  reasoning_ += delta;
  events.push_back(Event("response.reasoning_text.delta", {{"item_id", reasoning_id_},
                                                           {"output_index", output_.size()},
                                                           {"content_index", 0},
                                                           {"delta", delta}}));
  return events;
}

void ResponseBuilder::CloseReasoning(std::vector<Json>& events, std::string_view status) {
  if (reasoning_id_.empty()) return;
  events.push_back(Event("response.reasoning_text.done", {{"item_id", reasoning_id_},
                                                          {"output_index", output_.size()},
                                                          {"content_index", 0},
                                                          {"text", reasoning_}}));
  events.push_back(Event("response.content_part.done", {{"item_id", reasoning_id_},
                                                        {"output_index", output_.size()},
                                                        {"content_index", 0},
                                                        {"part", ReasoningPart(reasoning_)}}));
  Json item = ReasoningItem(status);
  events.push_back(
      Event("response.output_item.done", {{"output_index", output_.size()}, {"item", item}}));
  output_.push_back(std::move(item));
  answer_.reasoning = reasoning_;
  reasoning_id_.clear();
}

std::vector<Json> ResponseBuilder::Reasoning(std::string_view text) {
  std::vector<Json> events = ReasoningText(text);
  CloseReasoning(events, "completed");
  return events;
}

void ResponseBuilder::OpenMessage(std::vector<Json>& events) {
  if (!message_id_.empty()) return;
  message_id_ = NewId("msg");
  events.push_back(Event("response.output_item.added",
                         {{"output_index", output_.size()}, {"item", MessageItem("in_progress")}}));
  events.push_back(Event("response.content_part.added", {{"item_id", message_id_},
                                                         {"output_index", output_.size()},
                                                         {"content_index", 0},
                                                         {"part", TextPart("", Json::array())}}));
}

std::vector<Json> ResponseBuilder::Text(std::string_view delta, const Json& logprobs) {
  std::vector<Json> events;
  const bool has_logprobs = logprobs.is_array() && !logprobs.empty();
  if (delta.empty() && !has_logprobs) return events;
  CloseReasoning(events, "completed");
  OpenMessage(events);
  text_ += delta;
  if (has_logprobs) {
    for (const Json& entry : logprobs) logprobs_.push_back(entry);
  }
  events.push_back(
      Event("response.output_text.delta", {{"item_id", message_id_},
                                           {"output_index", output_.size()},
                                           {"content_index", 0},
                                           {"delta", delta},
                                           {"logprobs", has_logprobs ? logprobs : Json::array()}}));
  return events;
}

std::vector<Json> ResponseBuilder::Finish(std::string_view tail, std::span<const ToolCall> calls,
                                          bool cut_short, Json usage) {
  // Reasoning still open at the end was all the answer had: cut short, it is incomplete.
  std::vector<Json> events;
  if (tail.empty()) CloseReasoning(events, cut_short ? "incomplete" : "completed");
  for (Json& event : Text(tail, Json::array())) events.push_back(std::move(event));
  // An answer of calls alone has no message, as OpenAI's; an empty answer has an empty one.
  if (calls.empty()) OpenMessage(events);
  if (!message_id_.empty()) {
    const std::string status = cut_short ? "incomplete" : "completed";
    events.push_back(Event("response.output_text.done", {{"item_id", message_id_},
                                                         {"output_index", output_.size()},
                                                         {"content_index", 0},
                                                         {"text", text_},
                                                         {"logprobs", logprobs_}}));
    events.push_back(Event("response.content_part.done", {{"item_id", message_id_},
                                                          {"output_index", output_.size()},
                                                          {"content_index", 0},
                                                          {"part", TextPart(text_, logprobs_)}}));
    Json item = MessageItem(status);
    events.push_back(
        Event("response.output_item.done", {{"output_index", output_.size()}, {"item", item}}));
    output_.push_back(std::move(item));
  }
  answer_.content = text_;
  for (const ToolCall& call : calls) {
    ToolCall made{.id = NewCallId(), .name = call.name, .arguments = call.arguments};
    Json item = {{"type", "function_call"}, {"id", NewId("fc")}, {"call_id", made.id},
                 {"name", made.name},       {"arguments", ""},   {"status", "in_progress"}};
    const std::string item_id = item["id"];
    events.push_back(
        Event("response.output_item.added", {{"output_index", output_.size()}, {"item", item}}));
    events.push_back(
        Event("response.function_call_arguments.delta",
              {{"item_id", item_id}, {"output_index", output_.size()}, {"delta", made.arguments}}));
    events.push_back(
        Event("response.function_call_arguments.done", {{"item_id", item_id},
                                                        {"output_index", output_.size()},
                                                        {"name", made.name},
                                                        {"arguments", made.arguments}}));
    item["arguments"] = made.arguments;
    item["status"] = "completed";
    events.push_back(
        Event("response.output_item.done", {{"output_index", output_.size()}, {"item", item}}));
    output_.push_back(std::move(item));
    answer_.tool_calls.push_back(std::move(made));
  }
  response_ = Snapshot(cut_short ? "incomplete" : "completed");
  if (cut_short) response_["incomplete_details"] = {{"reason", "max_output_tokens"}};
  response_["usage"] = std::move(usage);
  events.push_back(
      Event(cut_short ? "response.incomplete" : "response.completed", {{"response", response_}}));
  return events;
}

std::vector<Json> ResponseBuilder::Fail(std::string_view message, std::string_view code) {
  response_ = Snapshot("failed");
  response_["error"] = {{"code", code}, {"message", message}};
  return {Event("response.failed", {{"response", response_}})};
}

void ResponseBuilder::Cancel() {
  response_ = Snapshot("cancelled");
  response_["incomplete_details"] = nullptr;
}

void ResponseEventLog::Append(std::vector<Json> events) {
  int64_t added = 0;
  for (const Json& event : events) added += static_cast<int64_t>(event.dump().size());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Json& event : events) events_.push_back(std::move(event));
    bytes_ += added;
  }
  appended_.notify_all();
}

void ResponseEventLog::Close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  appended_.notify_all();
}

ResponseEventLog::Read ResponseEventLog::From(size_t next, std::chrono::milliseconds wait) const {
  std::unique_lock<std::mutex> lock(mutex_);
  appended_.wait_for(lock, wait, [&] { return closed_ || events_.size() > next; });
  Read read;
  for (size_t i = next; i < events_.size(); ++i) read.events.push_back(events_[i]);
  read.ended = closed_;
  return read;
}

size_t ResponseEventLog::IndexAfter(int64_t sequence_number) const {
  std::lock_guard<std::mutex> lock(mutex_);
  // Sequence numbers grow along the log.
  const auto past = std::partition_point(events_.begin(), events_.end(), [&](const Json& event) {
    return event.value("sequence_number", int64_t{-1}) <= sequence_number;
  });
  return static_cast<size_t>(past - events_.begin());
}

int64_t ResponseEventLog::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

int64_t ResponseStore::BytesOf(const std::string& id, const std::string& app,
                               const Stored& stored) {
  int64_t bytes =
      static_cast<int64_t>(sizeof(Stored) + id.size() + app.size() + stored.response.dump().size());
  for (const ChatMessage& message : stored.conversation) bytes += MessageBytes(message);
  if (stored.events) bytes += stored.events->bytes();
  return bytes;
}

void ResponseStore::Put(const std::string& id, const std::string& app, Stored stored) {
  const int64_t bytes = BytesOf(id, app, stored);
  std::lock_guard<std::mutex> lock(mutex_);
  kept_.Put(id, app, std::move(stored), bytes);
}

Json ResponseStore::Encode(const Stored& stored) {
  Json conversation = Json::array();
  for (const ChatMessage& message : stored.conversation) {
    Json calls = Json::array();
    for (const ToolCall& call : message.tool_calls) {
      calls.push_back({{"id", call.id}, {"name", call.name}, {"arguments", call.arguments}});
    }
    conversation.push_back({{"role", message.role},
                            {"content", message.content},
                            {"tool_calls", std::move(calls)},
                            {"tool_call_id", message.tool_call_id}});
    // Only when given: files of answers without it read as before.
    if (message.reasoning) conversation.back()["reasoning"] = *message.reasoning;
  }
  Json events = nullptr;
  if (stored.events) {
    // Kept when it ends (and when it starts, still open: a crash then leaves it open).
    ResponseEventLog::Read read = stored.events->From(0, std::chrono::milliseconds(0));
    events = {{"events", std::move(read.events)}, {"closed", read.ended}};
  }
  return {{"conversation", std::move(conversation)},
          {"response", stored.response},
          {"events", std::move(events)}};
}

absl::StatusOr<ResponseStore::Stored> ResponseStore::Decode(const Json& value) {
  // Written by Encode; anything else is a file changed by hand or by a later format.
  auto text = [](const Json& object, const char* key) -> std::optional<std::string> {
    const auto found = object.find(key);
    if (found == object.end() || !found->is_string()) return std::nullopt;
    return found->get<std::string>();
  };
  if (!value.is_object() || !value.contains("conversation") || !value["conversation"].is_array() ||
      !value.contains("response") || !value["response"].is_object()) {
    return absl::DataLossError("not a kept response: \"conversation\" or \"response\" missing");
  }
  Stored stored{.response = value["response"]};
  for (size_t i = 0; i < value["conversation"].size(); ++i) {
    const Json& entry = value["conversation"][i];
    const auto role = entry.is_object() ? text(entry, "role") : std::nullopt;
    const auto content = entry.is_object() ? text(entry, "content") : std::nullopt;
    const auto tool_call_id = entry.is_object() ? text(entry, "tool_call_id") : std::nullopt;
    if (!role || !content || !tool_call_id || !entry.contains("tool_calls") ||
        !entry["tool_calls"].is_array()) {
      return absl::DataLossError(absl::StrCat("conversation[", i, "] is not a message"));
    }
    ChatMessage message{.role = *role, .content = *content, .tool_call_id = *tool_call_id};
    if (entry.contains("reasoning")) {
      message.reasoning = text(entry, "reasoning");
      if (!message.reasoning) {
        return absl::DataLossError(absl::StrCat("conversation[", i, "].reasoning: not text"));
      }
    }
    for (const Json& call : entry["tool_calls"]) {
      const auto id = call.is_object() ? text(call, "id") : std::nullopt;
      const auto name = call.is_object() ? text(call, "name") : std::nullopt;
      const auto arguments = call.is_object() ? text(call, "arguments") : std::nullopt;
      if (!id || !name || !arguments) {
        return absl::DataLossError(absl::StrCat("conversation[", i, "].tool_calls: not a call"));
      }
      message.tool_calls.push_back({.id = *id, .name = *name, .arguments = *arguments});
    }
    stored.conversation.push_back(std::move(message));
  }
  // A response still generating when its file was last written belongs to a process that
  // stopped without ending it (a stop that runs its course cancels them, and keeps them so):
  // it fails, and a stream resumed from its events ends with the failure.
  const std::string status = stored.response.value("status", "");
  const bool unfinished = status == "in_progress" || status == "queued";
  if (unfinished) {
    stored.response["status"] = "failed";
    stored.response["error"] = {
        {"code", "server_error"},
        {"message", "the agent stopped before this response finished; ask again"}};
  }
  if (value.contains("events") && !value["events"].is_null()) {
    const Json& log = value["events"];
    if (!log.is_object() || !log.contains("events") || !log["events"].is_array()) {
      return absl::DataLossError("\"events\" is not a log of events");
    }
    std::vector<Json> events = log["events"].get<std::vector<Json>>();
    if (unfinished) {
      const int64_t last =
          events.empty() ? -1 : events.back().value("sequence_number", int64_t{-1});
      events.push_back({{"type", "response.failed"},
                        {"sequence_number", last + 1},
                        {"response", stored.response}});
    }
    auto restored = std::make_shared<ResponseEventLog>();
    restored->Append(std::move(events));
    // Nothing generates into it now.
    restored->Close();
    stored.events = std::move(restored);
  }
  return stored;
}

RestoredObjects ResponseStore::KeepIn(KeptFiles files) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> set_aside =
      kept_.KeepIn(std::move(files), &ResponseStore::Decode, &ResponseStore::BytesOf,
                   &ResponseStore::Encode, [](const absl::Status& status) {
                     spdlog::warn("openai: a kept response's file: {} (kept in memory only)",
                                  std::string(status.message()));
                   });
  return {.kept = kept_.size(), .set_aside = std::move(set_aside)};
}

int64_t ResponseStore::file_errors() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_.file_errors();
}

std::optional<ResponseStore::Stored> ResponseStore::Find(const std::string& id,
                                                         const std::string& app) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Stored* found = kept_.Find(id, app);
  if (found == nullptr) return std::nullopt;
  return *found;
}

bool ResponseStore::Delete(const std::string& id, const std::string& app) {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_.Erase(id, app);
}

int64_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_.bytes();
}

int64_t ResponseStore::forgotten() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_.forgotten();
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_.size();
}

}  // namespace tophat
