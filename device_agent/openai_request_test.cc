#include "device_agent/openai_request.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "configs/agent_config.h"

namespace tophat {
namespace {

constexpr const char* kModel = "toy";

OpenAiRequest ParseOk(OpenAiEndpoint endpoint, const std::string& body) {
  auto parsed = ParseOpenAiRequest(endpoint, body, kModel);
  if (auto* error = std::get_if<OpenAiError>(&parsed)) FAIL(error->ToJson().dump());
  return std::get<OpenAiRequest>(std::move(parsed));
}

OpenAiError ParseError(OpenAiEndpoint endpoint, const std::string& body) {
  auto parsed = ParseOpenAiRequest(endpoint, body, kModel);
  REQUIRE(std::holds_alternative<OpenAiError>(parsed));
  return std::get<OpenAiError>(std::move(parsed));
}

TEST_CASE("A body nested deeper than the agent walks is a 400, not a stack overflow") {
  // 100,000 nested arrays (200 KB): parsed and freed without recursion, and refused before
  // anything copies or writes them (which recurses once a level).
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const std::string& body :
       {absl::StrCat(R"({"model": "toy", "prompt": "x", "user": )", deep, "}"),
        absl::StrCat(R"({"model": "toy", "prompt": "x", "response_format": {"type": "json_schema",
             "json_schema": {"name": "n", "schema": {"const": )", deep, "}}}}")}) {
    const OpenAiError error = ParseError(OpenAiEndpoint::kCompletions, body);
    CHECK(error.http_status == 400);
    CHECK_THAT(error.message, Catch::Contains("nests arrays and objects more than 256 deep"));
  }
  // 250 deep is a body like any other (here refused for the field, not for its depth).
  const OpenAiError shallow = ParseError(
      OpenAiEndpoint::kCompletions,
      absl::StrCat(R"({"model": "toy", "prompt": "x", "user": )", std::string(250, '['),
                   std::string(250, ']'), "}"));
  CHECK_THAT(shallow.message, !Catch::Contains("deep"));
}

TEST_CASE("A chat request's honoured fields are read") {
  const OpenAiRequest r = ParseOk(OpenAiEndpoint::kChatCompletions, R"({
      "model": "toy",
      "messages": [{"role": "developer", "content": "Be brief."},
                   {"role": "user", "content": [{"type": "text", "text": "the "},
                                                {"type": "text", "text": "cat"}]}],
      "max_completion_tokens": 7, "max_tokens": 99, "temperature": 0, "top_p": 0.5,
      "seed": 42, "stop": ["\n", "mat"], "stream": true,
      "stream_options": {"include_usage": true}, "n": 1, "user": "u1",
      "frequency_penalty": 0, "logprobs": false, "tools": null})");
  REQUIRE(r.messages.size() == 2);
  CHECK(r.messages[0].role == "system");
  CHECK(r.messages[1].content == "the cat");
  CHECK(r.max_tokens == 7);  // the newer name wins
  CHECK(r.temperature == 0);
  CHECK(r.top_p == 0.5);
  CHECK(r.seed == 42u);
  CHECK(r.stop == std::vector<std::string>{"\n", "mat"});
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK(r.frequency_penalty == 0);
  CHECK(r.repetition_penalty == 1);
  CHECK(r.top_k == 0);
  // Penalties (OpenAI's two, vLLM's repetition_penalty) and vLLM's top_k.
  const OpenAiRequest penalized = ParseOk(OpenAiEndpoint::kChatCompletions, R"({
      "model": "toy", "messages": [{"role": "user", "content": "a"}],
      "presence_penalty": -0.5, "frequency_penalty": 1.25, "repetition_penalty": 1.1,
      "top_k": 40, "min_p": 0.05})");
  CHECK(penalized.presence_penalty == -0.5);
  CHECK(penalized.frequency_penalty == 1.25);
  CHECK(penalized.repetition_penalty == 1.1);
  CHECK(penalized.top_k == 40);
  CHECK(penalized.min_p == 0.05);
  const OpenAiRequest bounded = ParseOk(
      OpenAiEndpoint::kCompletions,
      R"({"model": "toy", "prompt": "a", "min_tokens": 3, "max_tokens": 5, "stop_token_ids": [7]})");
  CHECK(bounded.min_tokens == 3);
  CHECK(bounded.stop_token_ids == std::vector<int64_t>{7});
  CHECK(penalized.n == 1);
  CHECK(ParseOk(OpenAiEndpoint::kCompletions, R"({"model": "toy", "prompt": "a", "n": 16})").n ==
        16);
  CHECK(ParseOk(OpenAiEndpoint::kCompletions, R"({"model": "toy", "prompt": "a", "top_k": -1})")
            .top_k == 0);

  const OpenAiRequest c =
      ParseOk(OpenAiEndpoint::kCompletions, R"({"model": "toy", "prompt": ["the cat"]})");
  REQUIRE(c.prompts.size() == 1);
  CHECK(c.prompts[0].text == "the cat");
  CHECK(c.max_tokens == 0);
  CHECK(c.temperature == 1.0);  // OpenAI's default
  CHECK_FALSE(c.stream);
}

TEST_CASE("tophat_outline asks for outline-based parallel decoding, and only that") {
  CHECK(ParseOk(OpenAiEndpoint::kCompletions, R"({"model": "toy", "prompt": "x"})")
            .outline_max_points == 0);
  CHECK(ParseOk(OpenAiEndpoint::kCompletions,
                R"({"model": "toy", "prompt": "x", "tophat_outline": true})")
            .outline_max_points == -1);
  CHECK(ParseOk(OpenAiEndpoint::kCompletions,
                R"({"model": "toy", "prompt": "x", "tophat_outline": false})")
            .outline_max_points == 0);
  CHECK(ParseOk(OpenAiEndpoint::kChatCompletions,
                R"({"model": "toy", "messages": [{"role": "user", "content": "x"}],
                    "tophat_outline": {"max_points": 3}})")
            .outline_max_points == 3);
  CHECK(ParseError(OpenAiEndpoint::kCompletions,
                   R"({"model": "toy", "prompt": "x", "tophat_outline": {"points": 3}})")
            .param == "tophat_outline.points");
  CHECK(ParseError(OpenAiEndpoint::kCompletions,
                   R"({"model": "toy", "prompt": "x", "tophat_outline": {"max_points": 1}})")
            .param == "tophat_outline.max_points");
  CHECK(ParseError(OpenAiEndpoint::kCompletions,
                   R"({"model": "toy", "prompt": "x", "tophat_outline": "yes"})")
            .param == "tophat_outline");
}

TEST_CASE("Log-probabilities are asked for in each endpoint's own way") {
  const auto chat = OpenAiEndpoint::kChatCompletions;
  const auto completions = OpenAiEndpoint::kCompletions;
  const std::string messages = R"("model": "toy", "messages": [{"role": "user", "content": "a"}])";
  CHECK(ParseOk(chat, "{" + messages + "}").logprobs == -1);
  CHECK(ParseOk(chat, "{" + messages + R"(, "logprobs": false, "top_logprobs": 0})").logprobs == -1);
  CHECK(ParseOk(chat, "{" + messages + R"(, "logprobs": true})").logprobs == 0);
  CHECK(ParseOk(chat, "{" + messages + R"(, "logprobs": true, "top_logprobs": 20})").logprobs ==
        20);
  CHECK(ParseOk(completions, R"({"model": "toy", "prompt": "a", "logprobs": 3})").logprobs == 3);
  CHECK(ParseOk(completions, R"({"model": "toy", "prompt": "a", "logprobs": null})").logprobs ==
        -1);
  CHECK(ParseOk(completions, R"({"model": "toy", "prompt": "a", "logprobs": 0,
                                  "return_tokens_as_token_ids": true})")
            .return_tokens_as_token_ids);
}

