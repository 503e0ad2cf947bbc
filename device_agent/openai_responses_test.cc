#include "device_agent/openai_responses.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/test_util.h"
#include "device_agent/openai_request.h"

namespace tophat {
namespace {

using Json = nlohmann::ordered_json;
constexpr const char* kModel = "toy";

OpenAiResponsesRequest ParseOk(const std::string& body) {
  auto parsed = ParseResponsesRequest(body, kModel);
  if (auto* error = std::get_if<OpenAiError>(&parsed)) FAIL(error->ToJson().dump());
  return std::get<OpenAiResponsesRequest>(std::move(parsed));
}

OpenAiError ParseError(const std::string& body) {
  auto parsed = ParseResponsesRequest(body, kModel);
  REQUIRE(std::holds_alternative<OpenAiError>(parsed));
  return std::get<OpenAiError>(std::move(parsed));
}

std::vector<std::string> Types(const std::vector<Json>& events) {
  std::vector<std::string> types;
  for (const Json& event : events) types.push_back(event["type"]);
  return types;
}

TEST_CASE("A Responses request is read as the chat completion it asks for") {
  const OpenAiResponsesRequest r = ParseOk(R"({
      "model": "toy", "instructions": "Be brief.", "input": "the cat",
      "max_output_tokens": 7, "temperature": 0, "top_p": 0.5, "stream": true,
      "previous_response_id": "resp_1", "store": false, "metadata": {"run": "a"},
      "text": {"format": {"type": "json_schema", "name": "pet", "strict": true,
                          "schema": {"type": "object", "properties": {"legs": {"type": "integer"}},
                                     "required": ["legs"]}}},
      "include": ["message.output_text.logprobs"], "top_logprobs": 3, "truncation": "disabled",
      "reasoning": {"effort": null}, "prompt_cache_key": "k", "seed": 4, "top_k": 5})");
  REQUIRE(r.chat.messages.size() == 1);  // the instructions are kept apart
  CHECK(r.chat.messages[0].role == "user");
  CHECK(r.chat.messages[0].content == "the cat");
  CHECK(r.instructions == "Be brief.");
  CHECK(r.previous_response_id == "resp_1");
  CHECK_FALSE(r.store);
  CHECK(r.chat.max_tokens == 7);
  CHECK(r.chat.temperature == 0);
  CHECK(r.chat.top_p == 0.5);
  CHECK(r.chat.stream);
  CHECK(r.chat.json_schema.find("legs") != std::string::npos);
  CHECK(r.chat.logprobs == 3);
  CHECK(r.chat.seed == 4u);
  CHECK(r.chat.top_k == 5);
  CHECK(r.echo["metadata"] == Json{{"run", "a"}});
  CHECK(r.echo["text"]["format"]["name"] == "pet");
  CHECK(r.echo["max_output_tokens"] == 7);
  CHECK(r.echo["store"] == false);
  CHECK_FALSE(r.background);
  // The effort is a chat's reasoning_effort, and the response says which was asked for.
  CHECK(r.chat.reasoning_effort.empty());
  CHECK(r.echo["reasoning"] == Json{{"effort", nullptr}, {"summary", nullptr}});
  const OpenAiResponsesRequest effort = ParseOk(
      R"({"model": "toy", "input": "hi", "reasoning": {"effort": "low", "summary": null}})");
  CHECK(effort.chat.reasoning_effort == "low");
  CHECK(effort.echo["reasoning"] == Json{{"effort", "low"}, {"summary", nullptr}});
  CHECK(ResponseBuilder("resp_1", 1, "toy", effort.echo).response()["reasoning"]["effort"] ==
        "low");
  const OpenAiResponsesRequest background =
      ParseOk(R"({"model": "toy", "input": "hi", "background": true})");
  CHECK(background.background);
  CHECK(background.echo["background"] == true);
  // Streamed too: its events are kept, for a stream resumed later.
  const OpenAiResponsesRequest streamed =
      ParseOk(R"({"model": "toy", "input": "hi", "background": true, "stream": true})");
  CHECK(streamed.background);
  CHECK(streamed.chat.stream);
  // Defaults: stored, text, no tools; OpenAI's order of the repeated fields.
  const OpenAiResponsesRequest plain = ParseOk(R"({"model": "toy", "input": "hi"})");
  CHECK(plain.store);
  CHECK(plain.chat.max_tokens == 0);
  CHECK(plain.chat.logprobs == -1);
  CHECK_FALSE(plain.instructions.has_value());
  CHECK(plain.echo.dump() ==
        R"({"background":false,"instructions":null,"max_output_tokens":null,"metadata":{},)"
        R"("parallel_tool_calls":true,"previous_response_id":null,"store":true,)"
        R"("temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto",)"
        R"("tools":[],"top_logprobs":0,"top_p":1.0,"truncation":"disabled","user":null})");
}

TEST_CASE("Responses input items become chat messages, calls joining the answer before them") {
  const OpenAiResponsesRequest r = ParseOk(R"({"model": "toy", "input": [
      {"role": "developer", "content": "rules"},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a "},
                                                      {"type": "input_text", "text": "b"}]},
      {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
       "phase": "final_answer",
       "content": [{"type": "output_text", "text": "let me look", "annotations": [],
                    "logprobs": []}]},
      {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f",
       "arguments": "{\"x\": 1}", "status": "completed"},
      {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "one"},
      {"type": "function_call_output", "call_id": "call_2",
       "output": [{"type": "input_text", "text": "two"}]},
      {"type": "function_call", "call_id": "call_3", "name": "f", "arguments": "{}"}]})");
  const std::vector<ChatMessage>& m = r.chat.messages;
  REQUIRE(m.size() == 6);
  CHECK(m[0].role == "system");
  CHECK(m[1].role == "user");
  CHECK(m[1].content == "a b");
  CHECK(m[2].role == "assistant");
  CHECK(m[2].content == "let me look");
  REQUIRE(m[2].tool_calls.size() == 2);
  CHECK(m[2].tool_calls[0].id == "call_1");
  CHECK(m[2].tool_calls[0].name == "f");
  CHECK(m[2].tool_calls[0].arguments == R"({"x": 1})");
  CHECK(m[2].tool_calls[1].name == "g");
  CHECK(m[3].role == "tool");
  CHECK(m[3].tool_call_id == "call_1");
  CHECK(m[3].content == "one");
  CHECK(m[4].content == "two");
  // A call after a tool's output starts an assistant message of its own.
  CHECK(m[5].role == "assistant");
  CHECK(m[5].content.empty());
  REQUIRE(m[5].tool_calls.size() == 1);
  CHECK(m[5].tool_calls[0].id == "call_3");
}

