// What an app sends the agent's OpenAI endpoint: any bytes as the body of
// POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/conversations (create,
// metadata, items), /tokenize or /detokenize (the
// first byte chooses), parsed as the endpoint parses it (device_agent/openai_request.h). A refusal
// must be a 400 or 404 whose error object serialises (it is what the client gets); a
// completion that parses has its checked limits, and its stop sequences are run over its own text,
// cut where the input's bytes say, through StopSequenceFilter: what comes out is exactly the text
// before the first one (all of it when there is none), or through its end with
// include_stop_str_in_output. A chat's tools and messages are rendered by each template with a tool
// layout (or refused with a status); under a tool_choice its text is read for calls, each of which
// names a tool and satisfies its parameters, and streamed through ToolCallHoldback in the same
// pieces, which sends a prefix of the text and holds back the rest. A structured output's grammar
// (GBNF) compiles, as its regex does, while the request is read; the request's own text is
// then matched against it a byte at a time.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "device_agent/openai_conversations.h"
#include "device_agent/openai_request.h"
#include "device_agent/openai_responses.h"
#include "fuzz/fuzz_util.h"
#include "models/grammar/ebnf_grammar.h"
#include "models/tokenizers/chat_template.h"
#include "models/tokenizers/tokenizer_utf8.h"
#include "nlohmann/json.hpp"