TEST_CASE("logit_bias maps token ids to biases") {
  const OpenAiRequest r = ParseOk(
      OpenAiEndpoint::kChatCompletions,
      R"({"model": "toy", "messages": [{"role": "user", "content": "a"}],
          "logit_bias": {"17": -100, "3": 2.5}})");
  CHECK(r.logit_bias == std::vector<std::pair<int64_t, double>>{{17, -100.0}, {3, 2.5}});
  CHECK(ParseOk(OpenAiEndpoint::kCompletions,
                R"({"model": "toy", "prompt": "a", "logit_bias": {}})")
            .logit_bias.empty());
}

TEST_CASE("echo starts a completion with its prompt, and with max_tokens 0 only scores it") {
  const auto completions = OpenAiEndpoint::kCompletions;
  const OpenAiRequest echoed =
      ParseOk(completions, R"({"model": "toy", "prompt": "a", "echo": true, "logprobs": 1})");
  CHECK(echoed.echo);
  CHECK_FALSE(echoed.prompt_only);
  const OpenAiRequest scored = ParseOk(
      completions, R"({"model": "toy", "prompt": [1, 2], "max_tokens": 0, "echo": true})");
  CHECK(scored.prompt_only);
  CHECK(scored.logprobs == -1);
  CHECK_FALSE(ParseOk(completions, R"({"model": "toy", "prompt": "a", "echo": false})").echo);
}

TEST_CASE("A completions prompt may be token ids, used as they are, and there may be several") {
  const auto completions = OpenAiEndpoint::kCompletions;
  const OpenAiRequest flat = ParseOk(completions, R"({"model": "toy", "prompt": [1, 20, 7]})");
  REQUIRE(flat.prompts.size() == 1);
  CHECK(flat.prompts[0].ids == std::vector<int64_t>{1, 20, 7});
  const OpenAiRequest nested = ParseOk(completions, R"({"model": "toy", "prompt": [[5, 6]]})");
  REQUIRE(nested.prompts.size() == 1);
  CHECK(nested.prompts[0].ids == std::vector<int64_t>{5, 6});
  CHECK_FALSE(ParseOk(completions, R"({"model": "toy", "prompt": "5 6"})").prompts[0].ids);
  // A batch: strings and token ids mixed, each answered with its own n choices.
  const OpenAiRequest batch =
      ParseOk(completions, R"({"model": "toy", "prompt": ["a b", [1, 2], [3]], "n": 2})");
  REQUIRE(batch.prompts.size() == 3);
  CHECK(batch.prompts[0].text == "a b");
  CHECK_FALSE(batch.prompts[0].ids);
  CHECK(batch.prompts[1].ids == std::vector<int64_t>{1, 2});
  CHECK(batch.prompts[2].ids == std::vector<int64_t>{3});
  CHECK(batch.choices() == 6);
  // At most 256 choices in all: 17 prompts x 16 are refused, naming n.
  std::string prompts = "[[1]";
  for (int i = 1; i < 17; ++i) prompts += ", [1]";
  prompts += "]";
  CHECK(ParseError(completions, R"({"model": "toy", "n": 16, "prompt": )" + prompts + "}").param ==
        "n");
  CHECK(ParseOk(completions, R"({"model": "toy", "n": 15, "prompt": )" + prompts + "}")
            .choices() == 255);
  // Chat has its messages and no prompts; its choices are n.
  CHECK(ParseOk(OpenAiEndpoint::kChatCompletions,
                R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "n": 3})")
            .choices() == 3);
}

TEST_CASE("response_format asks for a JSON object, a value of a JSON Schema, or any text") {
  CHECK_FALSE(ParseOk(OpenAiEndpoint::kCompletions, R"({"model": "toy", "prompt": "x"})")
                  .json_object);
  CHECK(ParseOk(OpenAiEndpoint::kChatCompletions,
                R"({"model": "toy", "messages": [{"role": "user", "content": "a"}],
                    "response_format": {"type": "json_object"}})")
            .json_object);
  CHECK(ParseOk(OpenAiEndpoint::kCompletions,
                R"({"model": "toy", "prompt": "x", "response_format": {"type": "json_object"}})")
            .json_object);
  CHECK_FALSE(ParseOk(OpenAiEndpoint::kCompletions,
                      R"({"model": "toy", "prompt": "x", "response_format": {"type": "text"}})")
                  .json_object);
  // A schema, as OpenAI's clients send it (strict or not: decoding holds to it either way),
  // kept as JSON text for the agent.
  const OpenAiRequest schema = ParseOk(OpenAiEndpoint::kChatCompletions,
                                       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}],
                                           "response_format": {"type": "json_schema", "json_schema": {
                                             "name": "person-1", "description": "who", "strict": true,
                                             "schema": {"type": "object", "properties": {"name": {"type": "string"}},
                                                        "required": ["name"], "additionalProperties": false}}}})");
  CHECK_FALSE(schema.json_object);
  CHECK(nlohmann::json::parse(schema.json_schema) ==
        nlohmann::json::parse(R"({"type": "object", "properties": {"name": {"type": "string"}},
                                  "required": ["name"], "additionalProperties": false})"));
  // A schema the agent cannot hold an answer to is refused before any answer, naming its
  // place.
  const OpenAiError refused = ParseError(
      OpenAiEndpoint::kCompletions,
      R"({"model": "toy", "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
          "name": "n", "schema": {"type": "object", "properties": {"age": {"type": "integer", "uniqueItems": true}}}}}})");
  CHECK(refused.param == "response_format");
  CHECK_THAT(refused.message,
             Catch::Contains("at /properties/age: \"uniqueItems\" is not supported"));
  for (const char* format : {
           R"({"type": "json_schema"})",
           R"({"type": "json_schema", "json_schema": {"schema": {}}})",
           R"({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}})",
           R"({"type": "json_schema", "json_schema": {"name": "n"}})",
           R"({"type": "json_schema", "json_schema": {"name": "n", "schema": {}, "extra": 1}})",
           R"({"type": "json_schema", "json_schema": {"name": "n", "schema": {}, "strict": "yes"}})",
           R"({"type": "json_object", "json_schema": {"name": "n", "schema": {}}})",
       }) {
    INFO(format);
    CHECK(ParseError(OpenAiEndpoint::kCompletions,
                     absl::StrCat(R"({"model": "toy", "prompt": "x", "response_format": )", format, "}"))
              .param == "response_format");
  }
}

// A chat body with `extra` fields after one user message.
std::string ChatWith(const std::string& extra) {
  return absl::StrCat(R"({"model": "toy", "messages": [{"role": "user", "content": "hi"}], )",
                      extra, "}");
}
constexpr const char* kTools = R"("tools": [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}, "strict": true}},
    {"type": "function", "function": {"name": "now"}}])";

