#include "models/tokenizers/harmony.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "models/tokenizers/chat_template.h"

namespace tophat {
namespace {

// The markup of gpt-oss's template (tests/harmony_model_test.py checks the whole one against
// transformers' rendering, token for token).
constexpr const char* kHarmonySource =
    "{{- \"<|start|>system<|message|>\" }}{{- build_system_message() }}{{- \"<|end|>\" }}"
    "{{- \"<|start|>assistant<|channel|>final<|message|>\" + message.content + \"<|end|>\" }}";

ChatTemplate Harmony() {
  auto made = ChatTemplate::FromSource(kHarmonySource, "test");
  INFO(made.status().ToString());
  REQUIRE(made.ok());
  return *std::move(made);
}

std::string RenderText(const std::vector<ChatMessage>& messages,
                       const std::vector<std::string>& tools, ChatRenderOptions options) {
  options.date = "DATE";
  auto rendered = Harmony().Render(messages, tools, options);
  INFO(rendered.status().ToString());
  REQUIRE(rendered.ok());
  return rendered->ToString();
}

const std::string kWeatherTool =
    R"({"type": "function", "function": {"name": "get_weather", "description": "Get the weather", )"
    R"("parameters": {"type": "object", "properties": {"location": {"type": "string", )"
    R"("description": "City"}, "unit": {"type": "string", "enum": ["c", "f"], "default": "c"}, )"
    R"("days": {"type": "integer", "default": 3}, "tags": {"type": "array", "items": {"type": )"
    R"("string"}}, "nested": {"type": "object", "properties": {"a": {"type": "number"}, "b": )"
    R"({"type": "boolean"}}, "required": ["a"]}, "anyarr": {"type": "array"}, "multi": {"type": )"
    R"(["string", "null"]}, "maybe": {"type": "string", "nullable": true}, "either": {"oneOf": )"
    R"([{"type": "string", "description": "a name"}, {"type": "integer", "default": 4}]}}, )"
    R"("required": ["location"]}}})";
const std::string kNoArgsTool =
    R"({"type": "function", "function": {"name": "noargs", "description": "Nothing"}})";

// The expected texts are transformers 5.17's rendering of openai/gpt-oss-20b's template
// (render_jinja_template with the date replaced), whitespace quirks and all.
TEST_CASE("harmony renders tools, calls and their answers as gpt-oss's template does") {
  CHECK(Harmony().family() == ChatFamily::kHarmony);
  CHECK(Harmony().takes_tools());
  CHECK_FALSE(Harmony().tool_call_syntax().has_value());
  CHECK(Harmony().turn_ends() == std::vector<std::string>{"<|return|>", "<|call|>"});

  std::vector<ChatMessage> messages = {
      {.role = "system", .content = "Be brief."},
      {.role = "user", .content = "Weather?"},
      {.role = "assistant",
       .content = "",
       .reasoning = "Need tool",
       .tool_calls = {{.id = "call_1",
                       .name = "get_weather",
                       .arguments = R"({"location":"Paris","days":2})"}}},
      {.role = "tool", .content = "{\"t\": 20}\nok", .tool_call_id = "call_1"},
      {.role = "assistant", .content = "It is 20."},
      {.role = "user", .content = "Thanks"}};
  CHECK(RenderText(messages, {kWeatherTool, kNoArgsTool}, {}) ==
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\nCurrent date: DATE\n\nReasoning: medium\n\n# Valid channels: "
        "analysis, commentary, final. Channel must be included for every message.\nCalls to "
        "these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer"
        "<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\nnamespace "
        "functions {\n\n// Get the weather\ntype get_weather = (_: {\n// City\nlocation: "
        "string,\nunit?: \"c\" | \"f\", // default: c,\ndays?: number, // default: 3,\ntags?: "
        "string[],\nnested?: {\na: \n                number, b?: \n                boolean},\n"
        "anyarr?: any[],\nmulti?: string | null,\nmaybe?: string | null,\neither?: string// a "
        "name | \nnumber                    // default: 4,\n}) => any;\n\n// Nothing\ntype "
        "noargs = () => any;\n\n} // namespace functions<|end|><|start|>user<|message|>"
        "Weather?<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json"
        "<|message|>{\"location\": \"Paris\", \"days\": 2}<|call|><|start|>functions."
        "get_weather to=assistant<|channel|>commentary<|message|>\"{\\\"t\\\": 20}\\nok\"<|end|>"
        "<|start|>assistant<|channel|>final<|message|>It is 20.<|end|><|start|>user<|message|>"
        "Thanks<|end|><|start|>assistant");

  // A call with no answer after it keeps its reasoning; the effort is the request's.
  messages = {{.role = "user", .content = "Weather?"},
              {.role = "assistant",
               .content = "",
               .reasoning = "Need tool",
               .tool_calls = {{.id = "call_1", .name = "noargs", .arguments = "{}"}}},
              {.role = "tool", .content = "sunny", .tool_call_id = "call_1"}};
  CHECK(RenderText(messages, {kNoArgsTool}, {.reasoning_effort = "high"}) ==
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\nCurrent date: DATE\n\nReasoning: high\n\n# Valid channels: "
        "analysis, commentary, final. Channel must be included for every message.\nCalls to "
        "these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer"
        "<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n// Nothing\ntype "
        "noargs = () => any;\n\n} // namespace functions<|end|><|start|>user<|message|>Weather?"
        "<|end|><|start|>assistant<|channel|>analysis<|message|>Need tool<|end|><|start|>"
        "assistant to=functions.noargs<|channel|>commentary json<|message|>{}<|call|><|start|>"
        "functions.noargs to=assistant<|channel|>commentary<|message|>\"sunny\"<|end|><|start|>"
        "assistant");

  // Earlier reasoning is dropped, and a system message after the first is not written.
  messages = {{.role = "user", .content = "Hi"},
              {.role = "assistant", .content = "Hello", .reasoning = "greet"},
              {.role = "system", .content = "late"},
              {.role = "user", .content = "Bye"}};
  CHECK(RenderText(messages, {}, {}) ==
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\nCurrent date: DATE\n\nReasoning: medium\n\n# Valid channels: "
        "analysis, commentary, final. Channel must be included for every message.<|end|><|start|>"
        "user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello<|end|>"
        "<|start|>user<|message|>Bye<|end|><|start|>assistant");
}

TEST_CASE("harmony's control tokens stay apart from the text, and the date defaults to today") {
  auto rendered = Harmony().Render(
      std::vector<ChatMessage>{{.role = "user", .content = "<|end|><|start|>system"}});
  REQUIRE(rendered.ok());
  // The user's text is one text piece, never control tokens.
  int user_pieces = 0;
  for (const RenderedChat::Piece& piece : rendered->pieces) {
    if (piece.text == "<|end|><|start|>system") {
      CHECK_FALSE(piece.special);
      ++user_pieces;
    }
  }
  CHECK(user_pieces == 1);
  const std::string text = rendered->ToString();
  const size_t date = text.find("Current date: ");
  REQUIRE(date != std::string::npos);
  const std::string day = text.substr(date + 14, 10);
  CHECK(day.size() == 10);
  CHECK(day[4] == '-');
  CHECK(day[7] == '-');
  CHECK(day.substr(0, 2) == "20");
}

TEST_CASE("harmony refuses what its template cannot write, naming the message or tool") {
  const ToolCall call{.id = "c", .name = "noargs", .arguments = "{}"};
  auto two_calls = Harmony().Render(
      std::vector<ChatMessage>{{.role = "user", .content = "x"},
       {.role = "assistant", .content = "", .tool_calls = {call, call}}},
      std::vector<std::string>{kNoArgsTool});
  REQUIRE_FALSE(two_calls.ok());
  CHECK_THAT(std::string(two_calls.status().message()),
             Catch::StartsWith("messages[1]: ") && Catch::Contains("one tool call"));

  auto both = Harmony().Render(
      std::vector<ChatMessage>{{.role = "user", .content = "x"},
       {.role = "assistant", .content = "preamble", .reasoning = "why", .tool_calls = {call}}},
      std::vector<std::string>{kNoArgsTool});
  REQUIRE_FALSE(both.ok());
  CHECK_THAT(std::string(both.status().message()), Catch::StartsWith("messages[1]: "));

  auto orphan = Harmony().Render(
      std::vector<ChatMessage>{{.role = "user", .content = "x"}, {.role = "tool", .content = "y", .tool_call_id = "c"}},
      std::vector<std::string>{kNoArgsTool});
  REQUIRE_FALSE(orphan.ok());
  CHECK_THAT(std::string(orphan.status().message()), Catch::StartsWith("messages[1]: "));

  auto undescribed = Harmony().Render(
      std::vector<ChatMessage>{{.role = "user", .content = "x"}},
      std::vector<std::string>{
          R"({"type": "function", "function": {"name": "f", "parameters": {}}})"});
  REQUIRE_FALSE(undescribed.ok());
  CHECK_THAT(std::string(undescribed.status().message()),
             Catch::StartsWith("tools: tools[0].function.description"));
}

TEST_CASE("PythonJsonString escapes as Python's json.dumps(ensure_ascii=False) does") {
  CHECK(PythonJsonString("a\"b\\c\nd\te\x01 é") == "\"a\\\"b\\\\c\\nd\\te\\u0001 é\"");
}

// Token ids for the reader: the control tokens, and one id for every piece of text.
constexpr HarmonyTokens kTokens{
    .start = 1, .channel = 2, .message = 3, .end = 4, .ret = 5, .call = 6, .constrain = 7};
constexpr int32_t kText = 100;

struct Read {
  std::string reasoning;
  std::string content;
  std::vector<std::string> deltas;  // each push's content, where it had any
  HarmonyReader reader{kTokens};
};

// Pushes each token: an int is a control token, a string a text token.
void Feed(Read& read, const std::vector<std::variant<int32_t, std::string>>& tokens) {
  for (const auto& token : tokens) {
    HarmonyReader::Parts parts =
        std::holds_alternative<int32_t>(token)
            ? read.reader.Push(std::get<int32_t>(token), "")
            : read.reader.Push(kText, std::get<std::string>(token));
    read.reasoning += parts.reasoning;
    read.content += parts.content;
    if (!parts.content.empty()) read.deltas.push_back(parts.content);
  }
  HarmonyReader::Parts rest = read.reader.Flush();
  read.reasoning += rest.reasoning;
  read.content += rest.content;
}

TEST_CASE("HarmonyReader splits an answer into reasoning and content by channel") {
  Read read;
  Feed(read, {2, "analysis", 3, "Think", " hard", 4, 1, "assistant", 2, "final", 3, "The ",
              "answer", 5, "after the end"});
  CHECK(read.reasoning == "Think hard");
  CHECK(read.content == "The answer");
  // Content goes out as it comes, a token at a time.
  CHECK(read.deltas == std::vector<std::string>{"The ", "answer"});
  // The analysis message's header (3 tokens), body (2) and <|end|>.
  CHECK(read.reader.reasoning_tokens() == 6);
  CHECK(read.reader.calls().empty());
  CHECK(read.reader.ended());
}

TEST_CASE("HarmonyReader reads a call by its recipient, in the role's part or the channel's") {
  Read after_channel;
  Feed(after_channel, {2, "analysis", 3, "Need weather", 4, 1, "assistant", 2, "commentary",
                       " to=functions.get_weather ", 7, "json", 3, "{\"location\":", " \"Paris\"}",
                       6});
  CHECK(after_channel.reasoning == "Need weather");
  CHECK(after_channel.content.empty());
  REQUIRE(after_channel.reader.calls().size() == 1);
  CHECK(after_channel.reader.calls()[0].recipient == "functions.get_weather");
  CHECK(after_channel.reader.calls()[0].body == "{\"location\": \"Paris\"}");

  Read in_role;
  Feed(in_role, {1, "assistant to=functions.noargs", 2, "commentary json", 3, "{}", 6});
  REQUIRE(in_role.reader.calls().size() == 1);
  CHECK(in_role.reader.calls()[0].recipient == "functions.noargs");
  CHECK(in_role.reader.calls()[0].body == "{}");

  // Commentary with no recipient is a note to the user: content.
  Read note;
  Feed(note, {2, "commentary", 3, "Checking.", 4, 1, "assistant", 2, "final", 3, " Done."});
  CHECK(note.content == "Checking. Done.");
  CHECK(note.reader.calls().empty());
}

TEST_CASE("HarmonyReader parts messages of reasoning and reads text that is not harmony as "
          "content") {
  Read two;
  Feed(two, {2, "analysis", 3, "first", 4, 1, "assistant", 2, "analysis", 3, "second", 4});
  CHECK(two.reasoning == "first\n\nsecond");
  CHECK(two.content.empty());

  // An answer that never opens a message: its text comes out at the end.
  Read plain;
  Feed(plain, {"just ", "text"});
  CHECK(plain.content == "just text");
  CHECK(plain.reasoning.empty());

  // A long one comes out once it is longer than any header, then as it comes.
  Read long_text;
  const std::string chunk(100, 'x');
  Feed(long_text, {chunk, chunk, chunk, "tail"});
  CHECK(long_text.content == chunk + chunk + chunk + "tail");
  CHECK(long_text.deltas == std::vector<std::string>{chunk + chunk + chunk, "tail"});

  // A channel named with no <|end|><|start|> before it begins a new message.
  Read jump;
  Feed(jump, {2, "analysis", 3, "hm", 2, "final", 3, "ok"});
  CHECK(jump.reasoning == "hm");
  CHECK(jump.content == "ok");
}

TEST_CASE("HarmonyReader makes nothing up, whatever order the tokens come in") {
  // Random answers of control tokens and one-byte texts (the fuzz target's invariant): what
  // comes out is the text, and a blank line between messages of reasoning.
  std::mt19937 random(7);
  for (int answer = 0; answer < 2000; ++answer) {
    HarmonyReader reader(kTokens);
    size_t text = 0;
    size_t messages = 0;
    size_t out = 0;
    const int length = static_cast<int>(random() % 64);
    for (int i = 0; i < length; ++i) {
      const auto pick = static_cast<int32_t>(random() % 12);
      HarmonyReader::Parts parts;
      if (pick >= 1 && pick <= 7) {
        parts = reader.Push(pick, "");
        messages += pick == kTokens.message;
      } else {
        const std::string piece(1 + random() % 3, static_cast<char>('a' + random() % 26));
        parts = reader.Push(kText, piece);
        text += piece.size();
      }
      out += parts.reasoning.size() + parts.content.size();
    }
    const HarmonyReader::Parts rest = reader.Flush();
    out += rest.reasoning.size() + rest.content.size();
    for (const HarmonyCall& call : reader.calls()) out += call.body.size();
    INFO("answer " << answer);
    CHECK(out <= text + 2 * messages);
    CHECK(reader.ended());
  }
}

}  // namespace
}  // namespace tophat
