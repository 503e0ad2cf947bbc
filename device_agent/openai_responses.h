// OpenAI's Responses API (POST /v1/responses) on the agent's endpoint: the response object
// and, for a stream, its events, built as an answer's text and calls come (ResponseBuilder);
// and the responses kept for later turns (ResponseStore), which `previous_response_id` names.
// The request is read by ParseResponsesRequest (openai_request.h). No model.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "device_agent/kept_files.h"
#include "device_agent/lru_byte_store.h"
#include "models/tokenizers/chat_template.h"

namespace tophat {

// A response's id, as OpenAI's look: "resp_" and 48 hex digits.
std::string NewResponseId();
// Another object's or item's id in that form: `prefix`, "_" and 48 hex digits.
std::string NewItemId(std::string_view prefix);

// The usage object of a response: its input tokens (those an earlier turn had computed
// among them, OpenAI's cached_tokens) and output tokens (a thinking model's reasoning, up to
// and with its </think>, among them).
nlohmann::ordered_json ResponsesUsage(int64_t input_tokens, int64_t cached_tokens,
                                      int64_t output_tokens, int64_t reasoning_tokens = 0);

// One answer as a response object and, when it streams, the events OpenAI's clients fold
// back into it: response.created and .in_progress; a thinking model's reasoning item
// (reasoning_text.delta...) first; a message item (output_item.added, content_part.added,
// output_text.delta...) opened by the first text; at the end the
// message's .done events, one function_call item per call (added, arguments.delta and
// .done, output_item.done), then response.completed (or .incomplete when max_output_tokens
// cut it, .failed on an error). Each event carries its sequence_number.
class ResponseBuilder {
 public:
  using Json = nlohmann::ordered_json;
  // `echo`: the request's fields a response repeats (OpenAiResponsesRequest::echo).
  ResponseBuilder(std::string id, int64_t created_at, std::string model, Json echo);

  std::vector<Json> Start();
  // Reasoning a thinking model adds, before any text: the first opens a reasoning item
  // ({type: "reasoning", summary: [], content: [{type: "reasoning_text", text}]}, as OpenAI's
  // open-weight models' responses carry it; output_item.added, content_part.added), each
  // sends a response.reasoning_text.delta. The item is done (reasoning_text.done,
  // content_part.done, output_item.done) at the first text or the answer's end: "incomplete"
  // when max_output_tokens cut the answer while it reasoned. Kept with the answer.
  std::vector<Json> ReasoningText(std::string_view delta);
  // Reasoning whole (an answer not streamed): its item opened and done at once.
  std::vector<Json> Reasoning(std::string_view text);
  // Text the answer adds, with its tokens' log-probabilities (chat's entries: {token,
  // logprob, bytes, top_logprobs}; an empty array when none were asked for).
  std::vector<Json> Text(std::string_view delta, const Json& logprobs);
  // The answer's end: its last text, its calls (their ids are made here) and whether
  // max_output_tokens cut it.
  std::vector<Json> Finish(std::string_view tail, std::span<const ToolCall> calls, bool cut_short,
                           Json usage);
  // The answer failed: the response's status "failed", with error {code, message}.
  std::vector<Json> Fail(std::string_view message, std::string_view code = "server_error");
  // A background response cancelled: its status "cancelled", the answer as it stood (what
  // was generated before the cancel, when Finish came first).
  void Cancel();

  // The response as it stands; whole after Finish or Fail.
  const Json& response() const { return response_; }
  // After Finish: the answer as a chat turn (its calls under their call ids), which a later
  // turn's previous_response_id puts back into the conversation.
  const ChatMessage& answer() const { return answer_; }

 private:
  Json Event(std::string_view type, Json fields);
  // Ends the reasoning item when one is open, with `status`.
  void CloseReasoning(std::vector<Json>& events, std::string_view status);
  Json ReasoningItem(std::string_view status) const;
  // Opens the message item on its first text.
  void OpenMessage(std::vector<Json>& events);
  Json MessageItem(std::string_view status) const;
  Json Snapshot(std::string_view status) const;