TEST_CASE("Tools are read with their key order, and tool_choice defaults to auto") {
  OpenAiRequest r = ParseOk(OpenAiEndpoint::kChatCompletions, ChatWith(kTools));
  REQUIRE(r.tools.size() == 2);
  CHECK(r.tool_choice == ToolChoice::kAuto);
  CHECK(r.parallel_tool_calls);
  CHECK(r.tools[0].name == "get_weather");
  // As the app wrote it ("type" before "function", "name" before "description"), not sorted.
  CHECK(r.tools[0].json.starts_with(
      R"({"type":"function","function":{"name":"get_weather","description":"Weather","parameters":)"));
  CHECK(nlohmann::json::parse(r.tools[0].parameters)["required"][0] == "city");
  // No parameters: a function of none.
  CHECK(nlohmann::json::parse(r.tools[1].parameters) ==
        nlohmann::json::parse(R"({"type": "object", "properties": {}})"));

  r = ParseOk(OpenAiEndpoint::kChatCompletions,
              ChatWith(absl::StrCat(kTools, R"(, "tool_choice": "required", "parallel_tool_calls": false)")));
  CHECK(r.tool_choice == ToolChoice::kRequired);
  CHECK_FALSE(r.parallel_tool_calls);
  r = ParseOk(OpenAiEndpoint::kChatCompletions,
              ChatWith(absl::StrCat(kTools, R"(, "tool_choice": {"type": "function", "function": {"name": "now"}})")));
  CHECK(r.tool_choice == ToolChoice::kFunction);
  CHECK(r.tool_choice_function == "now");
  r = ParseOk(OpenAiEndpoint::kChatCompletions,
              ChatWith(absl::StrCat(kTools, R"(, "tool_choice": "none")")));
  CHECK(r.tool_choice == ToolChoice::kNone);
  CHECK(r.tools.size() == 2);  // still shown to the model
  // No tools: none, and "tools": [] is no tools.
  CHECK(ParseOk(OpenAiEndpoint::kChatCompletions, ChatWith(R"("tools": [])")).tool_choice ==
        ToolChoice::kNone);
}

TEST_CASE("A conversation's calls and their answers are read back") {
  // An answer's message sent back whole, as the official client does (nulls included).
  const OpenAiRequest r = ParseOk(OpenAiEndpoint::kChatCompletions, absl::StrCat(R"({
      "model": "toy", )", kTools, R"(,
      "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": null, "refusal": null, "function_call": null,
         "audio": null, "annotations": [],
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "cold"}]}]})"));
  REQUIRE(r.messages.size() == 3);
  REQUIRE(r.messages[1].tool_calls.size() == 1);
  CHECK(r.messages[1].content.empty());
  CHECK(r.messages[1].tool_calls[0].id == "call_1");
  CHECK(r.messages[1].tool_calls[0].name == "get_weather");
  CHECK(r.messages[1].tool_calls[0].arguments == R"({"city": "Oslo"})");
  CHECK(r.messages[2].role == "tool");
  CHECK(r.messages[2].tool_call_id == "call_1");
  CHECK(r.messages[2].content == "cold");
}

TEST_CASE("Tools, tool_choice and calls that could not be honoured are refused by name") {
  const auto chat = OpenAiEndpoint::kChatCompletions;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {ChatWith(R"("tools": {})"), "tools"},
      {ChatWith(R"("tools": [{"type": "retrieval"}])"), "tools[0]"},
      // Fields of the wrong type are refusals, not exceptions (fuzzing found the first).
      {ChatWith(R"("tools": [{"type": null, "function": {"name": "a"}}])"), "tools[0]"},
      {ChatWith(R"("tool_choice": {"type": 1, "function": {"name": "a"}})"), "tool_choice"},
      {R"({"model": "toy", "messages": [{"role": "assistant", "tool_calls": [{"type": 2,
           "function": {"name": "a", "arguments": "{}"}}]}]})",
       "messages[0].tool_calls[0]"},
      {R"({"model": "toy", "messages": [{"role": "user", "content": [{"type": 5}]}]})",
       "messages[0].content"},
      {ChatWith(R"("tools": [{"type": "function", "function": {"name": "a b"}}])"),
       "tools[0].function.name"},
      {ChatWith(R"("tools": [{"type": "function", "function": {"name": "a"}},
                             {"type": "function", "function": {"name": "a"}}])"),
       "tools[1].function.name"},
      {ChatWith(R"("tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "string"}}}])"),
       "tools[0].function.parameters"},
      {ChatWith(R"("tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "(a)\\1"}}}}}])"),
       "tools[0].function.parameters"},
      {ChatWith(R"("tools": [{"type": "function", "function": {"name": "a", "returns": {}}}])"),
       "tools[0].function.returns"},
      {ChatWith(R"("tool_choice": "auto")"), "tool_choice"},
      {ChatWith(absl::StrCat(kTools, R"(, "tool_choice": "always")")), "tool_choice"},
      {ChatWith(absl::StrCat(kTools, R"(, "tool_choice": {"type": "function", "function": {"name": "launch"}})")),
       "tool_choice"},
      {ChatWith(absl::StrCat(kTools, R"(, "parallel_tool_calls": "yes")")), "parallel_tool_calls"},
      {ChatWith(absl::StrCat(kTools, R"(, "response_format": {"type": "json_object"})")),
       "response_format"},
      {ChatWith(absl::StrCat(kTools, R"(, "tool_choice": "required", "min_tokens": 2)")),
       "min_tokens"},
      {ChatWith(absl::StrCat(kTools, R"(, "min_tokens": 2)")), "min_tokens"},
      {ChatWith(absl::StrCat(kTools, R"(, "tophat_outline": true)")), "tophat_outline"},
      {R"({"model": "toy", "messages": [{"role": "assistant", "tool_calls": [{"type": "function",
           "function": {"name": "a", "arguments": "{\"x\":"}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"({"model": "toy", "messages": [{"role": "assistant", "tool_calls": [{"type": "function",
           "function": {"name": "a", "arguments": "[1]"}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"({"model": "toy", "messages": [{"role": "user", "content": "a", "tool_calls": []}]})",
       "messages[0].tool_calls"},
      {R"({"model": "toy", "messages": [{"role": "assistant", "content": null}]})",
       "messages[0].content"},
  };
  for (const auto& [body, param] : cases) {
    INFO(body);
    const OpenAiError error = ParseError(chat, body);
    CHECK(error.param == param);
    CHECK(error.http_status == 400);
  }
  // The completions endpoint has no tools.
  CHECK(ParseError(OpenAiEndpoint::kCompletions, R"({"model": "toy", "prompt": "a", "tools": []})")
            .param == "tools");
}

