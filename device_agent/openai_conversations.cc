#include "device_agent/openai_conversations.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tophat {
namespace {

using Json = nlohmann::ordered_json;

OpenAiError Invalid(std::string param, std::string message) {
  return OpenAiError{.param = std::move(param), .message = std::move(message)};
}

// A body's fields, in the order given, once it is a JSON object; unknown fields refused.
std::variant<Json, OpenAiError> Fields(std::string_view body,
                                       std::initializer_list<std::string_view> known) {
  auto checked = ParseRequestBody(body);
  if (auto* error = std::get_if<OpenAiError>(&checked)) return *error;
  Json json = Json::parse(body);
  for (const auto& [key, value] : json.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return Invalid(key, absl::StrCat("Unrecognized request argument supplied: ", key));
    }
  }
  return json;
}

// `items`: Responses input items, read as a response's input is (so that what a later turn
// renders is what was checked), then stored as the items those messages are, with fresh ids.
std::variant<std::vector<Json>, OpenAiError> StoredItems(const Json& items) {
  if (!items.is_array()) return Invalid("items", "'items' must be an array of items");
  if (items.size() > kMaxConversationItemsAdded) {
    return Invalid("items", absl::StrCat("at most ", kMaxConversationItemsAdded,
                                         " items may be added at a time, not ", items.size()));
  }
  if (items.empty()) return std::vector<Json>();
  std::vector<ChatMessage> messages;
  if (auto error = ParseResponsesInput(items, messages, "items")) return *error;
  return ChatMessagesAsItems(messages,
                             [](std::string_view prefix, size_t) { return NewItemId(prefix); });
}

}  // namespace

std::variant<ConversationCreateRequest, OpenAiError> ParseConversationCreate(
    std::string_view body) {
  auto fields = Fields(body, {"items", "metadata"});
  if (auto* error = std::get_if<OpenAiError>(&fields)) return *error;
  const Json& json = std::get<Json>(fields);
  ConversationCreateRequest out;
  if (json.contains("items") && !json["items"].is_null()) {
    auto items = StoredItems(json["items"]);
    if (auto* error = std::get_if<OpenAiError>(&items)) return *error;
    out.items = std::get<std::vector<Json>>(std::move(items));
  }
  if (json.contains("metadata") && !json["metadata"].is_null()) {
    if (auto error = CheckMetadata(json["metadata"])) return *error;
    out.metadata = json["metadata"];
  }
  return out;
}

std::variant<Json, OpenAiError> ParseConversationUpdate(std::string_view body) {
  auto fields = Fields(body, {"metadata"});
  if (auto* error = std::get_if<OpenAiError>(&fields)) return *error;
  const Json& json = std::get<Json>(fields);
  if (!json.contains("metadata")) return Invalid("metadata", "'metadata' is required");
  // null clears it, as OpenAI's.
  if (json["metadata"].is_null()) return Json::object();
  if (auto error = CheckMetadata(json["metadata"])) return *error;
  return json["metadata"];
}

std::variant<std::vector<Json>, OpenAiError> ParseConversationItemsAdd(std::string_view body) {
  auto fields = Fields(body, {"items"});
  if (auto* error = std::get_if<OpenAiError>(&fields)) return *error;
  const Json& json = std::get<Json>(fields);
  if (!json.contains("items") || !json["items"].is_array() || json["items"].empty()) {
    return Invalid("items", "'items' must be a non-empty array of items");
  }
  return StoredItems(json["items"]);
}

std::vector<ChatMessage> ConversationItemsAsChat(const std::vector<Json>& items) {
  std::vector<ChatMessage> messages;
  if (items.empty()) return messages;
  // Stored items were checked as they came (a request's, or a response's own output), so
  // this reads them all.
  (void)ParseResponsesInput(Json(items), messages, "items");
  return messages;
}

Json ConversationStore::Object(const std::string& id, const Conversation& conversation) {
  return Json{{"id", id},
              {"object", "conversation"},
              {"created_at", conversation.created_at},
              {"metadata", conversation.metadata}};
}

int64_t ConversationStore::BytesOf(const std::string& id, const std::string& app,
                                   const Conversation& conversation) {
  int64_t bytes = static_cast<int64_t>(sizeof(Conversation) + id.size() + app.size() +
                                       conversation.metadata.dump().size());
  for (const Json& item : conversation.items) bytes += static_cast<int64_t>(item.dump().size());
  return bytes;
}

