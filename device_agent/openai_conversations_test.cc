#include "device_agent/openai_conversations.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "base/test_util.h"

namespace tophat {
namespace {

using Json = nlohmann::ordered_json;

// A user's message as the store keeps it.
Json UserItem(const std::string& text) {
  return Json{{"id", NewItemId("msg")},
              {"type", "message"},
              {"status", "completed"},
              {"role", "user"},
              {"content", Json::array({{{"type", "input_text"}, {"text", text}}})}};
}

OpenAiError CreateError(const std::string& body) {
  auto parsed = ParseConversationCreate(body);
  REQUIRE(std::holds_alternative<OpenAiError>(parsed));
  return std::get<OpenAiError>(std::move(parsed));
}

TEST_CASE("A conversation's items are read as a response's input and kept with fresh ids") {
  auto parsed = ParseConversationCreate(R"({
      "items": [{"type": "message", "role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
                {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "42"}],
      "metadata": {"topic": "greetings"}})");
  REQUIRE(std::holds_alternative<ConversationCreateRequest>(parsed));
  const ConversationCreateRequest& given = std::get<ConversationCreateRequest>(parsed);
  CHECK(given.metadata == Json{{"topic", "greetings"}});
  REQUIRE(given.items.size() == 4);
  CHECK(given.items[0]["type"] == "message");
  CHECK(given.items[0]["role"] == "user");
  CHECK(given.items[0]["content"][0] == Json{{"type", "input_text"}, {"text", "hi"}});
  CHECK(given.items[1]["content"][0]["type"] == "output_text");
  CHECK(given.items[2]["type"] == "function_call");
  CHECK(given.items[3]["output"] == "42");
  std::set<std::string> ids;
  for (const Json& item : given.items) {
    CHECK(item["status"] == "completed");
    ids.insert(item["id"].get<std::string>());
  }
  CHECK(ids.size() == 4);
  CHECK(given.items[0]["id"].get<std::string>().starts_with("msg_"));
  CHECK(given.items[2]["id"].get<std::string>().starts_with("fc_"));
  CHECK(given.items[3]["id"].get<std::string>().starts_with("fco_"));
  // As chat: the call joins the answer before it.
  const std::vector<ChatMessage> chat = ConversationItemsAsChat(given.items);
  REQUIRE(chat.size() == 3);
  CHECK(chat[0].role == "user");
  CHECK(chat[1].content == "hello");
  REQUIRE(chat[1].tool_calls.size() == 1);
  CHECK(chat[1].tool_calls[0].id == "call_1");
  CHECK(chat[2].role == "tool");
  CHECK(chat[2].tool_call_id == "call_1");
  // Nothing at all is a conversation too.
  auto empty = ParseConversationCreate("{}");
  REQUIRE(std::holds_alternative<ConversationCreateRequest>(empty));
  CHECK(std::get<ConversationCreateRequest>(empty).items.empty());
  CHECK(ConversationItemsAsChat({}).empty());
}

TEST_CASE("Conversation requests name the field they get wrong") {
  CHECK(CreateError(R"({"items": [{"role": "robot", "content": "x"}]})").param == "items[0].role");
  CHECK(CreateError(R"({"items": "hi"})").param == "items");
  Json many = Json::array();
  for (int i = 0; i < 21; ++i) many.push_back({{"role", "user"}, {"content", "x"}});
  CHECK(CreateError(Json{{"items", many}}.dump()).param == "items");
  CHECK(CreateError(R"({"metadata": {"k": 1}})").param == "metadata");
  CHECK(CreateError(R"({"title": "x"})").param == "title");
  CHECK(CreateError("[1]").message == "the request body must be a JSON object");
  auto update = ParseConversationUpdate(R"({"metadata": null})");
  REQUIRE(std::holds_alternative<Json>(update));
  CHECK(std::get<Json>(update) == Json::object());
  CHECK(std::get<OpenAiError>(ParseConversationUpdate("{}")).param == "metadata");
  CHECK(std::get<OpenAiError>(ParseConversationItemsAdd(R"({"items": []})")).param == "items");
  auto added = ParseConversationItemsAdd(R"({"items": [{"role": "user", "content": "more"}]})");
  REQUIRE(std::holds_alternative<std::vector<Json>>(added));
  CHECK(std::get<std::vector<Json>>(added).size() == 1);
}

TEST_CASE("The conversation store keeps each app's conversations apart, within its bytes") {
  ConversationStore store(/*max_bytes=*/4000);
  std::optional<Json> created = store.Create("app1", 1700000000, Json{{"k", "v"}}, {UserItem("a")});
  REQUIRE(created.has_value());
  const std::string id = (*created)["id"];
  CHECK(id.starts_with("conv_"));
  CHECK((*created)["object"] == "conversation");
  CHECK((*created)["created_at"] == 1700000000);
  CHECK(store.Get(id, "app1") == created);
  CHECK_FALSE(store.Get(id, "app2").has_value());  // another app's
  CHECK_FALSE(store.Items(id, "app2").has_value());
  CHECK_FALSE(store.Append(id, "app2", {UserItem("x")}));
  CHECK_FALSE(store.Delete(id, "app2"));
  // Items come in order; one is found and removed by its id.
  const Json second = UserItem("b");
  CHECK(store.Append(id, "app1", {second, UserItem("c")}));
  REQUIRE(store.Items(id, "app1")->size() == 3);
  CHECK(store.Items(id, "app1")->at(1) == second);
  CHECK(store.Item(id, "app1", second["id"]) == second);
  CHECK_FALSE(store.Item(id, "app1", "msg_nope").has_value());
  CHECK(store.DeleteItem(id, "app1", second["id"]) == store.Get(id, "app1"));
  CHECK_FALSE(store.DeleteItem(id, "app1", second["id"]).has_value());
  CHECK(store.Items(id, "app1")->size() == 2);
  // Metadata replaced whole.
  CHECK((*store.SetMetadata(id, "app1", Json{{"n", "1"}}))["metadata"] == Json{{"n", "1"}});
  CHECK_FALSE(store.SetMetadata(id, "app2", Json::object()).has_value());
  // Past its bytes the least recently used goes: `id` was used last.
  std::optional<Json> other =
      store.Create("app1", 1, Json::object(), {UserItem(std::string(1900, 'o'))});
  REQUIRE(other.has_value());
  CHECK(store.Get(id, "app1").has_value());
  std::optional<Json> third =
      store.Create("app1", 1, Json::object(), {UserItem(std::string(1900, 't'))});
  REQUIRE(third.has_value());
  CHECK_FALSE(store.Get((*other)["id"], "app1").has_value());
  CHECK(store.Get(id, "app1").has_value());
  CHECK(store.bytes() <= 4000);
  CHECK(store.forgotten() == 1);
  // Grown past the whole bound by an append, a conversation is forgotten, and says so.
  CHECK_FALSE(store.Append(id, "app1", {UserItem(std::string(5000, 'x'))}));
  CHECK_FALSE(store.Get(id, "app1").has_value());
  CHECK(store.forgotten() == 2);
  // One larger than the whole store is not kept.
  CHECK_FALSE(store.Create("app1", 1, Json::object(), {UserItem(std::string(5000, 'x'))}));
  CHECK(store.Delete((*third)["id"], "app1"));
  CHECK(store.size() == 0);
  CHECK(store.bytes() == 0);
}

TEST_CASE("Kept conversations outlive the store in their files, each change written") {
  testing::TempDir temp;
  const auto open = [&] {
    absl::StatusOr<KeptFiles> files = KeptFiles::Open(temp.path());
    REQUIRE(files.ok());
    return *std::move(files);
  };
  std::string id, gone, emptied;
  std::vector<Json> items;
  {
    ConversationStore store(/*max_bytes=*/1 << 20);
    CHECK(store.KeepIn(open()).kept == 0);
    id = (*store.Create("app1", 1700000000, Json{{"k", "v"}}, {UserItem("a")}))["id"];
    const Json second = UserItem("b");
    REQUIRE(store.Append(id, "app1", {second, UserItem("c")}));
    REQUIRE(store.DeleteItem(id, "app1", second["id"]).has_value());
    REQUIRE(store.SetMetadata(id, "app1", Json{{"topic", "farms"}}).has_value());
    items = *store.Items(id, "app1");
    gone = (*store.Create("app1", 1, Json::object(), {}))["id"];
    REQUIRE(store.Delete(gone, "app1"));
    emptied = (*store.Create("app2", 2, Json::object(), {UserItem("z")}))["id"];
    CHECK(store.file_errors() == 0);
  }
  CHECK_FALSE(std::filesystem::exists(temp.path() / (gone + ".json")));
  ConversationStore next(/*max_bytes=*/1 << 20);
  const RestoredObjects restored = next.KeepIn(open());
  CHECK(restored.kept == 2);
  CHECK(restored.set_aside.empty());
  std::optional<Json> object = next.Get(id, "app1");
  REQUIRE(object.has_value());
  CHECK((*object)["created_at"] == 1700000000);
  CHECK((*object)["metadata"] == Json{{"topic", "farms"}});
  REQUIRE(items.size() == 2);
  CHECK(next.Items(id, "app1") == items);
  CHECK_FALSE(next.Get(id, "app2").has_value());  // still the app's own
  CHECK(next.Items(emptied, "app2")->size() == 1);
  // Changes after the restore are written too.
  REQUIRE(next.Append(emptied, "app2", {UserItem("y")}));
  ConversationStore third(/*max_bytes=*/1 << 20);
  third.KeepIn(open());
  CHECK(third.Items(emptied, "app2")->size() == 2);
}

}  // namespace
}  // namespace tophat