TEST_CASE("An answer's calls are returned only when they read and satisfy their tool's schema") {
  const OpenAiRequest request = ParseOk(OpenAiEndpoint::kChatCompletions, ChatWith(kTools));
  // The toy model's layout.
  const ToolCallSyntax syntax =
      *ChatTemplate::FromSource(kToyChatTemplateSource, "toy")->tool_call_syntax();
  auto reader = ToolCallReader::Create(request, syntax);
  REQUIRE(reader.ok());
  const std::string good =
      R"(Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call> )"
      R"(<tool_call>{"name": "now", "arguments": {}}</tool_call>)";
  ToolCallReading read = reader->Read(good);
  CHECK(read.content == "Sure.");
  REQUIRE(read.calls.size() == 2);
  CHECK(read.calls[0].arguments == R"({"city":"Oslo"})");
  // A call that breaks its schema (no city) leaves the whole answer text.
  const std::string broken =
      R"(<tool_call>{"name": "get_weather", "arguments": {"town": "Oslo"}}</tool_call>)";
  read = reader->Read(broken);
  CHECK(read.calls.empty());
  CHECK(read.content == broken);

  // parallel_tool_calls false keeps the first call; a named function is the only one read.
  OpenAiRequest single = request;
  single.parallel_tool_calls = false;
  CHECK(ToolCallReader::Create(single, syntax)->Read(good).calls.size() == 1);
  OpenAiRequest named = request;
  named.tool_choice = ToolChoice::kFunction;
  named.tool_choice_function = "now";
  CHECK(ToolCallReader::Create(named, syntax)->Read(good).calls.empty());
}

TEST_CASE("gpt-oss's calls are the answer's only when all are offered tools' valid calls") {
  const OpenAiRequest request = ParseOk(OpenAiEndpoint::kChatCompletions, ChatWith(kTools));
  auto reader = ToolCallReader::Create(request, ToolCallSyntax{});
  REQUIRE(reader.ok());
  const std::vector<HarmonyCall> good = {
      {.recipient = "functions.get_weather", .body = R"({ "city" : "Oslo", "unit": "c" })"}};
  ToolCallReading read = ReadHarmonyCalls(good, &*reader);
  REQUIRE(read.calls.size() == 1);
  CHECK(read.calls[0].name == "get_weather");
  // Compacted, in the model's key order.
  CHECK(read.calls[0].arguments == R"({"city":"Oslo","unit":"c"})");
  CHECK(read.content.empty());

  // Not a function, not an offered tool, arguments that break the schema or are not an
  // object: the bodies are the answer's text.
  for (const HarmonyCall& bad : std::vector<HarmonyCall>{
           {.recipient = "browser.search", .body = R"({"city": "Oslo"})"},
           {.recipient = "functions.launch", .body = R"({"city": "Oslo"})"},
           {.recipient = "functions.get_weather", .body = R"({"town": "Oslo"})"},
           {.recipient = "functions.get_weather", .body = R"("Oslo")"}}) {
    INFO(bad.recipient << " " << bad.body);
    read = ReadHarmonyCalls(std::vector<HarmonyCall>{good[0], bad}, &*reader);
    CHECK(read.calls.empty());
    CHECK(read.content == good[0].body + bad.body);
  }
  // No tools offered: a call is text.
  read = ReadHarmonyCalls(good, nullptr);
  CHECK(read.calls.empty());
  CHECK(read.content == good[0].body);
}

TEST_CASE("A streamed answer holds back what may be a call until it ends") {
  const ToolCallSyntax tagged{.open = "<tool_call>\n{\"name\": \"", .between = "", .close = "",
                              .separator = "\n", .start_tag = "<tool_call>",
                              .end_tag = "</tool_call>", .arguments_key = "arguments"};
  ToolCallHoldback holdback(tagged, /*hold_all=*/false);
  std::string sent;
  for (const char* piece : {"Let me ", "check.<", "tool", "_call>\n{\"name\"", ": \"x\"}"}) {
    sent += holdback.Push(piece);
  }
  CHECK(sent == "Let me check.");
  CHECK(holdback.held() == "<tool_call>\n{\"name\": \"x\"}");
  // A '<' that turns out not to start a tag goes out once that is known.
  ToolCallHoldback text(tagged, false);
  CHECK(text.Push("a <") == "a ");
  CHECK(text.Push("b") == "<b");
  CHECK(text.held().empty());

  // Llama 3.1's layout has no tags: an answer that starts with '{' is held whole.
  const ToolCallSyntax bare{.open = "{\"name\": \"", .between = "", .close = "}",
                            .separator = std::nullopt, .start_tag = "", .end_tag = "",
                            .arguments_key = "parameters"};
  ToolCallHoldback json(bare, false);
  CHECK(json.Push("  ").empty());
  CHECK(json.Push("{\"name\"").empty());
  CHECK(json.held() == "  {\"name\"");
  ToolCallHoldback prose(bare, false);
  CHECK(prose.Push(" ").empty());
  CHECK(prose.Push("It is") == " It is");
  // Under a required call, everything waits.
  ToolCallHoldback all(tagged, /*hold_all=*/true);
  CHECK(all.Push("anything").empty());
  CHECK(all.held() == "anything");
}

TEST_CASE("ignore_eos, as vLLM takes it, asks for max_tokens whatever the model says") {
  CHECK_FALSE(ParseOk(OpenAiEndpoint::kCompletions, R"({"model": "toy", "prompt": "x"})")
                  .ignore_eos);
  CHECK(ParseOk(OpenAiEndpoint::kCompletions,
                R"({"model": "toy", "prompt": "x", "ignore_eos": true})")
            .ignore_eos);
  CHECK(ParseError(OpenAiEndpoint::kCompletions,
                   R"({"model": "toy", "prompt": "x", "ignore_eos": 1})")
            .param == "ignore_eos");
}

