// The OpenAI API's request bodies, as the agent's local HTTP endpoint takes them
// (POST /v1/chat/completions and /v1/completions): parsed and checked here, before any model
// runs, with errors in OpenAI's shape ({"error": {"message", "type", "param", "code"}}) and
// its HTTP statuses. A field the agent does not honour is refused by name when set to
// anything but its default, never silently ignored.
// Pure: no I/O, no model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "models/grammar/json_schema.h"
#include "models/tokenizers/chat_template.h"
#include "models/tokenizers/harmony.h"

namespace tophat {

enum class OpenAiEndpoint { kChatCompletions, kCompletions };

// One of a chat request's tools (OpenAI's {"type": "function", "function": {...}}).
struct OpenAiTool {
  std::string name;
  // The tool as the app sent it, keys in its order: the chat template writes it so.
  std::string json;
  // Its function's parameters, a JSON Schema as JSON text that compiles and takes only
  // objects ({"type": "object", "properties": {}} when not given).
  std::string parameters;
};

// Whether and how the answer calls tools (OpenAI's tool_choice).
enum class ToolChoice : uint8_t {
  kNone,      // it does not (the tools are still shown to the model, as OpenAI does)
  kAuto,      // the model chooses; its calls are read from what it wrote
  kRequired,  // at least one call (decoding constrained to calls)
  kFunction,  // one call of tool_choice_function (constrained)
};

struct OpenAiError {
  int http_status = 400;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, "" when none
  std::string code;   // e.g. "model_not_found"; "" (null) when none
  std::string message;
  nlohmann::json ToJson() const;
};

// One prompt of a completions request: text, or token ids used as they are (no BOS added).
struct CompletionPrompt {
  std::string text;
  std::optional<std::vector<int64_t>> ids;
};

struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kChatCompletions;
  std::string model;
  std::vector<ChatMessage> messages;  // chat
  // completions: one prompt (a string, or token ids: an array of integers), or several (an
  // array of strings, or of arrays of integers), each answered with its own n choices.
  std::vector<CompletionPrompt> prompts;
  int64_t max_tokens = 0;             // 0: the agent's default
  double temperature = 1.0;           // OpenAI's default
  double top_p = 1.0;
  std::optional<uint64_t> seed;
  // Penalties on repetition (SamplingParams): OpenAI's presence_penalty and
  // frequency_penalty, in [-2, 2], and vLLM's repetition_penalty (> 0; 1: off).
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  double repetition_penalty = 1.0;
  // vLLM's top_k: the k likeliest tokens only; 0 (or -1, vLLM's "off"): all.
  int64_t top_k = 0;
  // vLLM's min_tokens: the end-of-sequence and stop_token_ids are not chosen before this
  // many tokens (stop strings still end an answer).
  int64_t min_tokens = 0;
  // vLLM's include_stop_str_in_output: the stop string that ended the answer ends its text.
  bool include_stop_str_in_output = false;
  // vLLM's stop_token_ids: these token ids end the answer too (at most kMaxOpenAiStopIds).
  std::vector<int64_t> stop_token_ids;
  // vLLM's min_p, in [0, 1]: the tokens at least min_p times as likely as the likeliest.
  double min_p = 0.0;
  // Token id -> bias added to its logit, each in [-100, 100] ("logit_bias"; ids are checked
  // against the vocabulary by the server).
  std::vector<std::pair<int64_t, double>> logit_bias;
  std::vector<std::string> stop;  // at most 4, none empty
  // "response_format": {"type": "json_object"}: the answer is a JSON object
  // (GenerateRequest.response_format); {"type": "json_schema"}: a value of json_schema;
  // {"type": "text"}: anything.
  bool json_object = false;
  // With {"type": "json_schema"}: its "schema", as JSON text (it compiles: ParseOpenAiRequest
  // refuses one that does not); empty otherwise.
  std::string json_schema;
  // vLLM's structured_outputs {"regex"} (and the older guided_regex; SGLang's regex): a regular
  // expression the whole answer must match, which compiles (CompileRegexFormat); empty: none.
  std::string regex;
  // vLLM's structured_outputs {"choice"} (and the older guided_choice): the strings the whole
  // answer must be one of, within ChoiceSpec's limits; empty: none.
  std::vector<std::string> answer_choices;
  // vLLM's structured_outputs {"grammar"} (and the older guided_grammar): a grammar in GBNF
  // whose root rule the whole answer must match, which compiles (EbnfGrammar::Compile);
  // empty: none.
  std::string grammar;
  // response_format {"type": "structural_tag", "structures", "triggers"} (vLLM's and SGLang's)
  // or structured_outputs {"structural_tag"}: {"structures": [...], "triggers": [...]} as
  // JSON text, which StructuralTagSpec::Parse takes; empty: none.
  std::string structural_tag;
  // chat: "tools", "tool_choice" (kAuto by default when there are tools) and
  // "parallel_tool_calls" (whether an answer may hold several calls).
  std::vector<OpenAiTool> tools;
  ToolChoice tool_choice = ToolChoice::kNone;
  std::string tool_choice_function;  // kFunction: the tool's name
  bool parallel_tool_calls = true;
  // vLLM's and SGLang's chat_template_kwargs (chat): `enable_thinking` (Qwen3's switch), the
  // one key tophat's templates read.
  ChatRenderOptions chat_options;
  // vLLM's thinking_token_budget (chat): the most tokens a thinking model's reasoning may
  // take before its </think>, which is then forced (GenerateRequest.reasoning_token_budget);
  // -1: no limit. A model that does not think has no reasoning to count.
  int64_t thinking_token_budget = -1;
  // OpenAI's reasoning_effort (chat) or reasoning.effort (Responses): one of
  // kOpenAiReasoningEfforts (configs/agent_config.h), which the endpoint turns into a
  // thinking_token_budget (openai.reasoning_effort_budgets); "": not given.
  std::string reasoning_effort;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // tophat's extension (OpenAI's clients send it with extra_body; OpenAI ignores nothing, so
  // only a tophat endpoint should get it): "tophat_outline": true or {"max_points": N} asks
  // for outline-based parallel decoding (GenerateRequest.outline). 0: off; else the points'
  // bound (-1: the agent's).
  int64_t outline_max_points = 0;
  // "ignore_eos": true, as vLLM's OpenAI server takes it: generate max_tokens whatever the
  // model says (benchmarks and tests that need a request of known length).
  bool ignore_eos = false;
  // Log-probabilities of the generated tokens, with this many alternatives each; -1: none.
  // Chat: "logprobs": true and "top_logprobs": N; completions: "logprobs": N.
  int64_t logprobs = -1;
  // vLLM's extension: tokens in log-probabilities as "token_id:N" instead of their text.
  bool return_tokens_as_token_ids = false;
  // completions: the answer starts with the prompt, and with logprobs so do its
  // log-probabilities (the prompt's tokens', the first one's null).
  bool echo = false;
  // completions: "max_tokens": 0, with echo: read the prompt and generate nothing (scoring a
  // text, as lm-evaluation-harness does).
  bool prompt_only = false;
  // "n": this many choices per prompt, each its own request (the cloud batches them); choice
  // j of a prompt samples with seed + j when a seed is given.
  int64_t n = 1;
  // The choices in all: prompts x n (chat: n).
  int64_t choices() const {
    return n * std::max<int64_t>(1, static_cast<int64_t>(prompts.size()));
  }
};