TEST_CASE("A reasoning item sent back is the reasoning of the assistant turn after it") {
  const OpenAiResponsesRequest r = ParseOk(R"({"model": "toy", "input": [
      {"role": "user", "content": "hi"},
      {"type": "reasoning", "id": "rs_1", "summary": [], "status": "completed",
       "content": [{"type": "reasoning_text", "text": "A greeting."}]},
      {"type": "message", "role": "assistant", "content": "Hello."},
      {"role": "user", "content": "call f"},
      {"type": "reasoning", "id": "rs_2", "summary": [],
       "content": [{"type": "reasoning_text", "text": "Call "},
                   {"type": "reasoning_text", "text": "it."}]},
      {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "done"}]})");
  const std::vector<ChatMessage>& m = r.chat.messages;
  REQUIRE(m.size() == 5);
  CHECK(m[1].reasoning == "A greeting.");
  CHECK(m[1].content == "Hello.");
  CHECK(m[3].reasoning == "Call it.");
  REQUIRE(m[3].tool_calls.size() == 1);
  CHECK_FALSE(m[4].reasoning.has_value());
  CHECK(ParseError(R"({"model": "toy", "input": [{"type": "reasoning", "content": [
                        {"type": "summary_text", "text": "x"}]}]})")
            .param == "input[0].content[0]");
  CHECK(ParseError(R"({"model": "toy", "input": [{"type": "reasoning", "note": 1}]})").param ==
        "input[0].note");
}

TEST_CASE("Responses tools are flat, and become chat's tools in the order written") {
  const OpenAiResponsesRequest r = ParseOk(R"({"model": "toy", "input": "hi",
      "tools": [{"type": "function", "name": "get_weather", "description": "Weather",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                 "strict": true},
                {"type": "function", "name": "now"}],
      "tool_choice": {"type": "function", "name": "now"}, "parallel_tool_calls": false})");
  REQUIRE(r.chat.tools.size() == 2);
  CHECK(r.chat.tools[0].name == "get_weather");
  // As chat's would be: the chat template writes the tool as the app's chat request would.
  CHECK(r.chat.tools[0].json ==
        R"({"type":"function","function":{"name":"get_weather","description":"Weather",)"
        R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}},)"
        R"("strict":true}})");
  CHECK(r.chat.tool_choice == ToolChoice::kFunction);
  CHECK(r.chat.tool_choice_function == "now");
  CHECK_FALSE(r.chat.parallel_tool_calls);
  CHECK(r.echo["tools"][0]["name"] == "get_weather");
  CHECK(r.echo["parallel_tool_calls"] == false);
  CHECK(ParseOk(R"({"model": "toy", "input": "hi", "tools": [{"type": "function", "name": "f"}]})")
            .chat.tool_choice == ToolChoice::kAuto);
}