TEST_CASE("What the endpoint would ignore is refused by name, with OpenAI's error shape") {
  struct Case {
    OpenAiEndpoint endpoint;
    std::string body;
    std::string param;
    int status = 400;
  };
  const auto chat = OpenAiEndpoint::kChatCompletions;
  const auto completions = OpenAiEndpoint::kCompletions;
  const std::vector<Case> cases = {
      {chat, R"({"model": "toy"})", "messages"},
      {chat, R"({"messages": [{"role": "user", "content": "hi"}]})", "model"},
      {chat, R"({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})", "model",
       404},
      {chat, R"({"model": "toy", "messages": []})", "messages"},
      {chat, R"({"model": "toy", "messages": [{"role": "tool", "content": "x"}]})",
       "messages[0].tool_call_id"},
      {chat, R"({"model": "toy", "messages": [{"role": "function", "content": "x"}]})",
       "messages[0].role"},
      {chat, R"({"model": "toy", "messages": [{"role": "user"}]})", "messages[0].content"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content"},
      {chat, R"({"model": "toy", "messages": [{"role": "user", "content": "a", "name": "x"}]})",
       "messages[0].name"},
      {chat, R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "n": 0})", "n"},
      {chat, R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "n": 17})", "n"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "n": 2, "tophat_outline": true})",
       "n"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "presence_penalty": 2.5})",
       "presence_penalty"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "frequency_penalty": "1"})",
       "frequency_penalty"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "repetition_penalty": 0})",
       "repetition_penalty"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "logprobs": 2})",
       "logprobs"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "top_logprobs": 2})",
       "top_logprobs"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "logprobs": true, "top_logprobs": 21})",
       "top_logprobs"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "logprobs": true, "tophat_outline": true})",
       "logprobs"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "temperature": 3})",
       "temperature"},
      {chat, R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "top_p": 0})",
       "top_p"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "max_tokens": 0})",
       "max_tokens"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "stop": ["a","b","c","d","e"]})",
       "stop"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "stream_options": {"include_usage": true}})",
       "stream_options"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "top_k": 1.5})",
       "top_k"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "top_k": -2})",
       "top_k"},
      {chat,
       R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "min_p": 1.5})",
       "min_p"},
      {completions, R"({"model": "toy", "prompt": "a", "min_tokens": 6, "max_tokens": 5})",
       "min_tokens"},
      {completions, R"({"model": "toy", "prompt": "a", "stop_token_ids": [1, -1]})",
       "stop_token_ids"},
      {completions, R"({"model": "toy", "prompt": [1, -2, 3]})", "prompt"},
      {completions, R"({"model": "toy", "prompt": []})", "prompt"},
      {completions, R"({"model": "toy", "prompt": [[1], []]})", "prompt"},
      {completions, R"({"model": "toy", "prompt": [[1], [2]], "tophat_outline": true})",
       "prompt"},
      {completions, R"({"model": "toy", "prompt": [1, "a"]})", "prompt"},
      {completions, R"({"model": "toy", "prompt": "a", "logprobs": true})", "logprobs"},
      {completions, R"({"model": "toy", "prompt": "a", "logprobs": 21})", "logprobs"},
      {completions, R"({"model": "toy", "prompt": "a", "return_tokens_as_token_ids": 1})",
       "return_tokens_as_token_ids"},
      {completions, R"({"model": "toy", "prompt": "a", "echo": 1})", "echo"},
      {completions, R"({"model": "toy", "prompt": "a", "logit_bias": {"x": 1}})", "logit_bias"},
      {completions, R"({"model": "toy", "prompt": "a", "logit_bias": {"5": 101}})", "logit_bias"},
      {completions, R"({"model": "toy", "prompt": "a", "logit_bias": {"-5": 1}})", "logit_bias"},
      {completions, R"({"model": "toy", "prompt": "a", "logit_bias": [5]})", "logit_bias"},
      {chat, R"({"model": "toy", "messages": [{"role": "user", "content": "a"}], "echo": true})",
       "echo"},
      {completions, R"({"model": "toy", "prompt": "a", "max_tokens": 0})", "max_tokens"},
      {completions, R"({"model": "toy", "prompt": "a", "echo": true, "tophat_outline": true})",
       "echo"},
      {completions, R"({"model": "toy", "prompt": "a", "max_completion_tokens": 3})",
       "max_completion_tokens"},
      {completions, R"({"model": "toy", "prompt": "a", "response_format": "json_object"})",
       "response_format"},
      {completions, R"({"model": "toy", "prompt": "a", "response_format": {"type": "xml"}})",
       "response_format"},
      {completions, R"({"model": "toy", "prompt": "a", "response_format": {}})",
       "response_format"},
      {completions,
       R"({"model": "toy", "prompt": "a", "response_format": {"type": "json_schema",
           "json_schema": {"name": "x", "schema": {"type": "object"}}}, "min_tokens": 2})",
       "min_tokens"},
      {completions,
       R"({"model": "toy", "prompt": "a", "response_format": {"type": "json_object"},
           "tophat_outline": true})",
       "response_format"},
      {completions,
       R"({"model": "toy", "prompt": "a", "response_format": {"type": "json_object"},
           "min_tokens": 2})",
       "min_tokens"},
  };
  for (const Case& c : cases) {
    INFO(c.body);
    const OpenAiError error = ParseError(c.endpoint, c.body);
    CHECK(error.param == c.param);
    CHECK(error.http_status == c.status);
    const nlohmann::json json = error.ToJson();
    CHECK(json["error"]["type"] == "invalid_request_error");
    CHECK(json["error"]["param"] == c.param);
    CHECK(json["error"]["message"].get<std::string>().size() > 10);
  }
  CHECK(ParseError(chat, R"({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})")
            .ToJson()["error"]["code"] == "model_not_found");
  CHECK(ParseError(chat, "{not json").http_status == 400);
  // A body that is not UTF-8: the parser's message quotes its bytes, and the error object must
  // still serialise (it threw, and the client got httplib's 500 instead of this 400).
  const OpenAiError not_utf8 = ParseError(chat, "{\"model\xff\xfe\": 1}");
  CHECK(not_utf8.http_status == 400);
  CHECK_NOTHROW(not_utf8.ToJson().dump());
  CHECK(ParseError(chat, "[1]").param.empty());
}

TEST_CASE("A stop sequence never reaches the client, even split over tokens") {
  StopSequenceFilter filter({"cat", "\n\n"});
  CHECK(filter.Push("the c") == "the ");  // "c" may start "cat"
  CHECK(filter.Push("a") == "");          // "ca" still may
  CHECK(filter.Push("r and a") == "car and a");
  CHECK(filter.Push("\n") == "");
  CHECK(filter.Push("x ca") == "\nx ");
  CHECK_FALSE(filter.stopped());
  CHECK(filter.Push("t sat") == "");
  CHECK(filter.stopped());
  CHECK(filter.Push("more") == "");
  CHECK(filter.Flush() == "");

  // The earliest stop wins; at the end the held-back tail is released.
  StopSequenceFilter two({"b", "ab"});
  CHECK(two.Push("xab") == "x");
  CHECK(two.stopped());
  StopSequenceFilter tail({"cat"});
  CHECK(tail.Push("a c") == "a ");
  CHECK(tail.Flush() == "c");
  StopSequenceFilter none({});
  CHECK(none.Push("anything") == "anything");

  // include_stop_str_in_output: the stop sequence ends the text; the earliest one's, the
  // first listed at a tie.
  StopSequenceFilter included({"cat", "ca", "\n\n"}, /*include_stop=*/true);
  CHECK(included.Push("the c") == "the ");
  CHECK(included.Push("at sat") == "cat");
  CHECK(included.stopped());
  StopSequenceFilter shorter({"ab", "b"}, /*include_stop=*/true);
  CHECK(shorter.Push("xab") == "xab");
  CHECK(ParseOk(OpenAiEndpoint::kCompletions,
                R"({"model": "toy", "prompt": "a", "include_stop_str_in_output": true})")
            .include_stop_str_in_output);
}

TEST_CASE("/tokenize and /detokenize requests are read as vLLM's, and refused by name") {
  const auto tokenize = [](const std::string& body) {
    return ParseTokenizeRequest(body, kModel);
  };
  const auto prompt = tokenize(R"({"model": "toy", "prompt": "the cat"})");
  REQUIRE(std::holds_alternative<TokenizeRequest>(prompt));
  CHECK(std::get<TokenizeRequest>(prompt).prompt == "the cat");
  CHECK(std::get<TokenizeRequest>(prompt).add_special_tokens);
  const auto chat = tokenize(
      R"({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true,
          "add_special_tokens": false})");
  REQUIRE(std::holds_alternative<TokenizeRequest>(chat));
  CHECK(std::get<TokenizeRequest>(chat).messages.size() == 1);
  CHECK_FALSE(std::get<TokenizeRequest>(chat).add_special_tokens);
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"model": "toy"})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      // Both: the later key is refused (keys are read in sorted order).
      {R"({"prompt": "a", "messages": [{"role": "user", "content": "b"}]})", "prompt"},
      {R"({"messages": [{"role": "user", "content": "b"}], "add_generation_prompt": false})",
       "add_generation_prompt"},
      {R"({"prompt": "a", "suffix": "b"})", "suffix"},
  };
  for (const auto& [body, param] : refused) {
    INFO(body);
    const auto parsed = tokenize(body);
    REQUIRE(std::holds_alternative<OpenAiError>(parsed));
    CHECK(std::get<OpenAiError>(parsed).param == param);
  }
  const auto other_model = tokenize(R"({"model": "gpt-4o", "prompt": "a"})");
  REQUIRE(std::holds_alternative<OpenAiError>(other_model));
  CHECK(std::get<OpenAiError>(other_model).http_status == 404);

  const auto ids = ParseDetokenizeRequest(R"({"model": "toy", "tokens": [1, 20, 7]})", kModel);
  REQUIRE(std::holds_alternative<DetokenizeRequest>(ids));
  CHECK(std::get<DetokenizeRequest>(ids).tokens == std::vector<int64_t>{1, 20, 7});
  for (const std::string body : {R"({"tokens": [1, -2]})", R"({"tokens": "1 2"})", R"({})"}) {
    INFO(body);
    const auto parsed = ParseDetokenizeRequest(body, kModel);
    REQUIRE(std::holds_alternative<OpenAiError>(parsed));
    CHECK(std::get<OpenAiError>(parsed).param == "tokens");
  }
}

}  // namespace
}  // namespace tophat