// The most alternatives a token's log-probability may come with (OpenAI's chat limit, which
// the completions endpoint here shares; OpenAI's own completions stop at 5).
inline constexpr int64_t kMaxOpenAiLogprobs = 20;
// The most choices ("n") a request may ask for a prompt; each running choice takes one of
// the agent's max_concurrent_requests places.
inline constexpr int64_t kMaxOpenAiChoices = 16;
// The deepest a request body may nest arrays and objects (a JSON Schema in it included):
// deeper bodies are refused before anything copies or writes them, which recurses.
inline constexpr int kMaxRequestNesting = 256;
// The most stop_token_ids a request may name.
inline constexpr size_t kMaxOpenAiStopIds = 64;
// The most choices a request may ask for in all (prompts x n).
inline constexpr int64_t kMaxOpenAiBatch = 256;
// The most tools a request may offer (OpenAI's limit).
inline constexpr size_t kMaxOpenAiTools = 128;
// The most bytes of JSON a request's tools may hold in all, as their schemas' limit.
inline constexpr size_t kMaxOpenAiToolBytes = 256 << 10;
// The most logit_bias entries a request may carry (the agent's own limit, kMaxLogitBias).
inline constexpr size_t kMaxOpenAiLogitBias = 1024;

// vLLM's POST /tokenize: a completions `prompt` (a string; add_special_tokens: with the
// tokenizer's BOS, true by default) or chat `messages` (rendered with the chat template, as a
// chat completion's prompt), counted and listed as token ids, on the device.
struct TokenizeRequest {
  std::string prompt;
  std::vector<ChatMessage> messages;  // non-empty: a chat's
  bool add_special_tokens = true;
  ChatRenderOptions chat_options;  // chat_template_kwargs, as a chat completion's
  std::vector<OpenAiTool> tools;   // with messages: rendered as a chat completion's
};
// vLLM's POST /detokenize: token ids back to text.
struct DetokenizeRequest {
  std::vector<int64_t> tokens;
};
// `model` may be left out; given, it must be `served_model` (else 404).
std::variant<TokenizeRequest, OpenAiError> ParseTokenizeRequest(std::string_view body,
                                                                std::string_view served_model);