namespace {

// What a refusal must be: a 400 or 404 whose error object serialises.
void CheckRefusal(const tophat::OpenAiError& error) {
  TOPHAT_FUZZ_CHECK(error.http_status == 400 || error.http_status == 404);
  TOPHAT_FUZZ_CHECK(!error.message.empty());
  (void)error.ToJson().dump();  // throws on text that is not UTF-8
}

// POST /tokenize and /detokenize: a refusal, or a request with its input.
void CheckTokenizerRoutes(bool tokenize, std::string_view body) {
  if (tokenize) {
    auto parsed = tophat::ParseTokenizeRequest(body, "toy");
    if (const auto* error = std::get_if<tophat::OpenAiError>(&parsed)) return CheckRefusal(*error);
    const auto& request = std::get<tophat::TokenizeRequest>(parsed);
    for (const tophat::ChatMessage& message : request.messages) {
      TOPHAT_FUZZ_CHECK(!message.role.empty());
    }
    return;
  }
  auto parsed = tophat::ParseDetokenizeRequest(body, "toy");
  if (const auto* error = std::get_if<tophat::OpenAiError>(&parsed)) return CheckRefusal(*error);
  for (const int64_t id : std::get<tophat::DetokenizeRequest>(parsed).tokens) {
    TOPHAT_FUZZ_CHECK(id >= 0);
  }
}

// Templates with a tool layout, by the markup they are recognised by.
const std::vector<tophat::ChatTemplate>& ToolTemplates() {
  static const auto* templates = [] {
    auto* out = new std::vector<tophat::ChatTemplate>();
    for (const std::string& source :
         {std::string(tophat::kToyChatTemplateSource),
          std::string("<|start_header_id|><|end_header_id|><|eot_id|> Cutting Knowledge Date "
                      "Given the following functions, please respond"),
          std::string("<|im_start|>system\nYou are Qwen.<|im_end|> You may call one or more "
                      "functions to assist with the user query.")}) {
      auto made = tophat::ChatTemplate::FromSource(source, "fuzz");
      TOPHAT_FUZZ_CHECK(made.ok() && made->tool_call_syntax().has_value());
      out->push_back(*std::move(made));
    }
    return out;
  }();
  return *templates;
}

// Templates that think (Qwen3's switch, QwQ's and DeepSeek-R1's opened block), by their
// markup: each renders a chat's messages, reasoning and all, or refuses them.
const std::vector<tophat::ChatTemplate>& ThinkingTemplates() {
  static const auto* templates = [] {
    auto* out = new std::vector<tophat::ChatTemplate>();
    for (const char* source :
         {"<|im_start|><|im_end|><think></think> enable_thinking You may call one or more "
          "functions to assist with the user query.",
          "<|im_start|><|im_end|></think> '<|im_start|>assistant\\n<think>\\n'",
          "'<｜User｜>' '</think>' '<｜Assistant｜><think>\\n'"}) {
      auto made = tophat::ChatTemplate::FromSource(source, "fuzz");
      TOPHAT_FUZZ_CHECK(made.ok() && made->thinking() != tophat::ThinkingStyle::kNone);
      out->push_back(*std::move(made));
    }
    return out;
  }();
  return *templates;
}

// gpt-oss's harmony template, by its markup.
const tophat::ChatTemplate& HarmonyTemplate() {
  static const auto* harmony = [] {
    auto made = tophat::ChatTemplate::FromSource("<|start|><|channel|><|message|>", "fuzz");
    TOPHAT_FUZZ_CHECK(made.ok() && made->family() == tophat::ChatFamily::kHarmony);
    return new tophat::ChatTemplate(*std::move(made));
  }();
  return *harmony;
}

// A chat rendered by gpt-oss's template (its tools as TypeScript), and `text` read as a
// harmony answer: bytes below 7 are its control tokens, the others text; the calls read out
// name only the request's tools.
void CheckHarmony(const tophat::OpenAiRequest& request, std::span<const std::string> tools,
                  const std::string& text) {
  (void)HarmonyTemplate().Render(request.messages, tools,
                                 {.reasoning_effort = "high", .date = "2026-01-01"});
  tophat::HarmonyReader reader(
      {.start = 0, .channel = 1, .message = 2, .end = 3, .ret = 4, .call = 5, .constrain = 6});
  size_t out = 0;
  size_t messages = 0;
  for (const char byte : text) {
    const auto id = static_cast<uint8_t>(byte);
    const tophat::HarmonyReader::Parts parts =
        id < 7 ? reader.Push(id, "") : reader.Push(100, std::string_view(&byte, 1));
    out += parts.reasoning.size() + parts.content.size();
    messages += id == 2;
  }
  const tophat::HarmonyReader::Parts rest = reader.Flush();
  out += rest.reasoning.size() + rest.content.size();
  for (const tophat::HarmonyCall& call : reader.calls()) out += call.body.size();
  // Nothing is made up: the text, and a blank line between messages of reasoning.
  TOPHAT_FUZZ_CHECK(out <= text.size() + 2 * messages);
  if (request.tool_choice == tophat::ToolChoice::kNone) return;
  auto calls = tophat::ToolCallReader::Create(request, tophat::ToolCallSyntax{});
  TOPHAT_FUZZ_CHECK(calls.ok());
  for (const tophat::ToolCall& call : tophat::ReadHarmonyCalls(reader.calls(), &*calls).calls) {
    TOPHAT_FUZZ_CHECK(std::any_of(request.tools.begin(), request.tools.end(),
                                  [&](const auto& tool) { return tool.name == call.name; }));
  }
}

// A chat's tools: rendered (or refused), and its text read for calls and streamed.
void CheckTools(const tophat::OpenAiRequest& request, const std::string& text,
                const uint8_t* data, size_t size) {
  std::vector<std::string> tools;
  for (const tophat::OpenAiTool& tool : request.tools) tools.push_back(tool.json);
  CheckHarmony(request, tools, text);
  for (const tophat::ChatTemplate& chat : ThinkingTemplates()) {
    for (const bool enable_thinking : {true, false}) {
      (void)chat.Render(request.messages, tools, {.enable_thinking = enable_thinking});
    }
  }
  for (const tophat::ChatTemplate& chat : ToolTemplates()) {
    (void)chat.Render(request.messages, tools);  // a status, never a crash
    if (request.tool_choice == tophat::ToolChoice::kNone) continue;
    const tophat::ToolCallSyntax syntax = *chat.tool_call_syntax();
    auto reader = tophat::ToolCallReader::Create(request, syntax);
    TOPHAT_FUZZ_CHECK(reader.ok());  // the request's parameters compiled when it was read
    const tophat::ToolCallReading reading = reader->Read(text);
    for (const tophat::ToolCall& call : reading.calls) {
      TOPHAT_FUZZ_CHECK(std::any_of(request.tools.begin(), request.tools.end(),
                                    [&](const auto& tool) { return tool.name == call.name; }));
      TOPHAT_FUZZ_CHECK(nlohmann::json::parse(call.arguments, nullptr, false).is_object());
    }
    TOPHAT_FUZZ_CHECK(!reading.calls.empty() || reading.content == text);
    tophat::ToolCallHoldback holdback(syntax, /*hold_all=*/(data[0] & 4) != 0);
    std::string sent;
    for (size_t at = 0, i = 0; at < text.size(); ++i) {
      const size_t piece = 1 + (data[i % size] & 7);
      sent += holdback.Push(std::string_view(text).substr(at, piece));
      at += piece;
    }
    TOPHAT_FUZZ_CHECK(holdback.text() == text);
    TOPHAT_FUZZ_CHECK(sent + std::string(holdback.held()) == text);
  }
}

}  // namespace