namespace tophat {
namespace {

TEST_CASE("vLLM's structured outputs: a regex or a choice the whole answer must match") {
  const OpenAiRequest regex = ParseOk(OpenAiEndpoint::kChatCompletions, R"({"model": "toy",
      "messages": [{"role": "user", "content": "x"}],
      "structured_outputs": {"regex": "[A-Z]{2}-\\d{3}"}})");
  CHECK(regex.regex == R"([A-Z]{2}-\d{3})");
  CHECK(regex.json_schema.empty());
  const OpenAiRequest choice = ParseOk(OpenAiEndpoint::kCompletions, R"({"model": "toy",
      "prompt": "x", "guided_choice": ["yes", "no", "a.b"]})");
  CHECK(choice.answer_choices == std::vector<std::string>{"yes", "no", "a.b"});
  CHECK(choice.regex.empty());
  CHECK(ParseOk(OpenAiEndpoint::kCompletions,
                R"({"model": "toy", "prompt": "x", "guided_regex": "a+"})")
            .regex == "a+");
  CHECK(ParseOk(OpenAiEndpoint::kCompletions, R"({"model": "toy", "prompt": "x",
                "structured_outputs": {"choice": ["1"]}})")
            .answer_choices == std::vector<std::string>{"1"});
  // Thousands of labels (past what a regex of them may hold) are taken.
  nlohmann::json labels = nlohmann::json::array();
  for (int i = 0; i < 5000; ++i) labels.push_back(absl::StrCat("label number ", i));
  CHECK(ParseOk(OpenAiEndpoint::kCompletions,
                absl::StrCat(R"({"model": "toy", "prompt": "x", "guided_choice": )", labels.dump(),
                             "}"))
            .answer_choices.size() == 5000);
  const OpenAiRequest json = ParseOk(OpenAiEndpoint::kCompletions, R"({"model": "toy",
      "prompt": "x", "structured_outputs": {"json": {"type": "integer"}}})");
  CHECK(json.json_schema == R"({"type":"integer"})");
  CHECK(ParseOk(OpenAiEndpoint::kCompletions, R"({"model": "toy", "prompt": "x",
                "structured_outputs": {"json_object": true}})")
            .json_object);
  // A structural tag, as response_format (SGLang's and vLLM's) or structured_outputs (vLLM's
  // JSON text, or the object).
  constexpr char kTag[] = R"({"structures": [{"begin": "<f=a>", "schema": {"type": "object"},
      "end": "</f>"}], "triggers": ["<f="]})";
  const std::string tag = nlohmann::json::parse(kTag).dump();
  CHECK(ParseOk(OpenAiEndpoint::kChatCompletions,
                absl::StrCat(R"({"model": "toy", "messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "structural_tag", "structures": [{"begin": "<f=a>",
                "schema": {"type": "object"}, "end": "</f>"}], "triggers": ["<f="]}})"))
            .structural_tag ==
        R"({"structures":[{"begin":"<f=a>","end":"</f>","schema":{"type":"object"}}],)"
        R"("triggers":["<f="],"type":"structural_tag"})");
  CHECK(ParseOk(OpenAiEndpoint::kCompletions,
                absl::StrCat(R"({"model": "toy", "prompt": "x", "structured_outputs":
                {"structural_tag": )",
                             nlohmann::json(tag).dump(), "}}"))
            .structural_tag == tag);
  CHECK(ParseOk(OpenAiEndpoint::kCompletions,
                absl::StrCat(R"({"model": "toy", "prompt": "x", "structured_outputs":
                {"structural_tag": )",
                             tag, "}}"))
            .structural_tag == tag);
}

TEST_CASE("vLLM's structured outputs are refused where they cannot hold, naming the field") {
  struct Case {
    std::string fields;
    std::string param;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {R"j("structured_outputs": {"regex": "(?=a)"})j", "structured_outputs.regex",
            "'structured_outputs.regex': regex: "},
           {R"j("guided_regex": "")j", "guided_regex", "non-empty regular expression"},
           {R"j("guided_choice": [])j", "guided_choice", "non-empty array of non-empty strings"},
           {R"j("guided_choice": ["a", ""])j", "guided_choice", "non-empty strings"},
           {absl::StrCat(R"j("guided_choice": )j",
                         nlohmann::json(std::vector<std::string>(65537, "x")).dump()),
            "guided_choice", "'guided_choice': choice: 65537 given, at most 65536"},
           {absl::StrCat(
                R"j("structured_outputs": {"choice": )j",
                nlohmann::json(std::vector<std::string>(1100, std::string(256, 'x'))).dump(), "}"),
            "structured_outputs.choice", "bytes in all, at most 262144"},
           {R"j("structured_outputs": {"structural_tag": "{}"})j",
            "structured_outputs.structural_tag",
            "'structured_outputs.structural_tag': structures: missing or not an array"},
           {R"j("structured_outputs": {"structural_tag": "{"})j",
            "structured_outputs.structural_tag",
            "'structured_outputs.structural_tag' is not a JSON object"},
           {R"j("structured_outputs": {"whitespace_pattern": " "})j",
            "structured_outputs.whitespace_pattern",
            "not supported (regex, choice, grammar, json, json_object, structural_tag)"},
           {R"j("response_format": {"type": "structural_tag", "structures": [{"begin": "<f=a>",
                "schema": {"type": "object"}, "end": "</f>"}], "triggers": ["<g="]})j",
            "response_format",
            "'response_format': structures[0].begin: \"<f=a>\" starts with none of the triggers"},
           {R"j("response_format": {"type": "structural_tag", "structures": [{"begin": "<f=a>",
                "schema": {"type": "object", "uniqueItems": true}, "end": ""}],
                "triggers": ["<f="]})j",
            "response_format",
            "'response_format': structures[0].schema at /: \"uniqueItems\" is not supported"},
           {R"j("response_format": {"type": "structural_tag", "format": {}})j", "response_format",
            "the later form of structural tags"},
           {R"j("response_format": {"type": "structural_tag", "structures": [{"begin": "<f=a>",
                "schema": {}, "end": "</f>"}], "triggers": ["<f="]}, "min_tokens": 2)j",
            "min_tokens", "cannot be combined with 'response_format'"},
           {R"j("structured_outputs": {"regex": "a", "choice": ["b"]})j", "structured_outputs",
            "one of"},
           {R"j("structured_outputs": {})j", "structured_outputs", "one of"},
           {R"j("structured_outputs": {"json": {"uniqueItems": true}})j", "structured_outputs.json",
            "'structured_outputs.json' at /: \"uniqueItems\" is not supported"},
           {R"j("guided_regex": "a", "response_format": {"type": "json_object"})j",
            "response_format", "give the answer's format once"},
           {R"j("guided_regex": "a", "guided_choice": ["b"])j", "guided_regex",
            "give the answer's format once"},
           {R"j("guided_choice": ["a"], "min_tokens": 2)j", "min_tokens",
            "cannot be combined with 'guided_choice'"},
           {R"j("guided_regex": "a", "tophat_outline": true)j", "guided_regex",
            "'guided_regex' cannot be combined with 'tophat_outline'"},
       }) {
    INFO(c.fields);
    const OpenAiError error =
        ParseError(OpenAiEndpoint::kCompletions,
                   absl::StrCat(R"j({"model": "toy", "prompt": "x", )j", c.fields, "}"));
    CHECK(error.param == c.param);
    CHECK_THAT(error.message, Catch::Contains(c.message));
  }
  const OpenAiError tools = ParseError(OpenAiEndpoint::kChatCompletions, R"j({"model": "toy",
      "messages": [{"role": "user", "content": "x"}], "guided_regex": "a",
      "tools": [{"type": "function", "function": {"name": "f"}}]})j");
  CHECK(tools.param == "guided_regex");
  CHECK_THAT(tools.message, Catch::Contains("'guided_regex' cannot be combined with calling"));
}

}  // namespace
}  // namespace tophat