std::variant<DetokenizeRequest, OpenAiError> ParseDetokenizeRequest(
    std::string_view body, std::string_view served_model);

// The 404 OpenAI answers for a model the agent does not serve (`served_model`).
OpenAiError ModelNotFound(std::string_view model, std::string_view served_model);

// `served_model`: the one model name the agent answers to (GET /v1/models lists it); any
// other is a 404 model_not_found, as OpenAI answers.
std::variant<OpenAiRequest, OpenAiError> ParseOpenAiRequest(OpenAiEndpoint endpoint,
                                                            std::string_view body,
                                                            std::string_view served_model);

// OpenAI's Responses API (POST /v1/responses), read as the chat completion it asks for: the
// sampling fields as chat's, `text.format` as `response_format`, function tools and
// `tool_choice` in chat's shape, `max_output_tokens` as `max_completion_tokens`, and the
// input's items (messages, function calls and their outputs) as chat messages. What a chat
// completion has no place for is the server's: `instructions`, the response a turn follows
// (`previous_response_id`, from the agent's own store) and whether this one is kept (`store`).
// Errors name the Responses API's fields (`input[2].content`, `text.format`).
struct OpenAiResponsesRequest {
  // The chat completion: `messages` holds the input's items alone (no instructions, nothing
  // from an earlier response), `n` is 1.
  OpenAiRequest chat;
  std::optional<std::string> instructions;  // a system message before everything else
  std::string previous_response_id;         // "": none
  // A conversation (/v1/conversations) whose items come before the input, and to which the
  // input and the answer are added once it completes; "": none. Not with
  // previous_response_id.
  std::string conversation_id;
  bool store = true;                        // OpenAI's default: kept for later turns
  // Answered at once with the response in progress, generated while the client polls GET
  // /v1/responses/{id} (and may cancel it), or with `stream` followed as a stream that can
  // be resumed; needs `store`.
  bool background = false;
  // The fields a response object repeats, as given or at their defaults (background, instructions,
  // max_output_tokens, metadata, parallel_tool_calls, previous_response_id, store,
  // temperature, text, tool_choice, tools, top_logprobs, top_p, truncation, user), in that
  // order.
  nlohmann::ordered_json echo;
};
std::variant<OpenAiResponsesRequest, OpenAiError> ParseResponsesRequest(
    std::string_view body, std::string_view served_model);

// A request body as a JSON object (not too deeply nested), or the 400 saying why not.
std::variant<nlohmann::json, OpenAiError> ParseRequestBody(std::string_view body);
// `metadata` as OpenAI limits it: an object of at most 16 strings, keys of up to 64
// characters, values of up to 512; else the 400 naming it.
std::optional<OpenAiError> CheckMetadata(const nlohmann::ordered_json& metadata);