TEST_CASE("Responses refusals name the Responses API's fields") {
  struct Case {
    std::string body;
    std::string param;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"model": "toy"})", "input", "'input' is required"},
           {R"({"model": "toy", "input": []})", "input", "non-empty array"},
           {R"({"model": "toy", "input": "x", "max_output_tokens": 0})", "max_output_tokens",
            "'max_output_tokens' must be an integer of at least 1"},
           {R"({"model": "toy", "input": [{"role": "user", "content": "a"},
                {"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})",
            "input[1].content[0]", "only text parts"},
           {R"({"model": "toy", "input": [{"role": "tool", "content": "a"}]})", "input[0].role",
            "\"assistant\""},
           {R"({"model": "toy", "input": [{"type": "web_search_call", "id": "ws_1"}]})",
            "input[0].type", "\"web_search_call\" is not supported"},
           {R"({"model": "toy", "input": [{"type": "reasoning", "summary": []}]})", "input",
            "holds no message"},
           {R"({"model": "toy", "input": [{"type": "function_call", "call_id": "c",
                "name": "f", "arguments": "[1]"}]})",
            "input[0].arguments", "a JSON object"},
           {R"({"model": "toy", "input": [{"type": "function_call_output", "output": "x"}]})",
            "input[0].call_id", "the call answered"},
           {R"({"model": "toy", "input": [{"role": "user", "content": "a", "name": "n"}]})",
            "input[0].name", "not supported"},
           {R"({"model": "toy", "input": "x", "text": {"format": {"type": "json_schema",
                "schema": {"type": "object"}}}})",
            "text.format", "'text.format.name' is required"},
           {R"({"model": "toy", "input": "x", "text": {"format": {"type": "json_schema",
                "name": "n", "schema": {"type": "object", "uniqueItems": true}}}})",
            "text.format", "'text.format.schema'"},
           {R"({"model": "toy", "input": "x", "tools": [{"type": "web_search"}]})", "tools[0]",
            "function tools only"},
           {R"({"model": "toy", "input": "x", "tools": [{"type": "function", "name": "a b"}]})",
            "tools[0].name", "tools[0].name must be 1 to 64"},
           {R"({"model": "toy", "input": "x", "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "function", "function": {"name": "f"}}})",
            "tool_choice", "{\"type\": \"function\", \"name\": ...}"},
           {R"({"model": "toy", "input": "x", "truncation": "auto"})", "truncation", "never cut"},
           {R"({"model": "toy", "input": "x", "include": ["file_search_call.results"]})", "include",
            "only \"message.output_text.logprobs\""},
           {R"({"model": "toy", "input": "x", "reasoning": {"effort": "max"}})", "reasoning",
            "'reasoning.effort' must be one of \"none\", \"minimal\""},
           {R"({"model": "toy", "input": "x", "reasoning": {"summary": "auto"}})", "reasoning",
            "'reasoning.summary' must be null: the answer's reasoning comes back whole"},
           {R"({"model": "toy", "input": "x", "reasoning": {"effort": "low", "budget": 4}})",
            "reasoning", "'reasoning' has no key 'budget'"},
           {R"({"model": "toy", "input": "x", "reasoning": "low"})", "reasoning",
            "must be an object"},
           {R"({"model": "toy", "input": "x", "messages": []})", "messages",
            "not supported by /v1/responses"},
           {R"({"model": "toy", "input": "x", "n": 2})", "n", "not supported by /v1/responses"},
           {R"({"model": "toy", "input": "x", "metadata": {"k": 1}})", "metadata",
            "at most 16 strings"},
           {R"({"model": "toy", "input": "x", "previous_response_id": ""})", "previous_response_id",
            "a response's id"},
           {R"({"model": "toy", "input": "x", "background": true, "store": false})", "background",
            "needs 'store' true"},
           {R"({"model": "toy", "input": "x", "background": 1})", "background",
            "must be a boolean"},
           {R"({"model": "toy", "input": "x", "frobnicate": 1})", "frobnicate",
            "Unrecognized request argument supplied: frobnicate"},
       }) {
    INFO(c.body);
    const OpenAiError error = ParseError(c.body);
    CHECK(error.http_status == 400);
    CHECK(error.param == c.param);
    CHECK_THAT(error.message, Catch::Contains(c.message));
    CHECK_THAT(error.message, !Catch::Contains("response_format"));
    CHECK_THAT(error.message, !Catch::Contains("max_completion_tokens"));
  }
  CHECK(ParseError(R"({"model": "gpt-4o", "input": "x"})").http_status == 404);
}

TEST_CASE("Responses carry vLLM's structured outputs to chat, a grammar's refusal named") {
  CHECK(ParseOk(R"j({"model": "toy", "input": "x",
                "structured_outputs": {"grammar": "root ::= \"yes\" | \"no\""}})j")
            .chat.grammar == R"(root ::= "yes" | "no")");
  CHECK(ParseOk(R"j({"model": "toy", "input": "x", "guided_grammar": "root ::= [a-z]+"})j")
            .chat.grammar == "root ::= [a-z]+");
  CHECK(ParseOk(R"j({"model": "toy", "input": "x", "structured_outputs": {"regex": "a+"}})j")
            .chat.regex == "a+");
  const OpenAiError undefined = ParseError(R"j({"model": "toy", "input": "x",
      "structured_outputs": {"grammar": "root ::= item"}})j");
  CHECK(undefined.param == "structured_outputs.grammar");
  CHECK_THAT(undefined.message,
             Catch::Contains("'structured_outputs.grammar': grammar: rule 'item'"));
  const OpenAiError twice = ParseError(R"j({"model": "toy", "input": "x",
      "text": {"format": {"type": "json_object"}}, "guided_grammar": "root ::= \"a\""})j");
  CHECK_THAT(twice.message, Catch::Contains("give the answer's format once: 'text.format'"));
  CHECK_THAT(twice.message, !Catch::Contains("response_format"));
}