  std::string id_;
  Json output_ = Json::array();  // finished items
  Json response_;
  int64_t sequence_ = 0;
  std::string reasoning_id_;  // "": none open
  std::string reasoning_;
  std::string message_id_;  // "": not opened
  std::string text_;
  Json logprobs_ = Json::array();
  ChatMessage answer_{.role = "assistant"};
};

// A page of a kept response's input items (GET /v1/responses/{id}/input_items): the
// conversation that produced it, earlier turns included (its answer, the last message, is not
// an input), as Responses items: messages with input_text parts (an earlier answer's with
// output_text), function_call and function_call_output items. Item ids are made from the
// response's id and the item's place, so they stay the same from call to call and can be
// paged through with `after`.
struct InputItemsQuery {
  int64_t limit = 20;      // 1 to 100
  bool ascending = false;  // order "asc"; OpenAI's default is "desc", the newest first
  std::string after;       // the id of the item before the page, in this order; "" from the start
};
// The list object ({object: "list", data, first_id, last_id, has_more}); nullopt when `after`
// names no item of this response.
std::optional<nlohmann::ordered_json> InputItemsPage(std::string_view response_id,
                                                     std::span<const ChatMessage> conversation,
                                                     const InputItemsQuery& query);
// Chat messages as Responses items (a message with input_text parts, an assistant's with
// output_text; its calls as function_call items after it; a tool's answer as a
// function_call_output), each with the id `make_id` gives for its kind's prefix ("msg",
// "fc", "fco") and its place.
std::vector<nlohmann::ordered_json> ChatMessagesAsItems(
    std::span<const ChatMessage> messages,
    const std::function<std::string(std::string_view prefix, size_t index)>& make_id);
// A page of `items` (oldest first) as InputItemsQuery asks; nullopt when `after` names none.
std::optional<nlohmann::ordered_json> ItemsPage(std::vector<nlohmann::ordered_json> items,
                                                const InputItemsQuery& query);

// The events of a response generated in the background with `stream` (OpenAI's background
// streaming): appended by its generation as they come, followed by the client that made it
// and by any that comes back for them (GET /v1/responses/{id}?stream=true&starting_after=N),
// each from where it left off, until the log is closed. Kept with the response afterwards,
// so a client whose stream broke reads the rest. Thread-safe.
class ResponseEventLog {
 public:
  using Json = nlohmann::ordered_json;

  void Append(std::vector<Json> events);
  // No events come after these: followers end once they have read them all.
  void Close();

  struct Read {
    std::vector<Json> events;  // those from the asked-for index on
    bool ended = false;        // closed, and nothing past these
  };
  // The events from index `next` on, waiting up to `wait` for one when there are none yet.
  Read From(size_t next, std::chrono::milliseconds wait) const;
  // The index of the first event whose sequence_number is past `sequence_number` (a resumed
  // stream's starting_after); the log's size when none is yet.
  size_t IndexAfter(int64_t sequence_number) const;
  // The bytes its events take, as JSON text: what the response store bounds.
  int64_t bytes() const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable appended_;
  std::vector<Json> events_;
  bool closed_ = false;
  int64_t bytes_ = 0;
};

// Responses kept for later turns, on the device only (text never leaves it), in the agent's
// memory and, with KeepIn, in files that the next process takes back (openai.store_dir); each
// visible to the app that made it alone. Bounded by bytes: past `max_bytes`, the least
// recently used go first. Thread-safe.
class ResponseStore {
 public:
  struct Stored {
    // The conversation through this response: what earlier turns held (instructions
    // excluded: each turn gives its own), this turn's input, and its answer.
    std::vector<ChatMessage> conversation;
    nlohmann::ordered_json response;
    // A background response made with `stream`: its events, for a stream resumed later.
    std::shared_ptr<const ResponseEventLog> events;
  };
  explicit ResponseStore(int64_t max_bytes) : kept_(max_bytes) {}

  // Not kept when it alone is larger than max_bytes.
  void Put(const std::string& id, const std::string& app, Stored stored);
  // nullopt when `id` is unknown, forgotten, or another app's.
  std::optional<Stored> Find(const std::string& id, const std::string& app);
  bool Delete(const std::string& id, const std::string& app);

  // From now on keeps each response in `files` too, and takes back those they hold, the
  // least recently written first (so that the bound, if lowered since, forgets the oldest).
  // A response its process left generating comes back failed. Call before serving.
  RestoredObjects KeepIn(KeptFiles files);

  int64_t bytes() const;
  size_t size() const;
  // Responses forgotten for the bound (the least recently used, or one larger than it all),
  // since the start: a later turn naming one is refused.
  int64_t forgotten() const;
  // Files that could not be written or removed since KeepIn (each logged); the responses
  // stay in memory.
  int64_t file_errors() const;

  // A kept response as its file holds it, and back; Decode's errors say what is wrong.
  static nlohmann::ordered_json Encode(const Stored& stored);
  static absl::StatusOr<Stored> Decode(const nlohmann::ordered_json& value);

 private:
  static int64_t BytesOf(const std::string& id, const std::string& app, const Stored& stored);

  mutable std::mutex mutex_;
  LruByteStore<Stored> kept_;
};

}  // namespace tophat