namespace tophat {
namespace {

TEST_CASE("vLLM's structured outputs: a GBNF grammar whose root the whole answer must match") {
  // Recursive: an item is a word or a parenthesised list. As JSON, then as read.
  const std::string json =
      R"j("root ::= item (\", \" item)*\nitem ::= [a-z]+ | \"(\" root \")\"")j";
  const std::string grammar = "root ::= item (\", \" item)*\nitem ::= [a-z]+ | \"(\" root \")\"";
  const OpenAiRequest chat =
      ParseOk(OpenAiEndpoint::kChatCompletions,
              absl::StrCat(R"({"model": "toy", "messages": [{"role": "user", "content": "x"}],
                       "structured_outputs": {"grammar": )",
                           json, "}}"));
  CHECK(chat.grammar == grammar);
  CHECK(chat.regex.empty());
  CHECK(chat.json_schema.empty());
  CHECK_FALSE(chat.json_object);
  const OpenAiRequest completion =
      ParseOk(OpenAiEndpoint::kCompletions,
              absl::StrCat(R"({"model": "toy", "prompt": "x", "guided_grammar": )", json, "}"));
  CHECK(completion.grammar == grammar);
  // SGLang's ebnf and llama.cpp's grammar are the same field; SGLang's regex is guided_regex.
  for (const char* key : {"ebnf", "grammar"}) {
    INFO(key);
    const OpenAiRequest aliased = ParseOk(
        OpenAiEndpoint::kChatCompletions,
        absl::StrCat(R"({"model": "toy", "messages": [{"role": "user", "content": "x"}], ")", key,
                     R"(": )", json, "}"));
    CHECK(aliased.grammar == grammar);
  }
  CHECK(
      ParseOk(OpenAiEndpoint::kCompletions, R"({"model": "toy", "prompt": "x", "regex": "[a-z]+"})")
          .regex == "[a-z]+");
  CHECK_THAT(ParseError(OpenAiEndpoint::kCompletions,
                        R"j({"model": "toy", "prompt": "x", "ebnf": "root ::= \"a\"",
                            "guided_grammar": "root ::= \"a\""})j")
                 .message,
             Catch::Contains("give the answer's format once"));
  // A null beside it is absent, as for the other formats.
  CHECK(ParseOk(OpenAiEndpoint::kCompletions, R"j({"model": "toy", "prompt": "x",
                "structured_outputs": {"grammar": "root ::= \"yes\" | \"no\"", "regex": null}})j")
            .grammar == R"(root ::= "yes" | "no")");
}

TEST_CASE("A grammar is refused where it cannot hold, naming the field and the place in it") {
  struct Case {
    std::string fields;
    std::string param;
    std::vector<std::string> message;
  };
  for (const Case& c : std::vector<Case>{
           // Syntax: the line and column.
           {R"j("structured_outputs": {"grammar": "root ::= \"a"})j",
            "structured_outputs.grammar",
            {"'structured_outputs.grammar': grammar: line 1, column "}},
           {R"j("guided_grammar": "root ::= \"a\"\nitem ::= \"b\" )")j",
            "guided_grammar",
            {"'guided_grammar': grammar: line 2, column 14: "}},
           // The rules: undefined, missing root, left recursion.
           {R"j("guided_grammar": "root ::= itme\nitem ::= \"a\"")j",
            "guided_grammar",
            {"'guided_grammar': grammar: ", "'itme'", "is not defined"}},
           {R"j("structured_outputs": {"grammar": "item ::= \"a\""})j",
            "structured_outputs.grammar",
            {"'structured_outputs.grammar': grammar: no 'root' rule"}},
           {R"j("guided_grammar": "root ::= root \"a\" | \"a\"")j",
            "guided_grammar",
            {"'guided_grammar': grammar: ", "'root'", "left-recursive"}},
           {R"j("guided_grammar": "")j", "guided_grammar", {"non-empty grammar"}},
           {R"j("structured_outputs": {"grammar": ["root ::= \"a\""]})j",
            "structured_outputs.grammar",
            {"non-empty grammar"}},
           // Two formats at once.
           {R"j("structured_outputs": {"grammar": "root ::= \"a\"", "regex": "a"})j",
            "structured_outputs",
            {"one of"}},
           {R"j("guided_grammar": "root ::= \"a\"", "guided_regex": "a")j",
            "guided_regex",
            {"give the answer's format once", "'guided_grammar'"}},
           {R"j("structured_outputs": {"grammar": "root ::= \"a\""},
                "response_format": {"type": "json_object"})j",
            "structured_outputs",
            {"give the answer's format once"}},
           // What a regex cannot be combined with.
           {R"j("guided_grammar": "root ::= \"a\"", "min_tokens": 2)j",
            "min_tokens",
            {"cannot be combined with 'guided_grammar'"}},
           {R"j("structured_outputs": {"grammar": "root ::= \"a\""}, "tophat_outline": true)j",
            "structured_outputs",
            {"'structured_outputs' cannot be combined with 'tophat_outline'"}},
       }) {
    INFO(c.fields);
    const OpenAiError error =
        ParseError(OpenAiEndpoint::kCompletions,
                   absl::StrCat(R"j({"model": "toy", "prompt": "x", )j", c.fields, "}"));
    CHECK(error.http_status == 400);
    CHECK(error.param == c.param);
    for (const std::string& part : c.message) CHECK_THAT(error.message, Catch::Contains(part));
  }
  const OpenAiError tools = ParseError(OpenAiEndpoint::kChatCompletions, R"j({"model": "toy",
      "messages": [{"role": "user", "content": "x"}], "guided_grammar": "root ::= \"a\"",
      "tools": [{"type": "function", "function": {"name": "f"}}]})j");
  CHECK(tools.param == "guided_grammar");
  CHECK_THAT(tools.message, Catch::Contains("'guided_grammar' cannot be combined with calling"));
}

}  // namespace
}  // namespace tophat