TEST_CASE("A streamed response's events fold back into the response it ends with") {
  ResponseBuilder builder("resp_1", 1700000000, "toy",
                          Json{{"instructions", "Be brief."}, {"store", true}});
  std::vector<Json> events = builder.Start();
  CHECK(Types(events) == std::vector<std::string>{"response.created", "response.in_progress"});
  CHECK(events[0]["response"]["status"] == "in_progress");
  CHECK(events[0]["response"]["instructions"] == "Be brief.");
  // The first text opens the message.
  const Json logprob = {{"token", "the"},
                        {"logprob", -0.5},
                        {"bytes", {116, 104, 101}},
                        {"top_logprobs", Json::array()}};
  for (const Json& event : builder.Text("the", Json::array({logprob}))) events.push_back(event);
  CHECK(builder.Text("", Json::array()).empty());
  for (const Json& event : builder.Text(" cat", Json::array())) events.push_back(event);
  const std::vector<ToolCall> calls = {{.name = "f", .arguments = R"({"x":1})"}};
  for (const Json& event :
       builder.Finish(" sat", calls, /*cut_short=*/false, ResponsesUsage(10, 4, 3))) {
    events.push_back(event);
  }
  CHECK(Types(events) ==
        std::vector<std::string>{
            "response.created", "response.in_progress", "response.output_item.added",
            "response.content_part.added", "response.output_text.delta",
            "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
            "response.content_part.done", "response.output_item.done", "response.output_item.added",
            "response.function_call_arguments.delta", "response.function_call_arguments.done",
            "response.output_item.done", "response.completed"});
  for (size_t i = 0; i < events.size(); ++i) CHECK(events[i]["sequence_number"] == i);
  // What a client folds together from the events is the final response.
  std::string text;
  for (const Json& event : events) {
    if (event["type"] == "response.output_text.delta") text += event["delta"];
  }
  const Json& response = builder.response();
  CHECK(text == "the cat sat");
  CHECK(response["status"] == "completed");
  CHECK(response["incomplete_details"].is_null());
  REQUIRE(response["output"].size() == 2);
  const Json& message = response["output"][0];
  CHECK(message["type"] == "message");
  CHECK(message["id"] == events[2]["item"]["id"]);
  CHECK(message["content"][0]["text"] == "the cat sat");
  CHECK(message["content"][0]["logprobs"] == Json::array({logprob}));
  const Json& call = response["output"][1];
  CHECK(call["type"] == "function_call");
  CHECK(call["name"] == "f");
  CHECK(call["arguments"] == R"({"x":1})");
  CHECK(call["status"] == "completed");
  CHECK(call["id"] == events[10]["item"]["id"]);
  CHECK(events[10]["item"]["arguments"] == "");
  CHECK(events[11]["delta"] == R"({"x":1})");
  CHECK(response["usage"]["input_tokens_details"]["cached_tokens"] == 4);
  CHECK(response["usage"]["total_tokens"] == 13);
  CHECK(events.back()["response"] == response);
  // The turn as chat: the text, and the call under the call_id the client sees.
  CHECK(builder.answer().content == "the cat sat");
  REQUIRE(builder.answer().tool_calls.size() == 1);
  CHECK(builder.answer().tool_calls[0].id == call["call_id"]);
}

TEST_CASE("A thinking model's reasoning streams in its own item, done when the text begins") {
  ResponseBuilder builder("resp_r", 1, "toy", Json::object());
  std::vector<Json> events = builder.Start();
  const auto add = [&](std::vector<Json> more) {
    for (Json& event : more) events.push_back(std::move(event));
  };
  add(builder.ReasoningText("Compare "));
  CHECK(builder.ReasoningText("").empty());
  add(builder.ReasoningText("the tenths."));
  add(builder.Text("9.9", Json::array()));
  add(builder.Finish(" is larger.", {}, /*cut_short=*/false, ResponsesUsage(5, 0, 9, 4)));
  CHECK(Types(events) ==
        std::vector<std::string>{
            "response.created", "response.in_progress", "response.output_item.added",
            "response.content_part.added", "response.reasoning_text.delta",
            "response.reasoning_text.delta", "response.reasoning_text.done",
            "response.content_part.done", "response.output_item.done", "response.output_item.added",
            "response.content_part.added", "response.output_text.delta",
            "response.output_text.delta", "response.output_text.done", "response.content_part.done",
            "response.output_item.done", "response.completed"});
  for (size_t i = 0; i < events.size(); ++i) CHECK(events[i]["sequence_number"] == i);
  // The reasoning item's events name it at output 0; the message's at output 1.
  const std::string reasoning_id = events[2]["item"]["id"];
  CHECK(reasoning_id.starts_with("rs_"));
  CHECK(events[2]["item"]["status"] == "in_progress");
  CHECK(events[3]["part"] == Json{{"type", "reasoning_text"}, {"text", ""}});
  std::string reasoning;
  for (const Json& event : events) {
    if (event["type"] == "response.reasoning_text.delta") {
      CHECK(event["item_id"] == reasoning_id);
      CHECK(event["output_index"] == 0);
      reasoning += event["delta"];
    }
  }
  CHECK(reasoning == "Compare the tenths.");
  CHECK(events[6]["text"] == reasoning);
  CHECK(events[8]["item"]["status"] == "completed");
  CHECK(events[9]["output_index"] == 1);
  const Json& output = builder.response()["output"];
  REQUIRE(output.size() == 2);
  CHECK(output[0] == events[8]["item"]);
  CHECK(output[0]["content"] ==
        Json::array({Json{{"type", "reasoning_text"}, {"text", "Compare the tenths."}}}));
  CHECK(output[1]["content"][0]["text"] == "9.9 is larger.");
  CHECK(builder.response()["usage"]["output_tokens_details"]["reasoning_tokens"] == 4);
  CHECK(builder.answer().reasoning == "Compare the tenths.");
  CHECK(builder.answer().content == "9.9 is larger.");

  // Cut while it reasoned: the reasoning item is incomplete, and an empty message follows.
  ResponseBuilder cut("resp_c", 1, "toy", Json::object());
  cut.ReasoningText("Hmm");
  const std::vector<Json> ended = cut.Finish("", {}, /*cut_short=*/true, nullptr);
  CHECK(Types(ended).front() == "response.reasoning_text.done");
  REQUIRE(cut.response()["output"].size() == 2);
  CHECK(cut.response()["output"][0]["status"] == "incomplete");
  CHECK(cut.response()["output"][1]["status"] == "incomplete");
  CHECK(cut.response()["status"] == "incomplete");
  // Whole (an answer not streamed): added and done at once.
  ResponseBuilder whole("resp_w", 1, "toy", Json::object());
  CHECK(Types(whole.Reasoning("Why.")) ==
        std::vector<std::string>{"response.output_item.added", "response.content_part.added",
                                 "response.reasoning_text.delta", "response.reasoning_text.done",
                                 "response.content_part.done", "response.output_item.done"});
  CHECK(whole.answer().reasoning == "Why.");
}