// POST /v1/responses: a refusal, or the chat completion it asks for, whose answer (the
// input's own text, and calls of its tools) makes a response object that serialises and
// holds that text, with events numbered in order.
void CheckResponses(std::string_view body) {
  auto parsed = tophat::ParseResponsesRequest(body, "toy");
  if (const auto* error = std::get_if<tophat::OpenAiError>(&parsed)) return CheckRefusal(*error);
  const tophat::OpenAiResponsesRequest& request = std::get<tophat::OpenAiResponsesRequest>(parsed);
  TOPHAT_FUZZ_CHECK(request.chat.model == "toy");
  TOPHAT_FUZZ_CHECK(request.chat.n == 1 && request.chat.prompts.empty());
  TOPHAT_FUZZ_CHECK(!request.chat.messages.empty());
  TOPHAT_FUZZ_CHECK(request.chat.max_tokens >= 0);
  // A background response is kept to be fetched (or its stream resumed).
  TOPHAT_FUZZ_CHECK(!request.background || request.store);
  TOPHAT_FUZZ_CHECK(request.echo["background"] == request.background);
  std::string text;
  std::vector<tophat::ToolCall> calls;
  for (const tophat::ChatMessage& message : request.chat.messages) {
    TOPHAT_FUZZ_CHECK(message.role == "system" || message.role == "user" ||
                      message.role == "assistant" || message.role == "tool");
    TOPHAT_FUZZ_CHECK(message.role == "tool" || message.tool_call_id.empty());
    TOPHAT_FUZZ_CHECK(message.role == "assistant" || message.tool_calls.empty());
    text += message.content;
    calls.insert(calls.end(), message.tool_calls.begin(), message.tool_calls.end());
  }
  tophat::ResponseBuilder builder("resp_fuzz", 0, "toy", request.echo);
  std::vector<nlohmann::ordered_json> events = builder.Start();
  // The text's first half as a thinking model's reasoning, streamed in two pieces (cut
  // between characters, as the detokenizer sends text).
  const auto boundary = [](std::string_view in, size_t at) {
    return at - tophat::utf8::IncompleteSuffixLength(in.substr(0, at));
  };
  const std::string whole = std::move(text);
  const std::string_view reasoning =
      std::string_view(whole).substr(0, boundary(whole, whole.size() / 2));
  const size_t half = boundary(reasoning, reasoning.size() / 2);
  for (const std::string_view piece : {reasoning.substr(0, half), reasoning.substr(half)}) {
    for (auto& event : builder.ReasoningText(piece)) events.push_back(event);
  }
  text = whole.substr(reasoning.size());
  for (auto& event : builder.Text(text, nlohmann::ordered_json::array())) events.push_back(event);
  for (auto& event : builder.Finish("", calls, request.chat.max_tokens == 1,
                                    tophat::ResponsesUsage(1, 0, 1))) {
    events.push_back(event);
  }
  for (size_t i = 0; i < events.size(); ++i) {
    TOPHAT_FUZZ_CHECK(events[i]["sequence_number"] == i);
    (void)events[i].dump();  // throws on text that is not UTF-8
  }
  TOPHAT_FUZZ_CHECK(builder.answer().content == text);
  TOPHAT_FUZZ_CHECK(builder.answer().reasoning.value_or("") == reasoning);
  TOPHAT_FUZZ_CHECK(builder.answer().tool_calls.size() == calls.size());
}