namespace tophat {
namespace {

TEST_CASE("chat_template_kwargs switches thinking, and earlier answers' reasoning is read back") {
  const OpenAiRequest plain =
      ParseOk(OpenAiEndpoint::kChatCompletions,
              R"({"model": "toy", "messages": [{"role": "user", "content": "hi"}]})");
  CHECK(plain.chat_options.enable_thinking);
  const OpenAiRequest off = ParseOk(OpenAiEndpoint::kChatCompletions, R"({"model": "toy",
      "messages": [{"role": "user", "content": "hi"},
                   {"role": "assistant", "content": "Hello.", "reasoning": "A greeting."},
                   {"role": "assistant", "content": "Bye.", "reasoning_content": "Leaving.",
                    "reasoning": null},
                   {"role": "user", "content": "again"}],
      "chat_template_kwargs": {"enable_thinking": false}})");
  CHECK_FALSE(off.chat_options.enable_thinking);
  CHECK(off.chat_options.reasoning_effort.empty());
  CHECK(ParseOk(OpenAiEndpoint::kChatCompletions,
                R"({"model": "toy", "messages": [{"role": "user", "content": "hi"}],
                    "chat_template_kwargs": {"reasoning_effort": "high"}})")
            .chat_options.reasoning_effort == "high");
  REQUIRE(off.messages.size() == 4);
  CHECK(off.messages[1].reasoning == "A greeting.");
  CHECK(off.messages[2].reasoning == "Leaving.");
  CHECK_FALSE(off.messages[3].reasoning.has_value());

  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"("chat_template_kwargs": {"thinking": true})", "chat_template_kwargs.thinking"},
      {R"("chat_template_kwargs": {"enable_thinking": "no"})",
       "chat_template_kwargs.enable_thinking"},
      {R"("chat_template_kwargs": [])", "chat_template_kwargs"},
      {R"("chat_template_kwargs": {"reasoning_effort": "minimal"})",
       "chat_template_kwargs.reasoning_effort"},
  };
  for (const auto& [field, param] : refused) {
    INFO(field);
    const OpenAiError error = ParseError(
        OpenAiEndpoint::kChatCompletions,
        absl::StrCat(R"({"model": "toy", "messages": [{"role": "user", "content": "hi"}], )", field,
                     "}"));
    CHECK(error.param == param);
  }
  // Reasoning is an assistant's, a string, and said once.
  for (const auto& [message, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"role": "user", "content": "hi", "reasoning": "x"})", "messages[0].reasoning"},
           {R"({"role": "assistant", "content": "a", "reasoning": 5})", "messages[0].reasoning"},
           {R"({"role": "assistant", "content": "a", "reasoning": "x",
                "reasoning_content": "y"})",
            "messages[0].reasoning_content"}}) {
    INFO(message);
    const OpenAiError error =
        ParseError(OpenAiEndpoint::kChatCompletions,
                   absl::StrCat(R"({"model": "toy", "messages": [)", message, "]}"));
    CHECK(error.param == param);
  }
  // Completions have no template.
  CHECK(
      ParseError(
          OpenAiEndpoint::kCompletions,
          R"({"model": "toy", "prompt": "a", "chat_template_kwargs": {"enable_thinking": false}})")
          .param == "chat_template_kwargs");
  const auto tokenize = ParseTokenizeRequest(
      R"({"messages": [{"role": "user", "content": "hi"}],
          "chat_template_kwargs": {"enable_thinking": false}})",
      kModel);
  REQUIRE(std::holds_alternative<TokenizeRequest>(tokenize));
  CHECK_FALSE(std::get<TokenizeRequest>(tokenize).chat_options.enable_thinking);
}

TEST_CASE(
    "thinking_token_budget bounds a chat's reasoning, and is refused where no template "
    "tells where reasoning ends") {
  CHECK(ParseOk(OpenAiEndpoint::kChatCompletions,
                R"({"model": "toy", "messages": [{"role": "user", "content": "hi"}]})")
            .thinking_token_budget == -1);
  for (const int64_t budget : {0, 7, 2147483647}) {
    CHECK(ParseOk(OpenAiEndpoint::kChatCompletions,
                  absl::StrCat(R"({"model": "toy", "messages": [{"role": "user", "content": "hi"}],
                               "thinking_token_budget": )",
                               budget, "}"))
              .thinking_token_budget == budget);
  }
  // null is not given, as for every field (the official client sends nulls it was not given).
  CHECK(ParseOk(OpenAiEndpoint::kChatCompletions,
                R"({"model": "toy", "messages": [{"role": "user", "content": "hi"}],
                    "thinking_token_budget": null})")
            .thinking_token_budget == -1);
  for (const std::string value : {"-1", "1.5", "\"8\"", "2147483648"}) {
    INFO(value);
    const OpenAiError error =
        ParseError(OpenAiEndpoint::kChatCompletions,
                   absl::StrCat(R"({"model": "toy", "messages": [{"role": "user", "content": "hi"}],
                     "thinking_token_budget": )",
                                value, "}"));
    CHECK(error.param == "thinking_token_budget");
    CHECK_THAT(error.message, Catch::Contains("an integer of at least 0"));
  }
  const OpenAiError completions =
      ParseError(OpenAiEndpoint::kCompletions,
                 R"({"model": "toy", "prompt": "a", "thinking_token_budget": 4})");
  CHECK(completions.param == "thinking_token_budget");
  CHECK_THAT(completions.message, Catch::Contains("for chat completions"));
}

TEST_CASE(
    "reasoning_effort is one of OpenAI's efforts, for chat completions, which the endpoint "
    "turns into a budget") {
  const std::string chat = R"({"model": "toy", "messages": [{"role": "user", "content": "hi"}],
                               "reasoning_effort": )";
  CHECK(ParseOk(OpenAiEndpoint::kChatCompletions, chat + "null}").reasoning_effort.empty());
  for (const std::string_view effort : kOpenAiReasoningEfforts) {
    CHECK(ParseOk(OpenAiEndpoint::kChatCompletions,
                  absl::StrCat(chat, "\"", std::string(effort), "\"}"))
              .reasoning_effort == effort);
  }
  for (const std::string value : {"\"max\"", "\"High\"", "3", "{}"}) {
    INFO(value);
    const OpenAiError error = ParseError(OpenAiEndpoint::kChatCompletions, chat + value + "}");
    CHECK(error.param == "reasoning_effort");
    CHECK_THAT(error.message, Catch::Contains("\"none\", \"minimal\", \"low\", \"medium\", "
                                              "\"high\", \"xhigh\""));
  }
  const OpenAiError completions =
      ParseError(OpenAiEndpoint::kCompletions,
                 R"({"model": "toy", "prompt": "a", "reasoning_effort": "low"})");
  CHECK(completions.param == "reasoning_effort");
  CHECK_THAT(completions.message, Catch::Contains("for chat completions"));
}

}  // namespace
}  // namespace tophat