TEST_CASE("A response cut by max_output_tokens is incomplete, and calls alone have no message") {
  ResponseBuilder cut("resp_2", 1, "toy", Json::object());
  const std::vector<Json> events = cut.Finish("abc", {}, /*cut_short=*/true, nullptr);
  CHECK(events.back()["type"] == "response.incomplete");
  CHECK(cut.response()["status"] == "incomplete");
  CHECK(cut.response()["incomplete_details"]["reason"] == "max_output_tokens");
  CHECK(cut.response()["output"][0]["status"] == "incomplete");

  ResponseBuilder calls_only("resp_3", 1, "toy", Json::object());
  const std::vector<ToolCall> calls = {{.name = "f", .arguments = "{}"},
                                       {.name = "g", .arguments = "{}"}};
  calls_only.Finish("", calls, false, nullptr);
  REQUIRE(calls_only.response()["output"].size() == 2);
  CHECK(calls_only.response()["output"][0]["type"] == "function_call");
  CHECK(calls_only.response()["output"][0]["call_id"] !=
        calls_only.response()["output"][1]["call_id"]);

  // An empty answer is an empty message, so that output_text is "".
  ResponseBuilder empty("resp_4", 1, "toy", Json::object());
  empty.Finish("", {}, false, nullptr);
  REQUIRE(empty.response()["output"].size() == 1);
  CHECK(empty.response()["output"][0]["content"][0]["text"] == "");

  ResponseBuilder failed("resp_5", 1, "toy", Json::object());
  CHECK(failed.Fail("the cloud went away")[0]["type"] == "response.failed");
  CHECK(failed.response()["error"]["message"] == "the cloud went away");
}

TEST_CASE("A background response cancelled keeps its answer so far, a failed one its error") {
  ResponseBuilder cut("resp_5", 1, "toy", Json{{"background", true}});
  cut.Finish("the c", {}, /*cut_short=*/true, Json{{"output_tokens", 2}});
  cut.Cancel();
  CHECK(cut.response()["status"] == "cancelled");
  CHECK(cut.response()["incomplete_details"] == nullptr);
  CHECK(cut.response()["output"][0]["content"][0]["text"] == "the c");
  CHECK(cut.response()["usage"]["output_tokens"] == 2);
  CHECK(cut.response()["background"] == true);
  // Cancelled before any answer: no output.
  ResponseBuilder early("resp_6", 1, "toy", Json::object());
  early.Cancel();
  CHECK(early.response()["status"] == "cancelled");
  CHECK(early.response()["output"].empty());

  ResponseBuilder failed("resp_7", 1, "toy", Json::object());
  failed.Fail("this agent already runs 2 completions", "rate_limit_exceeded");
  CHECK(failed.response()["status"] == "failed");
  CHECK(failed.response()["error"]["code"] == "rate_limit_exceeded");
  CHECK(failed.response()["error"]["message"] == "this agent already runs 2 completions");
}