std::optional<Json> ConversationStore::Create(const std::string& app, int64_t created_at,
                                              Json metadata, std::vector<Json> items) {
  const std::string id = NewItemId("conv");
  Conversation conversation{
      .created_at = created_at, .metadata = std::move(metadata), .items = std::move(items)};
  const Json object = Object(id, conversation);
  const int64_t bytes = BytesOf(id, app, conversation);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!kept_.Put(id, app, std::move(conversation), bytes)) return std::nullopt;
  return object;
}

std::optional<Json> ConversationStore::Get(const std::string& id, const std::string& app) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Conversation* conversation = kept_.Find(id, app);
  if (conversation == nullptr) return std::nullopt;
  return Object(id, *conversation);
}

std::optional<Json> ConversationStore::SetMetadata(const std::string& id, const std::string& app,
                                                   Json metadata) {
  std::lock_guard<std::mutex> lock(mutex_);
  Conversation* conversation = kept_.Find(id, app);
  if (conversation == nullptr) return std::nullopt;
  conversation->metadata = std::move(metadata);
  const Json object = Object(id, *conversation);
  kept_.Resize(id, BytesOf(id, app, *conversation));
  return object;
}

bool ConversationStore::Delete(const std::string& id, const std::string& app) {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_.Erase(id, app);
}

std::optional<std::vector<Json>> ConversationStore::Items(const std::string& id,
                                                          const std::string& app) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Conversation* conversation = kept_.Find(id, app);
  if (conversation == nullptr) return std::nullopt;
  return conversation->items;
}

bool ConversationStore::Append(const std::string& id, const std::string& app,
                               std::vector<Json> items) {
  std::lock_guard<std::mutex> lock(mutex_);
  Conversation* conversation = kept_.Find(id, app);
  if (conversation == nullptr) return false;
  for (Json& item : items) conversation->items.push_back(std::move(item));
  // The most recently used: forgotten only if it alone is now past the bound.
  return kept_.Resize(id, BytesOf(id, app, *conversation));
}

std::optional<Json> ConversationStore::Item(const std::string& id, const std::string& app,
                                            const std::string& item_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Conversation* conversation = kept_.Find(id, app);
  if (conversation == nullptr) return std::nullopt;
  for (const Json& item : conversation->items) {
    if (item.value("id", "") == item_id) return item;
  }
  return std::nullopt;
}

std::optional<Json> ConversationStore::DeleteItem(const std::string& id, const std::string& app,
                                                  const std::string& item_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  Conversation* conversation = kept_.Find(id, app);
  if (conversation == nullptr) return std::nullopt;
  std::vector<Json>& items = conversation->items;
  const auto it = std::find_if(items.begin(), items.end(),
                               [&](const Json& item) { return item.value("id", "") == item_id; });
  if (it == items.end()) return std::nullopt;
  items.erase(it);
  const Json object = Object(id, *conversation);
  kept_.Resize(id, BytesOf(id, app, *conversation));
  return object;
}

Json ConversationStore::Encode(const Conversation& conversation) {
  return {{"created_at", conversation.created_at},
          {"metadata", conversation.metadata},
          {"items", conversation.items}};
}

absl::StatusOr<ConversationStore::Conversation> ConversationStore::Decode(const Json& value) {
  // Written by Encode; anything else is a file changed by hand or by a later format.
  if (!value.is_object() || !value.contains("created_at") ||
      !value["created_at"].is_number_integer() || !value.contains("metadata") ||
      !value.contains("items") || !value["items"].is_array()) {
    return absl::DataLossError(
        "not a kept conversation: \"created_at\", \"metadata\" or \"items\" missing");
  }
  Conversation conversation{.created_at = value["created_at"].get<int64_t>(),
                            .metadata = value["metadata"]};
  for (size_t i = 0; i < value["items"].size(); ++i) {
    const Json& item = value["items"][i];
    if (!item.is_object() || !item.contains("id") || !item["id"].is_string()) {
      return absl::DataLossError(absl::StrCat("items[", i, "] is not an item with an id"));
    }
    conversation.items.push_back(item);
  }
  return conversation;
}

RestoredObjects ConversationStore::KeepIn(KeptFiles files) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> set_aside =
      kept_.KeepIn(std::move(files), &ConversationStore::Decode, &ConversationStore::BytesOf,
                   &ConversationStore::Encode, [](const absl::Status& status) {
                     spdlog::warn("openai: a kept conversation's file: {} (kept in memory only)",
                                  std::string(status.message()));
                   });
  return {.kept = kept_.size(), .set_aside = std::move(set_aside)};
}

int64_t ConversationStore::file_errors() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_.file_errors();
}

size_t ConversationStore::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_.size();
}

int64_t ConversationStore::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_.bytes();
}

int64_t ConversationStore::forgotten() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_.forgotten();
}

}  // namespace tophat
