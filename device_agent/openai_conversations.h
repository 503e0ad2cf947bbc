// OpenAI's Conversations API (/v1/conversations) on the agent's endpoint: conversations the
// agent keeps as Responses items, whose items a response made with `conversation` reads before
// its input, and to which it adds its input and its output once it completes. Kept on the
// device only (text never leaves it), in the agent's memory and, with KeepIn, in files that
// the next process takes back (openai.store_dir); each visible to the app that made it alone,
// bounded by bytes. The request bodies are read here too. No model.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "device_agent/lru_byte_store.h"
#include "device_agent/openai_request.h"
#include "device_agent/openai_responses.h"
#include "models/tokenizers/chat_template.h"

namespace tophat {

// At most this many items in one create or add request, as OpenAI's.
inline constexpr size_t kMaxConversationItemsAdded = 20;

// POST /v1/conversations: {items, metadata}, both optional.
struct ConversationCreateRequest {
  std::vector<nlohmann::ordered_json> items;  // stored form, with fresh ids
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
};
std::variant<ConversationCreateRequest, OpenAiError> ParseConversationCreate(std::string_view body);
// POST /v1/conversations/{id}: {metadata}; the new metadata.
std::variant<nlohmann::ordered_json, OpenAiError> ParseConversationUpdate(std::string_view body);
// POST /v1/conversations/{id}/items: {items}, 1 to 20 of them; stored form, with fresh ids.
std::variant<std::vector<nlohmann::ordered_json>, OpenAiError> ParseConversationItemsAdd(
    std::string_view body);

// Items as the chat messages a response's prompt is rendered from (calls joining the
// assistant message before them).
std::vector<ChatMessage> ConversationItemsAsChat(const std::vector<nlohmann::ordered_json>& items);

class ConversationStore {
 public:
  using Json = nlohmann::ordered_json;
  explicit ConversationStore(int64_t max_bytes) : kept_(max_bytes) {}

  // The conversation object ({id, object: "conversation", created_at, metadata}); nullopt
  // when it alone is larger than the bound (not kept).
  std::optional<Json> Create(const std::string& app, int64_t created_at, Json metadata,
                             std::vector<Json> items);
  // nullopt when `id` is unknown, forgotten, or another app's (so below).
  std::optional<Json> Get(const std::string& id, const std::string& app);
  std::optional<Json> SetMetadata(const std::string& id, const std::string& app, Json metadata);
  bool Delete(const std::string& id, const std::string& app);
  // All its items, oldest first.
  std::optional<std::vector<Json>> Items(const std::string& id, const std::string& app);
  // Adds items at its end; false when the conversation is unknown, or when they would make it
  // larger than the whole bound (then it is forgotten: a later turn would miss them).
  bool Append(const std::string& id, const std::string& app, std::vector<Json> items);
  // One item; nullopt when the conversation or the item is unknown.
  std::optional<Json> Item(const std::string& id, const std::string& app,
                           const std::string& item_id);
  // Removes one item: the conversation object, or nullopt when either is unknown.
  std::optional<Json> DeleteItem(const std::string& id, const std::string& app,
                                 const std::string& item_id);

  // From now on keeps each conversation in `files` too, and takes back those they hold, the
  // least recently written first (so that the bound, if lowered since, forgets the oldest).
  // Call before serving.
  RestoredObjects KeepIn(KeptFiles files);

  size_t size() const;
  int64_t bytes() const;
  // Conversations forgotten for the bound since the start.
  int64_t forgotten() const;
  // Files that could not be written or removed since KeepIn (each logged).
  int64_t file_errors() const;

 private:
  struct Conversation {
    int64_t created_at = 0;
    Json metadata;
    std::vector<Json> items;
  };
  static Json Object(const std::string& id, const Conversation& conversation);
  static Json Encode(const Conversation& conversation);
  static absl::StatusOr<Conversation> Decode(const Json& value);
  static int64_t BytesOf(const std::string& id, const std::string& app,
                         const Conversation& conversation);

  mutable std::mutex mutex_;
  LruByteStore<Conversation> kept_;
};

}  // namespace tophat