TEST_CASE("A kept response's input items are its conversation before the answer, paged") {
  const std::vector<ChatMessage> conversation = {
      {.role = "system", .content = "Be brief."},
      {.role = "user", .content = "Hi"},
      {.role = "assistant", .content = "Hello."},
      {.role = "user", .content = "Weather in Oslo?"},
      {.role = "assistant",
       .tool_calls = {{.id = "call_1", .name = "get_weather", .arguments = R"({"city":"Oslo"})"}}},
      {.role = "tool", .content = "4 C", .tool_call_id = "call_1"},
      {.role = "assistant", .content = "It is 4 C."},  // the answer: not an input
  };
  const auto all = InputItemsPage("resp_abc", conversation, {.limit = 100, .ascending = true});
  REQUIRE(all.has_value());
  const Json& items = (*all)["data"];
  REQUIRE(items.size() == 6);
  CHECK(items[0]["role"] == "system");
  CHECK(items[0]["content"][0] == Json{{"type", "input_text"}, {"text", "Be brief."}});
  CHECK(items[1]["content"][0]["text"] == "Hi");
  CHECK(items[2]["role"] == "assistant");
  CHECK(items[2]["content"][0]["type"] == "output_text");
  CHECK(items[2]["content"][0]["text"] == "Hello.");
  CHECK(items[3]["content"][0]["text"] == "Weather in Oslo?");
  CHECK(items[4]["type"] == "function_call");
  CHECK(items[4]["call_id"] == "call_1");
  CHECK(items[4]["name"] == "get_weather");
  CHECK(items[4]["arguments"] == R"({"city":"Oslo"})");
  CHECK(items[5]["type"] == "function_call_output");
  CHECK(items[5]["call_id"] == "call_1");
  CHECK(items[5]["output"] == "4 C");
  CHECK((*all)["first_id"] == items[0]["id"]);
  CHECK((*all)["last_id"] == items[5]["id"]);
  CHECK((*all)["has_more"] == false);
  std::set<std::string> ids;
  for (const Json& item : items) ids.insert(item["id"].get<std::string>());
  CHECK(ids.size() == 6);
  // The same ids on every call, so that `after` pages through them.
  CHECK(InputItemsPage("resp_abc", conversation, {.limit = 100, .ascending = true}) == all);
  // Newest first by default, in pages.
  const auto first = InputItemsPage("resp_abc", conversation, {.limit = 4});
  REQUIRE(first.has_value());
  REQUIRE((*first)["data"].size() == 4);
  CHECK((*first)["data"][0] == items[5]);
  CHECK((*first)["data"][3] == items[2]);
  CHECK((*first)["has_more"] == true);
  const auto second = InputItemsPage("resp_abc", conversation,
                                     {.limit = 4, .after = (*first)["last_id"].get<std::string>()});
  REQUIRE(second.has_value());
  REQUIRE((*second)["data"].size() == 2);
  CHECK((*second)["data"][0] == items[1]);
  CHECK((*second)["data"][1] == items[0]);
  CHECK((*second)["has_more"] == false);
  // An id of no item of this response; another response's ids are its own.
  CHECK_FALSE(InputItemsPage("resp_abc", conversation, {.after = "msg_nope"}).has_value());
  const auto other = InputItemsPage("resp_def", conversation, {.limit = 1});
  CHECK((*other)["first_id"] != (*first)["first_id"]);
  // A first turn's answer has no input items before it but its own input.
  const auto empty = InputItemsPage("resp_abc", {}, {});
  CHECK((*empty)["data"].empty());
  CHECK((*empty)["first_id"].is_null());
}

TEST_CASE("The response store keeps each app's responses apart, within its bytes") {
  const auto stored = [](std::string text) {
    return ResponseStore::Stored{.conversation = {{.role = "user", .content = std::move(text)}},
                                 .response = Json{{"id", "x"}}};
  };
  ResponseStore store(/*max_bytes=*/3000);
  store.Put("resp_a", "app1", stored("a"));
  REQUIRE(store.Find("resp_a", "app1").has_value());
  CHECK(store.Find("resp_a", "app1")->conversation[0].content == "a");
  CHECK_FALSE(store.Find("resp_a", "app2").has_value());  // another app's
  CHECK_FALSE(store.Delete("resp_a", "app2"));
  CHECK(store.Find("resp_a", "app1").has_value());
  // Past its bytes the least recently used goes: resp_a was used last, so resp_b goes.
  store.Put("resp_b", "app1", stored(std::string(1500, 'b')));
  CHECK(store.Find("resp_a", "app1").has_value());
  store.Put("resp_c", "app1", stored(std::string(1500, 'c')));
  CHECK(store.size() == 2);
  CHECK_FALSE(store.Find("resp_b", "app1").has_value());
  CHECK(store.Find("resp_c", "app1").has_value());
  CHECK(store.bytes() <= 3000);
  CHECK(store.forgotten() == 1);
  // One larger than the whole store is not kept, and takes nothing with it.
  store.Put("resp_d", "app1", stored(std::string(5000, 'd')));
  CHECK_FALSE(store.Find("resp_d", "app1").has_value());
  CHECK(store.size() == 2);
  CHECK(store.forgotten() == 2);
  CHECK(store.Delete("resp_c", "app1"));
  CHECK_FALSE(store.Find("resp_c", "app1").has_value());
  CHECK(store.size() == 1);
  CHECK(store.forgotten() == 2);  // a deletion is not forgetting
  ResponseStore none(0);
  none.Put("resp_a", "", stored("a"));
  CHECK(none.size() == 0);
}