// Responses input (a string: the user's message; or items: messages, function calls and
// their outputs) as chat messages, appended to `messages`; calls join the assistant message
// before them. Errors name `field` and the item (`input[2].content`, `items[0].role`).
std::optional<OpenAiError> ParseResponsesInput(const nlohmann::ordered_json& input,
                                               std::vector<ChatMessage>& messages,
                                               std::string_view field);

// Holds back generated text that could be the start of a stop sequence, so that a stop
// sequence never reaches the client, even split over tokens. Push each new piece of text;
// what it returns is safe to send. Once a stop sequence is complete, stopped() is true and
// the text before it has been returned.
class StopSequenceFilter {
 public:
  // include_stop: the stop sequence that ends the text is released with it (vLLM's
  // include_stop_str_in_output).
  explicit StopSequenceFilter(std::vector<std::string> stops, bool include_stop = false)
      : stops_(std::move(stops)), include_stop_(include_stop) {}
  std::string Push(std::string_view text);
  // The text held back at the end of generation (no stop sequence completed).
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  bool include_stop_ = false;
  std::string pending_;
  bool stopped_ = false;
};

// The most calls one answer may make under tool_choice "required" with parallel_tool_calls.
inline constexpr int32_t kMaxOpenAiToolCalls = 16;

// Reads the tool calls out of an answer of a request that may call tools (tool_choice not
// "none"), in the model's layout. A call is returned only if its arguments satisfy its tool's
// parameters, so tool_calls always do, whether decoding was constrained or not: an answer
// whose calls do not read, or break a schema, is content, as the model's text. With
// parallel_tool_calls false, only the first call is kept.
class ToolCallReader {
 public:
  // INVALID_ARGUMENT (naming the tool) for parameters that do not compile, which
  // ParseOpenAiRequest has already refused.
  static absl::StatusOr<ToolCallReader> Create(const OpenAiRequest& request,
                                               ToolCallSyntax syntax);
  ToolCallReading Read(std::string_view text) const;
  // Whether `call` names one of the tools its answer may call, with arguments its parameters
  // accept.
  bool Accepts(const ToolCall& call) const;
  bool parallel() const { return parallel_; }
  const ToolCallSyntax& syntax() const { return syntax_; }

 private:
  ToolCallReader() = default;
  ToolCallSyntax syntax_;
  std::vector<std::string> names_;
  std::vector<std::shared_ptr<const CompiledSchema>> parameters_;  // by names_ index
  bool parallel_ = true;
};

// gpt-oss's calls (HarmonyReader's) as the answer's tool calls: each addressed to
// functions.NAME of a tool the request offers (`reader`; null: none offered), with arguments
// its parameters accept, compacted in their key order. If any is not, there are no calls and
// the calls' bodies are the answer's text (the model wrote something else), as ReadToolCalls
// takes text that is not all calls.
ToolCallReading ReadHarmonyCalls(std::span<const HarmonyCall> calls, const ToolCallReader* reader);

// Streams an answer that may hold tool calls: the text before a call goes out as it comes,
// and from a call's start on (a tag, or for a layout without tags an answer that starts with
// '{'; under a required call, everything) it is held back until the answer ends, when the
// reader decides whether it was calls. Text that may be the start of a tag is held back until
// it is known not to be one.
class ToolCallHoldback {
 public:
  ToolCallHoldback(ToolCallSyntax syntax, bool hold_all)
      : syntax_(std::move(syntax)), hold_all_(hold_all) {}
  // Appends text; returns what may be sent now.
  std::string Push(std::string_view text);
  // The answer so far, whole (sent and held).
  const std::string& text() const { return text_; }
  // What has not been sent.
  std::string_view held() const { return std::string_view(text_).substr(sent_); }

 private:
  ToolCallSyntax syntax_;
  bool hold_all_;
  bool holding_ = false;  // a call started: hold the rest
  std::string text_;
  size_t sent_ = 0;
};

}  // namespace tophat