// POST /v1/conversations (create), /v1/conversations/{id} (metadata) and .../items (add):
// a refusal, or at most 20 stored items, each with its id, which read back as chat messages.
static void CheckConversations(int route, std::string_view body) {
  std::vector<nlohmann::ordered_json> items;
  if (route == 0) {
    auto parsed = tophat::ParseConversationCreate(body);
    if (const auto* error = std::get_if<tophat::OpenAiError>(&parsed)) return CheckRefusal(*error);
    const auto& given = std::get<tophat::ConversationCreateRequest>(parsed);
    TOPHAT_FUZZ_CHECK(given.metadata.is_object() && given.metadata.size() <= 16);
    items = given.items;
  } else if (route == 1) {
    auto parsed = tophat::ParseConversationUpdate(body);
    if (const auto* error = std::get_if<tophat::OpenAiError>(&parsed)) return CheckRefusal(*error);
    const auto& metadata = std::get<nlohmann::ordered_json>(parsed);
    TOPHAT_FUZZ_CHECK(metadata.is_object() && metadata.size() <= 16);
    return;
  } else {
    auto parsed = tophat::ParseConversationItemsAdd(body);
    if (const auto* error = std::get_if<tophat::OpenAiError>(&parsed)) return CheckRefusal(*error);
    items = std::get<std::vector<nlohmann::ordered_json>>(parsed);
    TOPHAT_FUZZ_CHECK(!items.empty());
  }
  // No more than were given (an empty answer before its calls is no item of its own).
  TOPHAT_FUZZ_CHECK(items.size() <= tophat::kMaxConversationItemsAdded);
  for (const auto& item : items) {
    TOPHAT_FUZZ_CHECK(item.contains("id") && item["id"].is_string());
    TOPHAT_FUZZ_CHECK(item["status"] == "completed");
  }
  (void)nlohmann::ordered_json(items).dump();  // kept and sent as JSON: valid UTF-8
  TOPHAT_FUZZ_CHECK(tophat::ConversationItemsAsChat(items).size() <= items.size());
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte chooses the route: 0 chat (with bit 3 set: /v1/responses), 1 completions
  // (with bit 3 set: the conversations routes, bits 4-5 which), 2 /tokenize, 3 /detokenize.
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((data[0] & 3) >= 2) {
    CheckTokenizerRoutes((data[0] & 3) == 2, body);
    return 0;
  }
  if ((data[0] & 3) == 1 && (data[0] & 8) != 0) {
    CheckConversations((data[0] >> 4) % 3, body);
    return 0;
  }
  if ((data[0] & 3) == 0 && (data[0] & 8) != 0) {
    CheckResponses(body);
    return 0;
  }
  const auto endpoint = (data[0] & 1) != 0 ? tophat::OpenAiEndpoint::kCompletions
                                           : tophat::OpenAiEndpoint::kChatCompletions;
  auto parsed = tophat::ParseOpenAiRequest(endpoint, body, "toy");
  if (const auto* error = std::get_if<tophat::OpenAiError>(&parsed)) {
    CheckRefusal(*error);
    return 0;
  }
  const tophat::OpenAiRequest& request = std::get<tophat::OpenAiRequest>(parsed);
  TOPHAT_FUZZ_CHECK(request.model == "toy");
  TOPHAT_FUZZ_CHECK(request.stop.size() <= 4);
  TOPHAT_FUZZ_CHECK(request.logprobs >= -1 && request.logprobs <= tophat::kMaxOpenAiLogprobs);
  TOPHAT_FUZZ_CHECK(request.temperature >= 0 && request.temperature <= 2);
  TOPHAT_FUZZ_CHECK(request.top_p > 0 && request.top_p <= 1);
  TOPHAT_FUZZ_CHECK(request.max_tokens >= 0);
  TOPHAT_FUZZ_CHECK(request.presence_penalty >= -2 && request.presence_penalty <= 2);
  TOPHAT_FUZZ_CHECK(request.frequency_penalty >= -2 && request.frequency_penalty <= 2);
  TOPHAT_FUZZ_CHECK(request.repetition_penalty > 0 && request.repetition_penalty <= 100);
  TOPHAT_FUZZ_CHECK(request.top_k >= 0);
  TOPHAT_FUZZ_CHECK(request.min_p >= 0 && request.min_p <= 1);
  TOPHAT_FUZZ_CHECK(request.min_tokens >= 0);
  TOPHAT_FUZZ_CHECK(request.max_tokens == 0 || request.min_tokens <= request.max_tokens);
  TOPHAT_FUZZ_CHECK(request.stop_token_ids.size() <= tophat::kMaxOpenAiStopIds);
  TOPHAT_FUZZ_CHECK(request.n >= 1 && request.n <= tophat::kMaxOpenAiChoices);
  TOPHAT_FUZZ_CHECK(request.n == 1 || request.outline_max_points == 0);
  TOPHAT_FUZZ_CHECK(request.choices() <= tophat::kMaxOpenAiBatch);
  // Completions have their prompts, chat its messages.
  TOPHAT_FUZZ_CHECK(request.prompts.empty() ==
                    (request.endpoint == tophat::OpenAiEndpoint::kChatCompletions));
  TOPHAT_FUZZ_CHECK(request.prompts.size() <= 1 || request.outline_max_points == 0);
  TOPHAT_FUZZ_CHECK(!request.include_usage || request.stream);
  TOPHAT_FUZZ_CHECK(request.logprobs < 0 || request.outline_max_points == 0);
  TOPHAT_FUZZ_CHECK(!request.prompt_only || request.echo);
  TOPHAT_FUZZ_CHECK(!request.echo || request.endpoint == tophat::OpenAiEndpoint::kCompletions);

  std::string text;
  for (const tophat::CompletionPrompt& prompt : request.prompts) {
    TOPHAT_FUZZ_CHECK(!prompt.ids || (!prompt.ids->empty() && prompt.text.empty()));
    text += prompt.text;
  }
  for (const tophat::ChatMessage& message : request.messages) text += message.content;
  if (!request.grammar.empty()) {
    auto grammar = tophat::EbnfGrammar::Compile(request.grammar);
    TOPHAT_FUZZ_CHECK(grammar.ok());  // it compiled when the request was read
    tophat::EbnfWorkspace workspace(grammar->get());
    tophat::EbnfState state(&workspace);
    (void)state.Feed(text);  // taken or refused, never a crash
  }
  if (request.endpoint == tophat::OpenAiEndpoint::kChatCompletions) {
    CheckTools(request, text, data, size);
  }
  size_t first_stop = std::string::npos;
  size_t stop_length = 0;  // the earliest stop's, the first listed at a tie
  for (const std::string& stop : request.stop) {
    TOPHAT_FUZZ_CHECK(!stop.empty());
    if (const size_t at = text.find(stop); at < first_stop) {
      first_stop = at;
      stop_length = stop.size();
    }
  }
  const bool include = request.include_stop_str_in_output;
  tophat::StopSequenceFilter filter(request.stop, include);
  std::string released;
  for (size_t at = 0, i = 0; at < text.size(); ++i) {
    // Pieces of 1 to 8 bytes, their lengths from the input.
    const size_t piece = 1 + (data[i % size] & 7);
    released += filter.Push(std::string_view(text).substr(at, piece));
    at += piece;
  }
  released += filter.Flush();
  TOPHAT_FUZZ_CHECK(filter.stopped() == (first_stop != std::string::npos));
  TOPHAT_FUZZ_CHECK(released == text.substr(0, first_stop == std::string::npos
                                                   ? first_stop
                                                   : first_stop + (include ? stop_length : 0)));
  return 0;
}