TEST_CASE("A background stream's event log is followed as it grows and resumed after a number") {
  ResponseBuilder builder("resp_1", 1700000000, "toy", Json{{"background", true}});
  ResponseEventLog log;
  CHECK(log.From(0, std::chrono::milliseconds(0)).events.empty());
  CHECK_FALSE(log.From(0, std::chrono::milliseconds(0)).ended);
  log.Append(builder.Start());
  log.Append(builder.Text("the", Json::array()));
  // response.created 0, response.in_progress 1, the message's item 2, its part 3, "the" 4.
  ResponseEventLog::Read read = log.From(0, std::chrono::milliseconds(0));
  REQUIRE(read.events.size() == 5);
  CHECK_FALSE(read.ended);
  CHECK(log.IndexAfter(-1) == 0);
  CHECK(log.IndexAfter(2) == 3);
  CHECK(log.IndexAfter(4) == 5);  // none yet: the next to come
  CHECK(log.IndexAfter(99) == 5);
  CHECK(Types(log.From(log.IndexAfter(3), std::chrono::milliseconds(0)).events) ==
        std::vector<std::string>{"response.output_text.delta"});
  // A follower waiting past the end wakes for the next events, and for the close.
  std::thread generation([&] {
    log.Append(builder.Text(" cat", Json::array()));
    log.Append(builder.Finish("", {}, /*cut_short=*/false, ResponsesUsage(3, 0, 2)));
    log.Close();
  });
  std::string text = "the";
  size_t next = 5;
  bool ended = false;
  while (!ended) {
    read = log.From(next, std::chrono::seconds(10));
    for (const Json& event : read.events) {
      if (event["type"] == "response.output_text.delta") text += event["delta"];
    }
    next += read.events.size();
    ended = read.ended;
  }
  generation.join();
  CHECK(text == "the cat");
  CHECK(log.From(0, std::chrono::milliseconds(0)).events.back()["type"] == "response.completed");
  CHECK(log.From(next, std::chrono::milliseconds(0)).ended);
  CHECK(log.From(next, std::chrono::milliseconds(0)).events.empty());
  CHECK(log.bytes() > static_cast<int64_t>(builder.response().dump().size()));
  // Its bytes count against the response store's bound.
  auto shared = std::make_shared<ResponseEventLog>();
  shared->Append({Json{{"sequence_number", 0}, {"delta", std::string(3000, 'x')}}});
  ResponseStore store(/*max_bytes=*/2000);
  store.Put("resp_1", "", {.response = Json{{"id", "resp_1"}}, .events = shared});
  CHECK(store.size() == 0);
  CHECK(store.forgotten() == 1);
}

KeptFiles OpenKept(const std::filesystem::path& dir) {
  absl::StatusOr<KeptFiles> files = KeptFiles::Open(dir);
  REQUIRE(files.ok());
  return *std::move(files);
}

TEST_CASE("Kept responses outlive the store in their files: conversation, calls and events") {
  testing::TempDir temp;
  ResponseBuilder builder("resp_done", 1700000000, "toy", Json{{"background", true}});
  auto log = std::make_shared<ResponseEventLog>();
  log->Append(builder.Start());
  log->Append(builder.Text("the cat", Json::array()));
  const std::vector<ToolCall> calls = {{.name = "weather", .arguments = R"({"city":"Oslo"})"}};
  log->Append(builder.Finish("", calls, /*cut_short=*/false, ResponsesUsage(3, 1, 2)));
  log->Close();
  const std::vector<ChatMessage> conversation = {
      {.role = "user", .content = "the old farmer"},
      builder.answer(),
      {.role = "tool", .content = "{\"sky\": \"grey\"}", .tool_call_id = "call_1"}};
  {
    ResponseStore store(/*max_bytes=*/1 << 20);
    CHECK(store.KeepIn(OpenKept(temp.path())).kept == 0);
    store.Put("resp_done", "app1",
              {.conversation = conversation, .response = builder.response(), .events = log});
    store.Put("resp_gone", "app1", {.response = Json{{"id", "resp_gone"}}});
    CHECK(store.Delete("resp_gone", "app1"));
    CHECK(store.file_errors() == 0);
  }
  CHECK_FALSE(std::filesystem::exists(temp.path() / "resp_gone.json"));
  ResponseStore next(/*max_bytes=*/1 << 20);
  const RestoredObjects restored = next.KeepIn(OpenKept(temp.path()));
  CHECK(restored.kept == 1);
  CHECK(restored.set_aside.empty());
  CHECK_FALSE(next.Find("resp_done", "app2").has_value());  // still the app's own
  std::optional<ResponseStore::Stored> found = next.Find("resp_done", "app1");
  REQUIRE(found.has_value());
  CHECK(found->response == builder.response());
  CHECK(found->response["status"] == "completed");
  REQUIRE(found->conversation.size() == 3);
  CHECK(found->conversation[0].role == "user");
  CHECK(found->conversation[0].content == "the old farmer");
  REQUIRE(found->conversation[1].tool_calls.size() == 1);
  CHECK(found->conversation[1].tool_calls[0].name == "weather");
  CHECK(found->conversation[1].tool_calls[0].id == builder.answer().tool_calls[0].id);
  CHECK(found->conversation[1].tool_calls[0].arguments == R"({"city":"Oslo"})");
  CHECK(found->conversation[2].tool_call_id == "call_1");
  REQUIRE(found->events != nullptr);
  const ResponseEventLog::Read events = found->events->From(0, std::chrono::milliseconds(0));
  CHECK(events.ended);
  CHECK(events.events == log->From(0, std::chrono::milliseconds(0)).events);
  CHECK(next.bytes() > 0);
}

TEST_CASE("A kept response its process left generating comes back failed") {
  testing::TempDir temp;
  ResponseBuilder builder("resp_cut", 1700000000, "toy", Json{{"background", true}});
  auto log = std::make_shared<ResponseEventLog>();
  log->Append(builder.Start());
  log->Append(builder.Text("the", Json::array()));
  {
    ResponseStore store(/*max_bytes=*/1 << 20);
    store.KeepIn(OpenKept(temp.path()));
    // As a background response is kept when it starts; the process then ends without a stop.
    store.Put("resp_cut", "", {.response = builder.response(), .events = log});
    store.Put("resp_plain", "", {.response = Json{{"id", "resp_plain"}, {"status", "queued"}}});
  }
  ResponseStore next(/*max_bytes=*/1 << 20);
  CHECK(next.KeepIn(OpenKept(temp.path())).kept == 2);
  for (const char* id : {"resp_cut", "resp_plain"}) {
    std::optional<ResponseStore::Stored> found = next.Find(id, "");
    REQUIRE(found.has_value());
    CHECK(found->response["status"] == "failed");
    CHECK(found->response["error"]["code"] == "server_error");
    CHECK_THAT(found->response["error"]["message"].get<std::string>(),
               Catch::Contains("the agent stopped before this response finished"));
  }
  // A stream resumed from its events ends with the failure, numbered after the last.
  const ResponseEventLog::Read events =
      next.Find("resp_cut", "")->events->From(0, std::chrono::milliseconds(0));
  CHECK(events.ended);
  REQUIRE(events.events.size() == 6);
  CHECK(events.events[5]["type"] == "response.failed");
  CHECK(events.events[5]["sequence_number"] == 5);
  CHECK(events.events[5]["response"]["status"] == "failed");
}

TEST_CASE(
    "Kept responses' files follow the bound: forgotten ones go, a lower bound keeps the "
    "newest") {
  testing::TempDir temp;
  const auto stored = [](char c) {
    return ResponseStore::Stored{
        .conversation = {{.role = "user", .content = std::string(1000, c)}},
        .response = Json{{"id", std::string(1, c)}, {"status", "completed"}}};
  };
  {
    ResponseStore store(/*max_bytes=*/5000);
    store.KeepIn(OpenKept(temp.path()));
    for (char c : {'a', 'b', 'c', 'd', 'e'}) {
      store.Put(std::string("resp_") + c, "", stored(c));
      // Written in this order, whatever the clock's resolution.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    CHECK(store.forgotten() >= 1);
    CHECK_FALSE(std::filesystem::exists(temp.path() / "resp_a.json"));
    CHECK(std::filesystem::exists(temp.path() / "resp_e.json"));
    CHECK(store.size() < 5);
  }
  // A later process with a lower bound takes back the most recently written, and removes the
  // files of those it cannot hold.
  // Each kept response takes a little over 1,000 bytes (its message's text and the
  // structures around it, BytesOf): 2,800 hold two, not three; 1,500 one.
  ResponseStore next(/*max_bytes=*/2800);
  CHECK(next.KeepIn(OpenKept(temp.path())).kept == 2);
  CHECK(next.Find("resp_e", "").has_value());
  CHECK(next.Find("resp_d", "").has_value());
  CHECK_FALSE(next.Find("resp_c", "").has_value());
  CHECK_FALSE(std::filesystem::exists(temp.path() / "resp_c.json"));
  CHECK_FALSE(std::filesystem::exists(temp.path() / "resp_b.json"));
  // A file it cannot read as a response is set aside, and named.
  testing::WriteBytes(temp.path() / "resp_odd.json",
                      R"({"format": "tophat-kept-object/1", "id": "resp_odd", "app": "",
                          "value": {"conversation": [{"role": "user"}], "response": {}}})");
  ResponseStore third(/*max_bytes=*/2800);
  const RestoredObjects restored = third.KeepIn(OpenKept(temp.path()));
  REQUIRE(restored.set_aside.size() == 1);
  // Reading a response counts as using it: the next process ranks it by that use.
  // (Past a coarse file clock's tick: 4 ms at 250 Hz, 10 ms at 100 Hz.)
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(third.Find("resp_d", "").has_value());
  ResponseStore fourth(/*max_bytes=*/1500);
  CHECK(fourth.KeepIn(OpenKept(temp.path())).kept == 1);
  CHECK(fourth.Find("resp_d", "").has_value());
  CHECK_FALSE(fourth.Find("resp_e", "").has_value());
  CHECK_THAT(restored.set_aside[0],
             Catch::Contains("resp_odd.json: conversation[0] is not a message (moved to"));
  CHECK(restored.kept == 2);
}

}  // namespace
}  // namespace tophat
