#include "device_agent/openai_request.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/json_depth.h"
#include "configs/agent_config.h"
#include "models/grammar/choice_grammar.h"
#include "models/grammar/ebnf_grammar.h"
#include "models/grammar/json_schema.h"
#include "models/grammar/regex_grammar.h"
#include "models/grammar/structural_tag_grammar.h"
#include "models/tokenizers/tokenizer_utf8.h"

namespace tophat {
namespace {

using Json = nlohmann::json;

OpenAiError Invalid(std::string param, std::string message) {
  return OpenAiError{.http_status = 400, .param = std::move(param), .message = std::move(message)};
}

// Fields the endpoint does not implement, accepted only at the value that means "off" (what
// the client sends when the caller did not ask): anything else would be ignored, so it is
// refused. Whether `value` is that value; nullopt for a key not among them. (null, which
// means absent, never reaches here.)
std::optional<bool> IsOffValue(std::string_view key, const Json& value) {
  if (key == "echo" || key == "store") {
    return value.is_boolean() && !value.get<bool>();
  }
  if (key == "best_of") return value.is_number_integer() && value.get<int64_t>() == 1;
  if (key == "metadata") return value.is_object() && value.empty();
  if (key == "functions") return value.is_array() && value.empty();
  if (key == "suffix") return value.is_string() && value.get<std::string>().empty();
  // No "off" value but absence.
  if (key == "function_call") return false;
  return std::nullopt;
}

// Token ids: an array of integers of at least 0 (checked against the vocabulary by the
// server); nullopt for anything else.
std::optional<std::vector<int64_t>> TokenIds(const Json& ids) {
  if (!ids.is_array()) return std::nullopt;
  std::vector<int64_t> out;
  for (const Json& id : ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) return std::nullopt;
    out.push_back(id.get<int64_t>());
  }
  return out;
}

// A completions prompt as token ids: [1, 2, 3], not empty; nullopt for anything else.
std::optional<std::vector<int64_t>> PromptIds(const Json& ids) {
  auto out = TokenIds(ids);
  if (!out || out->empty()) return std::nullopt;
  return out;
}

// A "model" field: the 400 or 404 when it is not `served_model`, else nullopt.
std::optional<OpenAiError> CheckServedModel(const Json& value, std::string_view served_model) {
  if (!value.is_string()) return Invalid("model", "'model' must be a string");
  if (value.get<std::string>() != served_model) {
    return ModelNotFound(value.get<std::string>(), served_model);
  }
  return std::nullopt;
}

// A completions "prompt": a string, token ids, or an array of either (a batch); nullopt
// for anything else.
std::optional<std::vector<CompletionPrompt>> CompletionPrompts(const Json& value) {
  if (value.is_string()) return std::vector<CompletionPrompt>{{.text = value.get<std::string>()}};
  if (auto ids = PromptIds(value)) return std::vector<CompletionPrompt>{{.ids = std::move(ids)}};
  if (!value.is_array() || value.empty()) return std::nullopt;
  std::vector<CompletionPrompt> prompts;
  for (const Json& item : value) {
    if (item.is_string()) {
      prompts.push_back({.text = item.get<std::string>()});
    } else if (auto ids = PromptIds(item)) {
      prompts.push_back({.ids = std::move(ids)});
    } else {
      return std::nullopt;
    }
  }
  return prompts;
}

std::variant<std::string, OpenAiError> MessageContent(const Json& content, size_t index) {
  const std::string param = absl::StrCat("messages[", index, "].content");
  if (content.is_string()) return content.get<std::string>();
  // Content parts: text parts are concatenated; anything else (images, audio) is refused.
  if (content.is_array()) {
    std::string text;
    for (const Json& part : content) {
      if (!part.is_object() || part.value("type", Json()) != "text" || !part.contains("text") ||
          !part["text"].is_string()) {
        return Invalid(param, absl::StrCat(param, ": only text content parts are supported"));
      }
      text += part["text"].get<std::string>();
    }
    return text;
  }
  return Invalid(param, absl::StrCat(param, " must be a string or an array of text parts"));
}

// A tool's name, as OpenAI takes it: 1 to 64 of [A-Za-z0-9_-].
bool IsToolName(const Json& name) {
  if (!name.is_string()) return false;
  const std::string& text = name.get_ref<const std::string&>();
  return !text.empty() && text.size() <= 64 && std::all_of(text.begin(), text.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments": a JSON object as text}}].
std::optional<OpenAiError> ParseToolCalls(const Json& value, const std::string& where,
                                          std::vector<ToolCall>& calls) {
  const std::string param = absl::StrCat(where, ".tool_calls");
  if (!value.is_array()) return Invalid(param, absl::StrCat(param, " must be an array"));
  for (size_t j = 0; j < value.size(); ++j) {
    const Json& call = value[j];
    const std::string at = absl::StrCat(param, "[", j, "]");
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
        call.value("type", Json("function")) != "function") {
      return Invalid(at, absl::StrCat(at, " must be {\"id\", \"type\": \"function\", "
                                          "\"function\": {\"name\", \"arguments\"}}"));
    }
    const Json& function = call["function"];
    if (!IsToolName(function.value("name", Json()))) {
      return Invalid(at + ".function.name",
                     absl::StrCat(at, ".function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -"));
    }
    const Json arguments_text = function.value("arguments", Json());
    const Json arguments = arguments_text.is_string()
                               ? Json::parse(arguments_text.get<std::string>(), nullptr, false)
                               : Json();
    if (!arguments.is_object()) {
      return Invalid(at + ".function.arguments",
                     absl::StrCat(at, ".function.arguments must be a JSON object, as text"));
    }
    calls.push_back({.id = call.value("id", Json("")).is_string() ? call.value("id", "") : "",
                     .name = function["name"].get<std::string>(),
                     .arguments = arguments_text.get<std::string>()});
  }
  return std::nullopt;
}

std::optional<OpenAiError> ParseMessages(const Json& value, std::vector<ChatMessage>& messages) {
  if (!value.is_array() || value.empty()) {
    return Invalid("messages", "'messages' must be a non-empty array");
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const Json& message = value[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!message.is_object()) return Invalid(where, absl::StrCat(where, " must be an object"));
    if (!message.contains("role") || !message["role"].is_string()) {
      return Invalid(absl::StrCat(where, ".role"), absl::StrCat(where, ".role is required"));
    }
    std::string role = message["role"].get<std::string>();
    // OpenAI's newer name for the system role.
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return Invalid(absl::StrCat(where, ".role"),
                     absl::StrCat(where, ".role \"", role,
                                  "\" is not supported (system, developer, user, assistant, "
                                  "tool)"));
    }
    // A field set to null is absent (clients send back an answer's message whole, with its
    // refusal, audio and function_call null).
    for (const auto& [key, field] : message.items()) {
      const bool known =
          key == "role" || key == "content" || (key == "tool_calls" && role == "assistant") ||
          ((key == "reasoning" || key == "reasoning_content") && role == "assistant") ||
          (key == "tool_call_id" && role == "tool");
      if (!known && !field.is_null() && !(key == "annotations" && field == Json::array())) {
        return Invalid(absl::StrCat(where, ".", key),
                       absl::StrCat(where, ".", key, " is not supported by this endpoint"));
      }
    }
    ChatMessage parsed{.role = std::move(role)};
    // An earlier answer's reasoning, sent back beside its content (vLLM's `reasoning`, and
    // `reasoning_content` as DeepSeek's API and older vLLM name it); a thinking template
    // places or drops it as the model was trained to read it.
    for (const char* key : {"reasoning", "reasoning_content"}) {
      if (!message.contains(key) || message[key].is_null()) continue;
      if (!message[key].is_string()) {
        return Invalid(absl::StrCat(where, ".", key),
                       absl::StrCat(where, ".", key, " must be a string"));
      }
      if (parsed.reasoning && *parsed.reasoning != message[key].get<std::string>()) {
        return Invalid(absl::StrCat(where, ".", key),
                       absl::StrCat(where, ".reasoning and .reasoning_content differ"));
      }
      parsed.reasoning = message[key].get<std::string>();
    }
    if (message.contains("tool_calls") && !message["tool_calls"].is_null()) {
      if (auto error = ParseToolCalls(message["tool_calls"], where, parsed.tool_calls)) {
        return error;
      }
    }
    if (parsed.role == "tool") {
      if (!message.contains("tool_call_id") || !message["tool_call_id"].is_string()) {
        return Invalid(absl::StrCat(where, ".tool_call_id"),
                       absl::StrCat(where, ".tool_call_id (the call answered) is required"));
      }
      parsed.tool_call_id = message["tool_call_id"].get<std::string>();
    }
    const bool content_given = message.contains("content") && !message["content"].is_null();
    if (content_given) {
      auto content = MessageContent(message["content"], i);
      if (auto* error = std::get_if<OpenAiError>(&content)) return *error;
      parsed.content = std::get<std::string>(std::move(content));
    } else if (parsed.tool_calls.empty()) {
      // Only an assistant's calls stand without content.
      return Invalid(absl::StrCat(where, ".content"),
                     absl::StrCat(where, ".content is required"));
    }
    messages.push_back(std::move(parsed));
  }
  return std::nullopt;
}

// vLLM's and SGLang's "chat_template_kwargs": {"enable_thinking": bool} (Qwen3's switch) and
// {"reasoning_effort": "low" | "medium" | "high"} (gpt-oss's), the keys tophat's templates
// read; any other is refused by name rather than ignored.
std::optional<OpenAiError> ParseChatTemplateKwargs(const Json& value, ChatRenderOptions& options) {
  const std::string kKey = "chat_template_kwargs";
  if (!value.is_object()) {
    return Invalid(kKey, "'chat_template_kwargs' must be an object");
  }
  for (const auto& [option, setting] : value.items()) {
    const std::string at = absl::StrCat(kKey, ".", option);
    if (option == "reasoning_effort") {
      if (!setting.is_string() || (setting != "low" && setting != "medium" && setting != "high")) {
        return Invalid(at, absl::StrCat(at, " must be \"low\", \"medium\" or \"high\""));
      }
      options.reasoning_effort = setting.get<std::string>();
      continue;
    }
    if (option != "enable_thinking") {
      return Invalid(at, absl::StrCat(at,
                                      " is not read by tophat's chat templates (they take "
                                      "enable_thinking and reasoning_effort)"));
    }
    if (!setting.is_boolean()) return Invalid(at, absl::StrCat(at, " must be a boolean"));
    options.enable_thinking = setting.get<bool>();
  }
  return std::nullopt;
}

// "tools": [{"type": "function", "function": {"name", "description", "parameters",
// "strict"}}], each kept as the app wrote it (`ordered`: the same array, keys in order).
std::optional<OpenAiError> ParseTools(const Json& value, const nlohmann::ordered_json& ordered,
                                      std::vector<OpenAiTool>& tools) {
  if (!value.is_array() || value.size() > kMaxOpenAiTools) {
    return Invalid("tools", absl::StrCat("'tools' must be an array of at most ",
                                         kMaxOpenAiTools, " tools"));
  }
  // The two parses differ only for a body that repeats a key.
  if (!ordered.is_array() || ordered.size() != value.size()) {
    return Invalid("tools", "'tools' is given twice, or repeats a key");
  }
  size_t bytes = 0;
  for (size_t t = 0; t < value.size(); ++t) {
    const Json& tool = value[t];
    const std::string at = absl::StrCat("tools[", t, "]");
    if (!tool.is_object() || tool.value("type", Json()) != "function" || !tool.contains("function") ||
        !tool["function"].is_object()) {
      return Invalid(at, absl::StrCat(at, " must be {\"type\": \"function\", \"function\": "
                                          "{\"name\", \"description\", \"parameters\"}}"));
    }
    for (const auto& [key, unused] : tool.items()) {
      if (key != "type" && key != "function") {
        return Invalid(at, absl::StrCat(at, " has no field '", key, "'"));
      }
    }
    const Json& function = tool["function"];
    for (const auto& [key, field] : function.items()) {
      const bool known = (key == "name") || (key == "description" && field.is_string()) ||
                         (key == "parameters" && field.is_object()) ||
                         (key == "strict" && field.is_boolean()) || field.is_null();
      if (!known) {
        return Invalid(absl::StrCat(at, ".function.", key),
                       absl::StrCat(at, ".function.", key,
                                    " is not supported (name, description: a string, "
                                    "parameters: a JSON Schema, strict: a boolean)"));
      }
    }
    if (!IsToolName(function.value("name", Json()))) {
      return Invalid(at + ".function.name",
                     absl::StrCat(at, ".function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -"));
    }
    const std::string name = function["name"].get<std::string>();
    for (const OpenAiTool& before : tools) {
      if (before.name == name) {
        return Invalid(at + ".function.name",
                       absl::StrCat(at, ".function.name \"", name, "\" is given twice"));
      }
    }
    const Json parameters = function.contains("parameters") && function["parameters"].is_object()
                                ? function["parameters"]
                                : Json{{"type", "object"}, {"properties", Json::object()}};
    const std::string param = at + ".function.parameters";
    auto compiled = CompiledSchema::CompileShared(parameters);
    if (!compiled.ok()) {
      return Invalid(param, absl::StrCat(param, ": ", compiled.status().message()));
    }
    const SchemaNode& root = (*compiled)->node((*compiled)->root());
    if (root.any || root.types != kTypeObject) {
      return Invalid(param, absl::StrCat(param, " must describe an object (\"type\": "
                                                "\"object\"): a call's arguments are one"));
    }
    OpenAiTool parsed{.name = name,
                      .json = ordered[t].dump(-1, ' ', false,
                                              nlohmann::ordered_json::error_handler_t::replace),
                      .parameters = parameters.dump()};
    bytes += parsed.json.size();
    if (bytes > kMaxOpenAiToolBytes) {
      return Invalid("tools", absl::StrCat("'tools' hold more than ", kMaxOpenAiToolBytes,
                                           " bytes of JSON"));
    }
    tools.push_back(std::move(parsed));
  }
  return std::nullopt;
}

// "tool_choice": "none", "auto", "required" or {"type": "function", "function": {"name"}}.
std::optional<OpenAiError> ParseToolChoice(const Json& value, OpenAiRequest& request) {
  if (value == "none" || value == "auto" || value == "required") {
    request.tool_choice = value == "none"   ? ToolChoice::kNone
                          : value == "auto" ? ToolChoice::kAuto
                                            : ToolChoice::kRequired;
    return std::nullopt;
  }
  if (value.is_object() && value.value("type", Json()) == "function" && value.size() == 2 &&
      value.contains("function") && value["function"].is_object() &&
      value["function"].size() == 1 && IsToolName(value["function"].value("name", Json()))) {
    request.tool_choice = ToolChoice::kFunction;
    request.tool_choice_function = value["function"]["name"].get<std::string>();
    return std::nullopt;
  }
  return Invalid("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                "{\"type\": \"function\", \"function\": {\"name\": ...}}");
}

// A request body: a JSON object, or the 400 saying why not.
std::variant<Json, OpenAiError> ParseObject(std::string_view body) {
  Json json;
  try {
    json = Json::parse(body);
  } catch (const Json::exception& e) {
    // The parser's message quotes the bytes it stopped at, which need not be UTF-8; the
    // error object it goes into must be.
    return Invalid("", absl::StrCat("the request body is not valid JSON: ",
                                    utf8::ToValidLossy(e.what())));
  }
  if (!json.is_object()) return Invalid("", "the request body must be a JSON object");
  if (NestedDeeperThan(json, kMaxRequestNesting)) {
    return Invalid("", absl::StrCat("the request body nests arrays and objects more than ",
                                    kMaxRequestNesting, " deep"));
  }
  return json;
}

// response_format {"type": "json_schema", "json_schema": {"name", "schema", "description",
// "strict"}}: the schema as JSON text, once it compiles (the agent compiles it again from
// that text, as it does a GenerateRequest's from any app; here its errors become the 400 a
// client expects before any answer starts, naming the place in the schema).
std::variant<std::string, OpenAiError> ParseJsonSchemaFormat(const Json& format) {
  constexpr char kKey[] = "response_format";
  if (!format.contains("json_schema") || !format["json_schema"].is_object()) {
    return Invalid(kKey, "'response_format' of type \"json_schema\" needs a 'json_schema' "
                         "object with a 'name' and a 'schema'");
  }
  const Json& spec = format["json_schema"];
  for (const auto& [field, value] : spec.items()) {
    if (field == "name") {
      const std::string name = value.is_string() ? value.get<std::string>() : "";
      const bool good = !name.empty() && name.size() <= 64 &&
                        std::all_of(name.begin(), name.end(), [](char c) {
                          return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
                        });
      if (!good) {
        return Invalid(kKey, "'response_format.json_schema.name' must be 1 to 64 letters, "
                             "digits, '_' or '-'");
      }
    } else if (field == "description") {
      if (!value.is_string() && !value.is_null()) {
        return Invalid(kKey, "'response_format.json_schema.description' must be a string");
      }
    } else if (field == "strict") {
      // Strict or not, the answer is held to the schema: decoding is constrained.
      if (!value.is_boolean() && !value.is_null()) {
        return Invalid(kKey, "'response_format.json_schema.strict' must be a boolean");
      }
    } else if (field != "schema") {
      return Invalid(kKey, absl::StrCat("'response_format.json_schema' has no field '", field, "'"));
    }
  }
  if (!spec.contains("name")) return Invalid(kKey, "'response_format.json_schema.name' is required");
  if (!spec.contains("schema") || !(spec["schema"].is_object() || spec["schema"].is_boolean())) {
    return Invalid(kKey, "'response_format.json_schema.schema' (a JSON Schema) is required");
  }
  std::string text = spec["schema"].dump();
  if (static_cast<int64_t>(text.size()) > kMaxJsonSchemaBytes) {
    return Invalid(kKey, absl::StrCat("'response_format.json_schema.schema' is ", text.size(),
                                      " bytes, more than ", kMaxJsonSchemaBytes));
  }
  absl::StatusOr<std::shared_ptr<const CompiledSchema>> compiled =
      CompiledSchema::CompileShared(spec["schema"]);
  if (!compiled.ok()) {
    return Invalid(kKey, absl::StrCat("'response_format.json_schema.schema' ",
                                      compiled.status().message()));
  }
  return text;
}

// A regex format (structured_outputs.regex, guided_regex): compiled here so that a client
// learns at once what in it is not supported.
std::variant<std::string, OpenAiError> RegexFormat(const std::string& param, const Json& value) {
  if (!value.is_string() || value.get<std::string>().empty()) {
    return Invalid(param, absl::StrCat("'", param, "' must be a non-empty regular expression"));
  }
  const std::string regex = value.get<std::string>();
  if (absl::Status compiled = CompileRegexFormat(regex).status(); !compiled.ok()) {
    return Invalid(param, absl::StrCat("'", param, "': ", compiled.message()));
  }
  return regex;
}

// A grammar format (structured_outputs.grammar, guided_grammar): GBNF, compiled here as a
// regex is, its error naming the line and column or the rule.
std::variant<std::string, OpenAiError> GrammarFormat(const std::string& param, const Json& value) {
  if (!value.is_string() || value.get<std::string>().empty()) {
    return Invalid(param, absl::StrCat("'", param, "' must be a non-empty grammar (GBNF)"));
  }
  const std::string grammar = value.get<std::string>();
  if (absl::Status compiled = EbnfGrammar::Compile(grammar).status(); !compiled.ok()) {
    return Invalid(param, absl::StrCat("'", param, "': ", compiled.message()));
  }
  return grammar;
}

// A structural tag (response_format {"type": "structural_tag"}, structured_outputs
// {"structural_tag"}: an object, or vLLM's JSON text of one): {"structures", "triggers"} as
// JSON text, once it compiles (StructuralTagSpec::Parse), its errors naming the place in it.
std::variant<std::string, OpenAiError> StructuralTagFormat(const std::string& param,
                                                           const Json& value) {
  Json tag = value;
  if (value.is_string()) {
    try {
      tag = Json::parse(value.get<std::string>());
    } catch (const Json::exception& e) {
      return Invalid(param, absl::StrCat("'", param,
                                         "' is not a JSON object: ", utf8::ToValidLossy(e.what())));
    }
  }
  if (!tag.is_object()) {
    return Invalid(param, absl::StrCat("'", param,
                                       "' must be an object {\"structures\": [...], "
                                       "\"triggers\": [...]}"));
  }
  // A "type" beside the fields (response_format's) must be "structural_tag": Parse checks.
  std::string text = tag.dump();
  if (absl::Status compiled = StructuralTagSpec::Parse(text).status(); !compiled.ok()) {
    return Invalid(param, absl::StrCat("'", param, "': ", compiled.message()));
  }
  return text;
}

// A choice format (structured_outputs.choice, guided_choice): the answer is one of the
// strings (a trie of them: ChoiceSpec), within its limits.
std::variant<std::vector<std::string>, OpenAiError> ChoiceFormat(const std::string& param,
                                                                 const Json& value) {
  std::vector<std::string> choices;
  if (value.is_array()) {
    for (const Json& choice : value) {
      if (!choice.is_string() || choice.get<std::string>().empty()) {
        choices.clear();
        break;
      }
      choices.push_back(choice.get<std::string>());
    }
  }
  if (choices.empty()) {
    return Invalid(param,
                   absl::StrCat("'", param, "' must be a non-empty array of non-empty strings"));
  }
  if (absl::Status checked = ChoiceSpec::Check(choices); !checked.ok()) {
    return Invalid(param, absl::StrCat("'", param, "': ", checked.message()));
  }
  return choices;
}

// Whether `value` (a Json or an OrderedJson) names one of OpenAI's reasoning efforts.
template <typename AnyJson>
bool IsReasoningEffort(const AnyJson& value) {
  return value.is_string() &&
         absl::c_linear_search(kOpenAiReasoningEfforts, value.template get<std::string>());
}

// "\"none\", \"minimal\", ..." for an error.
std::string EffortList() {
  std::string list;
  for (const std::string_view effort : kOpenAiReasoningEfforts) {
    absl::StrAppend(&list, list.empty() ? "" : ", ", "\"", std::string(effort), "\"");
  }
  return list;
}

}  // namespace

// The 404 OpenAI answers for a model the agent does not serve.
OpenAiError ModelNotFound(std::string_view model, std::string_view served_model) {
  return OpenAiError{.http_status = 404,
                     .param = "model",
                     .code = "model_not_found",
                     .message = absl::StrCat("The model '", std::string(model),
                                             "' does not exist; this agent serves '",
                                             std::string(served_model), "'")};
}

Json OpenAiError::ToJson() const {
  return Json{{"error",
               {{"message", message},
                {"type", type},
                {"param", param.empty() ? Json(nullptr) : Json(param)},
                {"code", code.empty() ? Json(nullptr) : Json(code)}}}};
}

std::variant<OpenAiRequest, OpenAiError> ParseOpenAiRequest(OpenAiEndpoint endpoint,
                                                            std::string_view body,
                                                            std::string_view served_model) {
  auto object = ParseObject(body);
  if (auto* error = std::get_if<OpenAiError>(&object)) return *error;
  const Json& json = std::get<Json>(object);

  OpenAiRequest request;
  request.endpoint = endpoint;
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  const char* input_key = chat ? "messages" : "prompt";
  bool has_input = false;
  bool chat_logprobs = false;
  bool max_tokens_zero = false;
  bool tool_choice_given = false;
  // The field that holds the answer's format: response_format (a JSON one), or vLLM's
  // structured_outputs, guided_regex, guided_choice or guided_grammar (or SGLang's regex and
  // ebnf, llama.cpp's grammar); "" when none does.
  std::string format_key;
  int format_keys = 0;
  std::optional<int64_t> top_logprobs;
  for (const auto& [key, value] : json.items()) {
    if (value.is_null() && key != input_key && key != "model") continue;  // absent
    if (key == "model") {
      if (!value.is_string()) return Invalid("model", "'model' must be a string");
      request.model = value.get<std::string>();
    } else if (key == input_key) {
      has_input = true;
      if (chat) {
        if (auto error = ParseMessages(value, request.messages)) return *error;
      } else if (auto prompts = CompletionPrompts(value)) {
        request.prompts = *std::move(prompts);
      } else {
        return Invalid("prompt",
                       "'prompt' must be a string, token ids (an array of integers of at least "
                       "0), or a non-empty array of either");
      }
    } else if (key == "max_tokens" && !chat && value.is_number_integer() &&
               value.get<int64_t>() == 0) {
      max_tokens_zero = true;  // scoring: needs echo, checked below
    } else if (key == "max_tokens" || (chat && key == "max_completion_tokens")) {
      if (!value.is_number_integer() || value.get<int64_t>() < 1) {
        return Invalid(key, absl::StrCat("'", key, "' must be an integer of at least 1",
                                         chat ? "" : " (0 with 'echo': true)"));
      }
      // max_completion_tokens is the newer name; it wins where both are given.
      if (key == "max_completion_tokens" || request.max_tokens == 0) {
        request.max_tokens = value.get<int64_t>();
      }
    } else if (key == "temperature") {
      if (!value.is_number() || !(value.get<double>() >= 0 && value.get<double>() <= 2)) {
        return Invalid(key, "'temperature' must be a number from 0 to 2");
      }
      request.temperature = value.get<double>();
    } else if (key == "top_p") {
      if (!value.is_number() || !(value.get<double>() > 0 && value.get<double>() <= 1)) {
        return Invalid(key, "'top_p' must be a number above 0 and at most 1");
      }
      request.top_p = value.get<double>();
    } else if (key == "presence_penalty" || key == "frequency_penalty") {
      if (!value.is_number() || !(value.get<double>() >= -2 && value.get<double>() <= 2)) {
        return Invalid(key, absl::StrCat("'", key, "' must be a number from -2 to 2"));
      }
      (key == "presence_penalty" ? request.presence_penalty : request.frequency_penalty) =
          value.get<double>();
    } else if (key == "repetition_penalty") {
      if (!value.is_number() || !(value.get<double>() > 0 && value.get<double>() <= 100)) {
        return Invalid(key, "'repetition_penalty' must be a number above 0 and at most 100 "
                            "(1: off)");
      }
      request.repetition_penalty = value.get<double>();
    } else if (key == "min_tokens") {
      if (!value.is_number_integer() || value.get<int64_t>() < 0) {
        return Invalid(key, "'min_tokens' must be an integer of at least 0");
      }
      request.min_tokens = value.get<int64_t>();
    } else if (key == "include_stop_str_in_output") {
      if (!value.is_boolean()) return Invalid(key, "'include_stop_str_in_output' must be a boolean");
      request.include_stop_str_in_output = value.get<bool>();
    } else if (key == "stop_token_ids") {
      auto ids = TokenIds(value);
      if (!ids || ids->size() > kMaxOpenAiStopIds) {
        return Invalid(key, absl::StrCat("'stop_token_ids' must be an array of at most ",
                                         kMaxOpenAiStopIds,
                                         " token ids (integers of at least 0)"));
      }
      request.stop_token_ids = *std::move(ids);
    } else if (key == "min_p") {
      if (!value.is_number() || !(value.get<double>() >= 0 && value.get<double>() <= 1)) {
        return Invalid(key, "'min_p' must be a number from 0 to 1");
      }
      request.min_p = value.get<double>();
    } else if (key == "top_k") {
      if (!value.is_number_integer() || value.get<int64_t>() < -1 ||
          value.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return Invalid(key, "'top_k' must be an integer, at least 1 (0 or -1: off)");
      }
      request.top_k = std::max<int64_t>(0, value.get<int64_t>());
    } else if (key == "seed") {
      if (!value.is_number_integer()) return Invalid(key, "'seed' must be an integer");
      request.seed = static_cast<uint64_t>(value.get<int64_t>());
    } else if (key == "stop") {
      std::vector<std::string> stops;
      if (value.is_string()) {
        stops.push_back(value.get<std::string>());
      } else if (value.is_array()) {
        for (const Json& stop : value) {
          if (!stop.is_string()) return Invalid(key, "'stop' must be a string or strings");
          stops.push_back(stop.get<std::string>());
        }
      } else {
        return Invalid(key, "'stop' must be a string or an array of strings");
      }
      if (stops.size() > 4) return Invalid(key, "'stop' takes at most 4 sequences");
      for (const std::string& stop : stops) {
        if (stop.empty()) return Invalid(key, "'stop' sequences must not be empty");
      }
      request.stop = std::move(stops);
    } else if (key == "response_format") {
      const char* const kShape =
          "'response_format' must be an object with a 'type': \"text\", \"json_object\", "
          "\"json_schema\" or \"structural_tag\"";
      if (!value.is_object() || !value.contains("type") || !value["type"].is_string()) {
        return Invalid(key, kShape);
      }
      const std::string type = value["type"].get<std::string>();
      if (type != "text" && type != "json_object" && type != "json_schema" &&
          type != "structural_tag") {
        return Invalid(key, kShape);
      }
      if (type == "structural_tag") {
        // Its fields (structures, triggers) are the tag's, which Parse names.
        auto tag = StructuralTagFormat(key, value);
        if (auto* error = std::get_if<OpenAiError>(&tag)) return *error;
        request.structural_tag = std::get<std::string>(std::move(tag));
        format_key = key;
        ++format_keys;
        continue;
      }
      for (const auto& [field, unused] : value.items()) {
        if (field != "type" && !(type == "json_schema" && field == "json_schema")) {
          return Invalid(key, absl::StrCat("'response_format' of type \"", type,
                                           "\" has no field '", field, "'"));
        }
      }
      request.json_object = type == "json_object";
      if (type != "text") {
        format_key = key;
        ++format_keys;
      }
      if (type == "json_schema") {
        std::variant<std::string, OpenAiError> schema = ParseJsonSchemaFormat(value);
        if (auto* error = std::get_if<OpenAiError>(&schema)) return *error;
        request.json_schema = std::get<std::string>(std::move(schema));
      }
    } else if (key == "structured_outputs") {
      // vLLM's: one of regex, choice, grammar (GBNF), json (a JSON Schema) or json_object.
      const char* const kShape =
          "'structured_outputs' must be an object with one of 'regex', 'choice', 'grammar', "
          "'json', 'json_object' or 'structural_tag'";
      if (!value.is_object()) return Invalid(key, kShape);
      int given = 0;
      for (const auto& [field, setting] : value.items()) {
        if (setting.is_null()) continue;
        const std::string param = absl::StrCat(key, ".", field);
        ++given;
        if (field == "regex") {
          auto regex = RegexFormat(param, setting);
          if (auto* error = std::get_if<OpenAiError>(&regex)) return *error;
          request.regex = std::get<std::string>(std::move(regex));
        } else if (field == "choice") {
          auto choices = ChoiceFormat(param, setting);
          if (auto* error = std::get_if<OpenAiError>(&choices)) return *error;
          request.answer_choices = std::get<std::vector<std::string>>(std::move(choices));
        } else if (field == "grammar") {
          auto grammar = GrammarFormat(param, setting);
          if (auto* error = std::get_if<OpenAiError>(&grammar)) return *error;
          request.grammar = std::get<std::string>(std::move(grammar));
        } else if (field == "json") {
          auto schema = ParseJsonSchemaFormat(
              Json{{"json_schema", {{"name", "structured_outputs"}, {"schema", setting}}}});
          if (auto* error = std::get_if<OpenAiError>(&schema)) {
            // Named as given: the schema's place, not response_format's.
            OpenAiError renamed = *error;
            renamed.param = param;
            constexpr std::string_view kGiven = "'response_format.json_schema.schema'";
            if (const size_t at = renamed.message.find(kGiven); at != std::string::npos) {
              renamed.message.replace(at, kGiven.size(), absl::StrCat("'", param, "'"));
            }
            return renamed;
          }
          request.json_schema = std::get<std::string>(std::move(schema));
        } else if (field == "json_object") {
          if (setting != true) return Invalid(param, absl::StrCat("'", param, "' must be true"));
          request.json_object = true;
        } else if (field == "structural_tag") {
          auto tag = StructuralTagFormat(param, setting);
          if (auto* error = std::get_if<OpenAiError>(&tag)) return *error;
          request.structural_tag = std::get<std::string>(std::move(tag));
        } else {
          return Invalid(param, absl::StrCat("'", param,
                                             "' is not supported (regex, choice, grammar, "
                                             "json, json_object, structural_tag)"));
        }
      }
      if (given != 1) return Invalid(key, kShape);
      format_key = key;
      ++format_keys;
    } else if (key == "guided_regex" || key == "regex") {
      // vLLM's older field, and SGLang's regex.
      auto regex = RegexFormat(key, value);
      if (auto* error = std::get_if<OpenAiError>(&regex)) return *error;
      request.regex = std::get<std::string>(std::move(regex));
      format_key = key;
      ++format_keys;
    } else if (key == "guided_choice") {
      // vLLM's older field.
      auto choices = ChoiceFormat(key, value);
      if (auto* error = std::get_if<OpenAiError>(&choices)) return *error;
      request.answer_choices = std::get<std::vector<std::string>>(std::move(choices));
      format_key = key;
      ++format_keys;
    } else if (key == "guided_grammar" || key == "ebnf" || key == "grammar") {
      // vLLM's older field, SGLang's ebnf and llama.cpp's grammar: the same GBNF.
      auto grammar = GrammarFormat(key, value);
      if (auto* error = std::get_if<OpenAiError>(&grammar)) return *error;
      request.grammar = std::get<std::string>(std::move(grammar));
      format_key = key;
      ++format_keys;
    } else if (key == "tools" && chat) {
      // Parsed again keeping each tool's key order, which the chat template writes.
      const auto ordered = nlohmann::ordered_json::parse(body)["tools"];
      if (auto error = ParseTools(value, ordered, request.tools)) return *error;
    } else if (key == "tool_choice" && chat) {
      if (auto error = ParseToolChoice(value, request)) return *error;
      tool_choice_given = true;
    } else if (key == "parallel_tool_calls" && chat) {
      if (!value.is_boolean()) return Invalid(key, "'parallel_tool_calls' must be a boolean");
      request.parallel_tool_calls = value.get<bool>();
    } else if (key == "chat_template_kwargs" && chat) {
      if (auto error = ParseChatTemplateKwargs(value, request.chat_options)) return *error;
    } else if (key == "thinking_token_budget") {
      if (!chat) {
        return Invalid(key,
                       "'thinking_token_budget' is for chat completions: the chat template "
                       "tells where a thinking model's reasoning ends");
      }
      if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
          value.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return Invalid(key, "'thinking_token_budget' must be an integer of at least 0");
      }
      request.thinking_token_budget = value.get<int64_t>();
    } else if (key == "reasoning_effort") {
      if (!chat) {
        return Invalid(key,
                       "'reasoning_effort' is for chat completions: the chat template tells "
                       "where a thinking model's reasoning ends");
      }
      if (value.is_null()) continue;
      if (!IsReasoningEffort(value)) {
        return Invalid(key, absl::StrCat("'reasoning_effort' must be one of ", EffortList()));
      }
      request.reasoning_effort = value.get<std::string>();
    } else if (key == "stream") {
      if (!value.is_boolean()) return Invalid(key, "'stream' must be a boolean");
      request.stream = value.get<bool>();
    } else if (key == "stream_options") {
      if (!value.is_object()) return Invalid(key, "'stream_options' must be an object");
      for (const auto& [option, setting] : value.items()) {
        if (option != "include_usage" || !setting.is_boolean()) {
          return Invalid(absl::StrCat("stream_options.", option),
                         absl::StrCat("stream_options.", option, " is not supported"));
        }
        request.include_usage = setting.get<bool>();
      }
    } else if (key == "tophat_outline") {
      if (value.is_boolean()) {
        request.outline_max_points = value.get<bool>() ? -1 : 0;
      } else if (value.is_object()) {
        request.outline_max_points = -1;
        for (const auto& [option, setting] : value.items()) {
          if (option != "max_points" || !setting.is_number_integer() ||
              setting.get<int64_t>() < 2) {
            return Invalid(absl::StrCat("tophat_outline.", option),
                           absl::StrCat("tophat_outline takes only max_points, an integer of at "
                                        "least 2; got ", option));
          }
          request.outline_max_points = setting.get<int64_t>();
        }
      } else {
        return Invalid(key, "'tophat_outline' must be a boolean or {\"max_points\": N}");
      }
    } else if (key == "logprobs" && chat) {
      if (!value.is_boolean()) return Invalid(key, "'logprobs' must be a boolean");
      chat_logprobs = value.get<bool>();
    } else if (key == "top_logprobs" && chat) {
      if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
          value.get<int64_t>() > kMaxOpenAiLogprobs) {
        return Invalid(key, absl::StrCat("'top_logprobs' must be an integer from 0 to ",
                                         kMaxOpenAiLogprobs));
      }
      top_logprobs = value.get<int64_t>();
    } else if (key == "logprobs") {
      if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
          value.get<int64_t>() > kMaxOpenAiLogprobs) {
        return Invalid(key, absl::StrCat("'logprobs' must be an integer from 0 to ",
                                         kMaxOpenAiLogprobs));
      }
      request.logprobs = value.get<int64_t>();
    } else if (key == "logit_bias") {
      if (!value.is_object()) {
        return Invalid(key, "'logit_bias' must be an object of token ids to biases");
      }
      if (value.size() > kMaxOpenAiLogitBias) {
        return Invalid(key, absl::StrCat("'logit_bias' takes at most ", kMaxOpenAiLogitBias,
                                         " tokens"));
      }
      for (const auto& [id_text, bias] : value.items()) {
        int64_t id = 0;
        if (!absl::SimpleAtoi(id_text, &id) || id < 0) {
          return Invalid(key, absl::StrCat("'logit_bias' keys are token ids; got \"",
                                           utf8::ToValidLossy(id_text), "\""));
        }
        if (!bias.is_number() || !(bias.get<double>() >= -100 && bias.get<double>() <= 100)) {
          return Invalid(key, absl::StrCat("'logit_bias' of token ", id,
                                           " must be a number from -100 to 100"));
        }
        request.logit_bias.emplace_back(id, bias.get<double>());
      }
    } else if (key == "echo" && !chat) {
      if (!value.is_boolean()) return Invalid(key, "'echo' must be a boolean");
      request.echo = value.get<bool>();
    } else if (key == "return_tokens_as_token_ids") {
      if (!value.is_boolean()) return Invalid(key, "'return_tokens_as_token_ids' must be a boolean");
      request.return_tokens_as_token_ids = value.get<bool>();
    } else if (key == "ignore_eos") {
      if (!value.is_boolean()) return Invalid(key, "'ignore_eos' must be a boolean");
      request.ignore_eos = value.get<bool>();
    } else if (key == "n") {
      if (!value.is_number_integer() || value.get<int64_t>() < 1 ||
          value.get<int64_t>() > kMaxOpenAiChoices) {
        return Invalid(key, absl::StrCat("'n' must be an integer from 1 to ", kMaxOpenAiChoices));
      }
      request.n = value.get<int64_t>();
    } else if (key == "user") {
      // An end-user id for the caller's own abuse monitoring: nothing to do on a device.
      if (!value.is_string()) return Invalid(key, "'user' must be a string");
    } else if (const std::optional<bool> off = IsOffValue(key, value)) {
      if (!*off) {
        return Invalid(key, absl::StrCat("'", key, "' is not supported by this endpoint"));
      }
    } else {
      return Invalid(key, absl::StrCat("Unrecognized request argument supplied: ", key));
    }
  }
  if (request.model.empty()) return Invalid("model", "'model' is required");
  if (!has_input) {
    return Invalid(input_key, absl::StrCat("'", input_key, "' is required"));
  }
  if (chat_logprobs) {
    request.logprobs = top_logprobs.value_or(0);
  } else if (top_logprobs.value_or(0) > 0) {
    return Invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  }
  if (max_tokens_zero) {
    if (!request.echo) {
      return Invalid("max_tokens", "'max_tokens' 0 needs 'echo': true (scoring the prompt)");
    }
    request.prompt_only = true;
  }
  if (request.echo && request.outline_max_points != 0) {
    return Invalid("echo", "'echo' cannot be combined with 'tophat_outline'");
  }
  if (request.logprobs >= 0 && request.outline_max_points != 0) {
    return Invalid("logprobs", "'logprobs' cannot be combined with 'tophat_outline'");
  }
  if (request.min_tokens > 0 && request.max_tokens > 0 && request.min_tokens > request.max_tokens) {
    return Invalid("min_tokens", absl::StrCat("'min_tokens' ", request.min_tokens,
                                              " is more than 'max_tokens' ", request.max_tokens));
  }
  if (request.tools.empty() && request.tool_choice != ToolChoice::kNone) {
    return Invalid("tool_choice", "'tool_choice' needs 'tools' to choose from");
  }
  if (!request.tools.empty() && !tool_choice_given) request.tool_choice = ToolChoice::kAuto;
  if (request.tool_choice == ToolChoice::kFunction &&
      std::none_of(request.tools.begin(), request.tools.end(), [&](const OpenAiTool& tool) {
        return tool.name == request.tool_choice_function;
      })) {
    return Invalid("tool_choice", absl::StrCat("'tool_choice' names \"",
                                               request.tool_choice_function,
                                               "\", which is not among 'tools'"));
  }
  if (format_keys > 1) {
    return Invalid(format_key,
                   "give the answer's format once: 'response_format' (JSON), "
                   "'structured_outputs', 'guided_regex', 'guided_choice', 'guided_grammar', "
                   "'regex', 'ebnf' or 'grammar'");
  }
  // A regex, a grammar or a structural tag is held to as a JSON format is: the same refusals
  // below.
  const bool json_format = request.json_object || !request.json_schema.empty() ||
                           !request.regex.empty() || !request.answer_choices.empty() ||
                           !request.grammar.empty() || !request.structural_tag.empty();
  // How the refusals name the format.
  const std::string format = format_key == "response_format" && request.structural_tag.empty()
                                 ? "a JSON 'response_format'"
                                 : absl::StrCat("'", format_key, "'");
  if (request.tool_choice != ToolChoice::kNone) {
    if (json_format) {
      return Invalid(format_key, absl::StrCat(format,
                                              " cannot be combined with calling 'tools' "
                                              "(a call's arguments follow its "
                                              "parameters; set 'tool_choice': \"none\")"));
    }
    if (request.outline_max_points != 0) {
      return Invalid("tophat_outline", "'tophat_outline' cannot be combined with calling 'tools'");
    }
  }
  if (request.tool_choice != ToolChoice::kNone && request.min_tokens > 0) {
    return Invalid("min_tokens", "'min_tokens' cannot be combined with calling 'tools' (a "
                                 "call could be complete before it; set 'tool_choice': "
                                 "\"none\")");
  }
  if (json_format && request.outline_max_points != 0) {
    return Invalid(format_key, absl::StrCat(format, " cannot be combined with 'tophat_outline'"));
  }
  if (json_format && request.min_tokens > 0) {
    return Invalid("min_tokens", absl::StrCat("'min_tokens' cannot be combined with ", format,
                                              ": the answer could be complete before it"));
  }
  if (request.n > 1 && request.outline_max_points != 0) {
    return Invalid("n", "'n' above 1 cannot be combined with 'tophat_outline'");
  }
  if (request.prompts.size() > 1 && request.outline_max_points != 0) {
    return Invalid("prompt", "several prompts cannot be combined with 'tophat_outline'");
  }
  if (request.choices() > kMaxOpenAiBatch) {
    return Invalid(request.n > 1 ? "n" : "prompt",
                   absl::StrCat(request.prompts.size(), " prompts x 'n' ", request.n, " are ",
                                request.choices(), " choices, more than ", kMaxOpenAiBatch));
  }
  if (request.include_usage && !request.stream) {
    return Invalid("stream_options", "'stream_options' is only allowed with 'stream': true");
  }
  if (request.model != served_model) return ModelNotFound(request.model, served_model);
  return request;
}

namespace {

using OrderedJson = nlohmann::ordered_json;

// A Responses input item's content: a string, or text parts (input_text, and output_text in
// an earlier answer sent back, with its annotations and logprobs), joined.
std::variant<std::string, OpenAiError> ResponsesText(const OrderedJson& content,
                                                     const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return Invalid(param, absl::StrCat(param, " must be a string or an array of text parts"));
  }
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const OrderedJson& part = content[k];
    const std::string at = absl::StrCat(param, "[", k, "]");
    const OrderedJson type = part.is_object() ? part.value("type", OrderedJson()) : OrderedJson();
    if ((type != "input_text" && type != "output_text") || !part.contains("text") ||
        !part["text"].is_string()) {
      return Invalid(at, absl::StrCat(at,
                                      ": only text parts (input_text, output_text) are "
                                      "supported",
                                      type.is_string() ? absl::StrCat("; got ", type.dump()) : ""));
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// An item may carry only `allowed` keys (null ones are absent).
std::optional<OpenAiError> OnlyKeys(const OrderedJson& item, const std::string& where,
                                    std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : item.items()) {
    if (value.is_null() || std::find(allowed.begin(), allowed.end(), key) != allowed.end()) {
      continue;
    }
    return Invalid(absl::StrCat(where, ".", key),
                   absl::StrCat(where, ".", key, " is not supported by this endpoint"));
  }
  return std::nullopt;
}

// `input`: a string (the user's message) or items: messages ({"role", "content"}, "type":
// "message" optional), function calls an answer made ({"type": "function_call", "call_id",
// "name", "arguments"}) and their results ({"type": "function_call_output", "call_id",
// "output"}), and reasoning items ({"type": "reasoning", "content": [{"type":
// "reasoning_text", "text"}]}: the reasoning of the assistant turn after them). Calls join
// the assistant message before them, as a chat answer holds its text and calls, so that the
// template renders them as a chat completion's.
}  // namespace

std::variant<nlohmann::json, OpenAiError> ParseRequestBody(std::string_view body) {
  return ParseObject(body);
}

std::optional<OpenAiError> CheckMetadata(const nlohmann::ordered_json& metadata) {
  // OpenAI's limits: 16 pairs, keys of up to 64 characters, values of up to 512.
  bool good = metadata.is_object() && metadata.size() <= 16;
  if (good) {
    for (const auto& [name, entry] : metadata.items()) {
      good = good && name.size() <= 64 && entry.is_string() &&
             entry.get_ref<const std::string&>().size() <= 512;
    }
  }
  if (good) return std::nullopt;
  return Invalid("metadata",
                 "'metadata' must be an object of at most 16 strings (keys of up to 64 "
                 "characters, values of up to 512)");
}

std::optional<OpenAiError> ParseResponsesInput(const nlohmann::ordered_json& input,
                                               std::vector<ChatMessage>& messages,
                                               std::string_view field_name) {
  // Debian's Abseil has its own string_view: StrCat takes std::string.
  const std::string field(field_name);
  if (input.is_string()) {
    messages.push_back({.role = "user", .content = input.get<std::string>()});
    return std::nullopt;
  }
  if (!input.is_array() || input.empty()) {
    return Invalid(field,
                   absl::StrCat("'", field, "' must be a string or a non-empty array of items"));
  }
  // A reasoning item's text, for the assistant turn that follows it (an earlier response's
  // output sent back whole: reasoning, then its message or calls).
  std::optional<std::string> reasoning;
  for (size_t i = 0; i < input.size(); ++i) {
    const OrderedJson& item = input[i];
    const std::string where = absl::StrCat(field, "[", i, "]");
    if (!item.is_object()) return Invalid(where, absl::StrCat(where, " must be an object"));
    const OrderedJson type =
        item.contains("type") && !item["type"].is_null() ? item["type"] : OrderedJson("message");
    if (type == "reasoning") {
      if (auto error = OnlyKeys(
              item, where, {"type", "id", "summary", "content", "status", "encrypted_content"})) {
        return error;
      }
      // Its reasoning_text parts (a summary is not what the model wrote).
      const OrderedJson content = item.value("content", OrderedJson::array());
      if (!content.is_array() && !content.is_null()) {
        return Invalid(where + ".content", absl::StrCat(where, ".content must be an array"));
      }
      for (size_t p = 0; content.is_array() && p < content.size(); ++p) {
        const OrderedJson& part = content[p];
        if (!part.is_object() || part.value("type", OrderedJson()) != "reasoning_text" ||
            !part.contains("text") || !part["text"].is_string()) {
          const std::string at = absl::StrCat(where, ".content[", p, "]");
          return Invalid(at, absl::StrCat(at,
                                          " must be {\"type\": \"reasoning_text\", "
                                          "\"text\"}"));
        }
        reasoning = reasoning.value_or("") + part["text"].get<std::string>();
      }
      if (!reasoning) reasoning = "";
      continue;
    }
    if (type == "message") {
      // An earlier answer sent back whole: its id, status and phase mean nothing here.
      if (auto error =
              OnlyKeys(item, where, {"type", "role", "content", "id", "status", "phase"})) {
        return error;
      }
      const OrderedJson role = item.value("role", OrderedJson());
      if (role != "user" && role != "system" && role != "developer" && role != "assistant") {
        return Invalid(where + ".role",
                       absl::StrCat(where,
                                    ".role must be \"user\", \"system\", \"developer\" or "
                                    "\"assistant\""));
      }
      if (!item.contains("content") || item["content"].is_null()) {
        return Invalid(where + ".content", absl::StrCat(where, ".content is required"));
      }
      auto text = ResponsesText(item["content"], where + ".content");
      if (auto* error = std::get_if<OpenAiError>(&text)) return *error;
      messages.push_back({.role = role == "developer" ? "system" : role.get<std::string>(),
                          .content = std::get<std::string>(std::move(text))});
      if (role == "assistant" && reasoning) {
        messages.back().reasoning = std::exchange(reasoning, std::nullopt);
      }
    } else if (type == "function_call") {
      if (auto error =
              OnlyKeys(item, where, {"type", "call_id", "name", "arguments", "id", "status"})) {
        return error;
      }
      const OrderedJson call_id = item.value("call_id", OrderedJson());
      if (!call_id.is_string() || call_id.get<std::string>().empty()) {
        return Invalid(where + ".call_id", absl::StrCat(where, ".call_id is required"));
      }
      if (!IsToolName(item.value("name", OrderedJson()))) {
        return Invalid(where + ".name",
                       absl::StrCat(where, ".name must be 1 to 64 of a-z, A-Z, 0-9, _ and -"));
      }
      const OrderedJson arguments = item.value("arguments", OrderedJson());
      if (!arguments.is_string() ||
          !OrderedJson::parse(arguments.get<std::string>(), nullptr, false).is_object()) {
        return Invalid(where + ".arguments",
                       absl::StrCat(where, ".arguments must be a JSON object, as text"));
      }
      ToolCall call{.id = call_id.get<std::string>(),
                    .name = item["name"].get<std::string>(),
                    .arguments = arguments.get<std::string>()};
      if (messages.empty() || messages.back().role != "assistant") {
        messages.push_back({.role = "assistant"});
        messages.back().reasoning = std::exchange(reasoning, std::nullopt);
      }
      messages.back().tool_calls.push_back(std::move(call));
    } else if (type == "function_call_output") {
      if (auto error = OnlyKeys(item, where, {"type", "call_id", "output", "id", "status"})) {
        return error;
      }
      const OrderedJson call_id = item.value("call_id", OrderedJson());
      if (!call_id.is_string() || call_id.get<std::string>().empty()) {
        return Invalid(where + ".call_id",
                       absl::StrCat(where, ".call_id (the call answered) is required"));
      }
      if (!item.contains("output") || item["output"].is_null()) {
        return Invalid(where + ".output", absl::StrCat(where, ".output is required"));
      }
      auto text = ResponsesText(item["output"], where + ".output");
      if (auto* error = std::get_if<OpenAiError>(&text)) return *error;
      messages.push_back({.role = "tool",
                          .content = std::get<std::string>(std::move(text)),
                          .tool_call_id = call_id.get<std::string>()});
    } else {
      return Invalid(where + ".type", absl::StrCat(where, ".type ", type.dump(),
                                                   " is not supported (message, reasoning, "
                                                   "function_call, function_call_output)"));
    }
  }
  if (messages.empty()) {
    return Invalid(field, absl::StrCat("'", field, "' holds no message, call or call output"));
  }
  return std::nullopt;
}

namespace {

// `text.format` as chat's response_format: {"type": "text"}, {"type": "json_object"},
// {"type": "json_schema", "name", "schema", "description", "strict"} flattened, or tophat's
// {"type": "structural_tag", "structures", "triggers"} as chat takes it.
std::variant<OrderedJson, OpenAiError> ResponsesTextFormat(const OrderedJson& text) {
  if (!text.is_object()) return Invalid("text", "'text' must be an object");
  OrderedJson format = {{"type", "text"}};
  for (const auto& [key, value] : text.items()) {
    if (value.is_null()) continue;
    if (key == "format") {
      format = value;
    } else if (key == "verbosity" && value == "medium") {
      // The default; a model here has no other.
    } else {
      return Invalid(absl::StrCat("text.", key),
                     absl::StrCat("text.", key, " is not supported by this endpoint"));
    }
  }
  if (!format.is_object() || !format.contains("type") || !format["type"].is_string()) {
    return Invalid("text.format",
                   "'text.format' must be an object with a 'type': \"text\", "
                   "\"json_object\", \"json_schema\" or \"structural_tag\"");
  }
  if (format["type"] != "json_schema") return format;
  OrderedJson spec = OrderedJson::object();
  for (const auto& [key, value] : format.items()) {
    if (key != "type") spec[key] = value;
  }
  return OrderedJson{{"type", "json_schema"}, {"json_schema", std::move(spec)}};
}

// A chat parser's error about the fields ParseResponsesRequest renamed, in the Responses
// API's names.
OpenAiError InResponsesTerms(OpenAiError error) {
  const auto rename = [](std::string text) {
    for (const auto& [from, to] : {std::pair<std::string_view, std::string_view>{
                                       "max_completion_tokens", "max_output_tokens"},
                                   {"response_format.json_schema", "text.format"},
                                   {"response_format", "text.format"},
                                   {"].function.", "]."}}) {
      for (size_t at = text.find(from); at != std::string::npos;
           at = text.find(from, at + to.size())) {
        text.replace(at, from.size(), to);
      }
    }
    return text;
  };
  error.param = rename(std::move(error.param));
  error.message = rename(std::move(error.message));
  return error;
}

}  // namespace

std::variant<OpenAiResponsesRequest, OpenAiError> ParseResponsesRequest(
    std::string_view body, std::string_view served_model) {
  auto object = ParseObject(body);
  if (auto* error = std::get_if<OpenAiError>(&object)) return *error;
  // Keys in the order given: tools are rendered as the app wrote them.
  const OrderedJson json = OrderedJson::parse(body);
  OpenAiResponsesRequest out;
  // The chat completion asked for; its messages are the input's, parsed here (a placeholder
  // satisfies the chat parser).
  OrderedJson chat = {{"messages", OrderedJson::array({{{"role", "user"}, {"content", ""}}})}};
  std::vector<ChatMessage> input;
  bool has_input = false;
  bool logprobs_included = false;
  OrderedJson& echo = out.echo;
  echo = {{"background", false},
          {"instructions", nullptr},
          {"max_output_tokens", nullptr},
          {"metadata", OrderedJson::object()},
          {"parallel_tool_calls", true},
          {"previous_response_id", nullptr},
          {"store", true},
          {"temperature", 1.0},
          {"text", {{"format", {{"type", "text"}}}}},
          {"tool_choice", "auto"},
          {"tools", OrderedJson::array()},
          {"top_logprobs", 0},
          {"top_p", 1.0},
          {"truncation", "disabled"},
          {"user", nullptr}};
  for (const auto& [key, value] : json.items()) {
    if (value.is_null()) continue;  // absent
    if (key == "input") {
      has_input = true;
      if (auto error = ParseResponsesInput(value, input, "input")) return *error;
    } else if (key == "instructions") {
      if (!value.is_string()) return Invalid(key, "'instructions' must be a string");
      out.instructions = value.get<std::string>();
      echo[key] = value;
    } else if (key == "previous_response_id") {
      if (!value.is_string() || value.get<std::string>().empty()) {
        return Invalid(key, "'previous_response_id' must be a response's id");
      }
      out.previous_response_id = value.get<std::string>();
      echo[key] = value;
    } else if (key == "conversation") {
      // A conversation's id, or {"id": ...}.
      const OrderedJson id = value.is_object() ? value.value("id", OrderedJson()) : value;
      if (!id.is_string() || id.get<std::string>().empty() ||
          (value.is_object() && value.size() != 1)) {
        return Invalid(key, "'conversation' must be a conversation's id, or {\"id\": ...}");
      }
      out.conversation_id = id.get<std::string>();
      echo[key] = {{"id", out.conversation_id}};
    } else if (key == "store") {
      if (!value.is_boolean()) return Invalid(key, "'store' must be a boolean");
      out.store = value.get<bool>();
      echo[key] = value;
    } else if (key == "metadata") {
      if (auto error = CheckMetadata(value)) return *error;
      echo[key] = value;
    } else if (key == "max_output_tokens") {
      chat["max_completion_tokens"] = value;
      echo[key] = value;
    } else if (key == "text") {
      auto format = ResponsesTextFormat(value);
      if (auto* error = std::get_if<OpenAiError>(&format)) return *error;
      chat["response_format"] = std::get<OrderedJson>(std::move(format));
      echo[key] = value;
    } else if (key == "tools") {
      if (!value.is_array()) return Invalid(key, "'tools' must be an array");
      OrderedJson tools = OrderedJson::array();
      for (size_t t = 0; t < value.size(); ++t) {
        const OrderedJson& tool = value[t];
        const std::string at = absl::StrCat("tools[", t, "]");
        if (!tool.is_object() || tool.value("type", OrderedJson()) != "function") {
          return Invalid(at, absl::StrCat(at,
                                          " must be {\"type\": \"function\", \"name\", "
                                          "\"description\", \"parameters\"}: this agent "
                                          "calls function tools only"));
        }
        OrderedJson function = OrderedJson::object();
        for (const auto& [field, setting] : tool.items()) {
          if (field != "type") function[field] = setting;
        }
        tools.push_back({{"type", "function"}, {"function", std::move(function)}});
      }
      chat[key] = std::move(tools);
      echo[key] = value;
    } else if (key == "tool_choice") {
      if (value.is_object() && value.value("type", OrderedJson()) == "function" &&
          value.size() == 2 && value.contains("name")) {
        chat[key] = {{"type", "function"}, {"function", {{"name", value["name"]}}}};
      } else if (value == "none" || value == "auto" || value == "required") {
        chat[key] = value;
      } else {
        return Invalid(key,
                       "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                       "{\"type\": \"function\", \"name\": ...}");
      }
      echo[key] = value;
    } else if (key == "include") {
      if (!value.is_array()) return Invalid(key, "'include' must be an array of strings");
      for (const OrderedJson& what : value) {
        if (what != "message.output_text.logprobs") {
          return Invalid(key, absl::StrCat("'include' of ", what.dump(),
                                           " is not supported (only "
                                           "\"message.output_text.logprobs\")"));
        }
        logprobs_included = true;
      }
    } else if (key == "top_logprobs") {
      chat[key] = value;
      echo[key] = value;
    } else if (key == "truncation") {
      if (value != "disabled") {
        return Invalid(key,
                       "'truncation' must be \"disabled\": an input longer than the "
                       "context is refused, never cut");
      }
    } else if (key == "reasoning") {
      // {"effort": ..., "summary": null}: the effort as a chat's reasoning_effort. The
      // reasoning comes back whole, never summarized.
      if (!value.is_object()) return Invalid(key, "'reasoning' must be an object");
      for (const auto& [option, setting] : value.items()) {
        if (option == "effort") {
          if (setting.is_null()) continue;
          if (!IsReasoningEffort(setting)) {
            return Invalid(key, absl::StrCat("'reasoning.effort' must be one of ", EffortList()));
          }
          chat["reasoning_effort"] = setting;
        } else if ((option == "summary" || option == "generate_summary") && !setting.is_null()) {
          return Invalid(key, absl::StrCat("'reasoning.", option,
                                           "' must be null: the answer's reasoning comes back "
                                           "whole, in its reasoning item, never summarized"));
        } else if (option != "summary" && option != "generate_summary") {
          return Invalid(
              key, absl::StrCat("'reasoning' has no key '", option, "' (effort and summary)"));
        }
      }
      echo[key] = {{"effort", value.value("effort", OrderedJson())}, {"summary", nullptr}};
    } else if (key == "background") {
      if (!value.is_boolean()) return Invalid(key, "'background' must be a boolean");
      out.background = value.get<bool>();
      echo[key] = value;
    } else if (key == "service_tier") {
      if (value != "auto" && value != "default") {
        return Invalid(key, "'service_tier' must be \"auto\" or \"default\"");
      }
    } else if (key == "prompt_cache_key" || key == "safety_identifier") {
      // A caching hint (the agent matches earlier turns by their token ids anyway) and an
      // end-user id for abuse monitoring: nothing to do with either on a device.
      if (!value.is_string()) return Invalid(key, absl::StrCat("'", key, "' must be a string"));
    } else if (key == "user") {
      chat[key] = value;
      echo[key] = value;
    } else if (key == "temperature" || key == "top_p" || key == "parallel_tool_calls") {
      chat[key] = value;
      echo[key] = value;
    } else if (key == "messages" || key == "prompt" || key == "n" || key == "max_tokens" ||
               key == "max_completion_tokens" || key == "response_format" || key == "logprobs" ||
               key == "stream_options" || key == "tophat_outline" || key == "echo" ||
               key == "best_of" || key == "suffix" || key == "functions" ||
               key == "function_call" || key == "max_tool_calls") {
      // Chat's and completions' fields, and the Responses API's own this agent lacks.
      return Invalid(key, absl::StrCat("'", key, "' is not supported by /v1/responses"));
    } else {
      // model, stream, seed and vLLM's sampling extensions: checked as chat checks them.
      chat[key] = value;
    }
  }
  if (!has_input) return Invalid("input", "'input' is required");
  if (!out.conversation_id.empty() && !out.previous_response_id.empty()) {
    return Invalid("conversation",
                   "'conversation' and 'previous_response_id' cannot be used together: each "
                   "names the turns this one follows");
  }
  if (out.background && !out.store) {
    return Invalid("background",
                   "'background' needs 'store' true: a background response is fetched later");
  }
  // top_logprobs alone asks for them too (what else would it be for).
  if (logprobs_included || chat.contains("top_logprobs")) chat["logprobs"] = true;
  auto parsed = ParseOpenAiRequest(OpenAiEndpoint::kChatCompletions, chat.dump(), served_model);
  if (auto* error = std::get_if<OpenAiError>(&parsed)) return InResponsesTerms(*error);
  out.chat = std::get<OpenAiRequest>(std::move(parsed));
  out.chat.messages = std::move(input);
  return out;
}

absl::StatusOr<ToolCallReader> ToolCallReader::Create(const OpenAiRequest& request,
                                                      ToolCallSyntax syntax) {
  ToolCallReader reader;
  reader.syntax_ = std::move(syntax);
  reader.parallel_ = request.parallel_tool_calls;
  for (size_t t = 0; t < request.tools.size(); ++t) {
    const OpenAiTool& tool = request.tools[t];
    // A named function is the only one its answer may call.
    if (request.tool_choice == ToolChoice::kFunction && tool.name != request.tool_choice_function) {
      continue;
    }
    absl::StatusOr<std::shared_ptr<const CompiledSchema>> compiled =
        CompiledSchema::CompileShared(Json::parse(tool.parameters, nullptr, false));
    if (!compiled.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tools[", t, "].function.parameters: ", compiled.status().message()));
    }
    reader.names_.push_back(tool.name);
    reader.parameters_.push_back(*std::move(compiled));
  }
  return reader;
}

bool ToolCallReader::Accepts(const ToolCall& call) const {
  const size_t index =
      static_cast<size_t>(std::find(names_.begin(), names_.end(), call.name) - names_.begin());
  if (index == names_.size()) return false;
  const Json arguments = Json::parse(call.arguments, nullptr, false);
  return !arguments.is_discarded() &&
         SchemaAccepts(*parameters_[index], parameters_[index]->root(), arguments);
}

ToolCallReading ToolCallReader::Read(std::string_view text) const {
  ToolCallReading reading = ReadToolCalls(text, syntax_, names_);
  for (const ToolCall& call : reading.calls) {
    if (!Accepts(call)) return ToolCallReading{.content = std::string(text), .calls = {}};
  }
  if (!parallel_ && reading.calls.size() > 1) reading.calls.resize(1);
  return reading;
}

ToolCallReading ReadHarmonyCalls(std::span<const HarmonyCall> calls, const ToolCallReader* reader) {
  constexpr std::string_view kNamespace = "functions.";
  ToolCallReading reading;
  bool all_calls = reader != nullptr;
  for (const HarmonyCall& call : calls) {
    reading.content += call.body;
    if (!all_calls) continue;
    const auto arguments = nlohmann::ordered_json::parse(call.body, nullptr, false);
    if (!call.recipient.starts_with(kNamespace) || !arguments.is_object()) {
      all_calls = false;
      continue;
    }
    ToolCall read{.id = "",
                  .name = call.recipient.substr(kNamespace.size()),
                  .arguments = arguments.dump(-1, ' ', false,
                                              nlohmann::ordered_json::error_handler_t::replace)};
    all_calls = reader->Accepts(read);
    if (all_calls) reading.calls.push_back(std::move(read));
  }
  if (!all_calls) {
    reading.calls.clear();
    return reading;
  }
  reading.content.clear();
  if (!reader->parallel() && reading.calls.size() > 1) reading.calls.resize(1);
  return reading;
}

std::string ToolCallHoldback::Push(std::string_view text) {
  text_.append(text);
  if (hold_all_ || holding_) return "";
  size_t end = text_.size();  // what may go out: [sent_, end)
  if (syntax_.start_tag.empty()) {
    // A call is the whole answer: hold while only whitespace came, and all once a '{' did.
    const size_t first = text_.find_first_not_of(" \t\r\n");
    if (first == std::string::npos) return "";
    if (text_[first] == '{') {
      holding_ = true;
      return "";
    }
  } else {
    const size_t tag = text_.find(syntax_.start_tag, sent_);
    if (tag != std::string::npos) {
      holding_ = true;
      end = tag;
    } else {
      // Hold a tail that may begin the tag.
      for (size_t keep = std::min(syntax_.start_tag.size() - 1, text_.size() - sent_); keep > 0;
           --keep) {
        if (std::string_view(text_).substr(text_.size() - keep) ==
            std::string_view(syntax_.start_tag).substr(0, keep)) {
          end = text_.size() - keep;
          break;
        }
      }
    }
  }
  std::string out = text_.substr(sent_, end - sent_);
  sent_ = end;
  return out;
}

std::string StopSequenceFilter::Push(std::string_view text) {
  if (stopped_) return "";
  pending_.append(text);
  size_t first = std::string::npos;
  size_t stop_length = 0;  // of the earliest stop sequence (the first listed, at a tie)
  for (const std::string& stop : stops_) {
    const size_t at = pending_.find(stop);
    if (at < first) {
      first = at;
      stop_length = stop.size();
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first + (include_stop_ ? stop_length : 0));
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that begins some stop sequence.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    for (size_t n = std::min(stop.size() - 1, pending_.size()); n > hold; --n) {
      if (pending_.compare(pending_.size() - n, n, stop, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopSequenceFilter::Flush() {
  std::string out = stopped_ ? "" : std::move(pending_);
  pending_.clear();
  return out;
}

std::variant<TokenizeRequest, OpenAiError> ParseTokenizeRequest(std::string_view body,
                                                                std::string_view served_model) {
  auto object = ParseObject(body);
  if (auto* error = std::get_if<OpenAiError>(&object)) return *error;
  TokenizeRequest request;
  bool has_input = false;
  for (const auto& [key, value] : std::get<Json>(object).items()) {
    if (key == "model") {
      if (auto error = CheckServedModel(value, served_model)) return *error;
    } else if (key == "prompt" && !has_input) {
      if (!value.is_string()) return Invalid(key, "'prompt' must be a string");
      request.prompt = value.get<std::string>();
      has_input = true;
    } else if (key == "messages" && !has_input) {
      if (auto error = ParseMessages(value, request.messages)) return *error;
      has_input = true;
    } else if (key == "add_special_tokens") {
      if (!value.is_boolean()) return Invalid(key, "'add_special_tokens' must be a boolean");
      request.add_special_tokens = value.get<bool>();
    } else if (key == "chat_template_kwargs") {
      if (auto error = ParseChatTemplateKwargs(value, request.chat_options)) return *error;
    } else if (key == "tools") {
      // As a chat completion's: rendered by the template, in the order and key order sent.
      const auto ordered = nlohmann::ordered_json::parse(body)["tools"];
      if (auto error = ParseTools(value, ordered, request.tools)) return *error;
    } else if (key == "add_generation_prompt") {
      // The chat template's rendering always ends with the assistant's header.
      if (!value.is_boolean() || !value.get<bool>()) {
        return Invalid(key, "'add_generation_prompt' can only be true here");
      }
    } else if (key == "prompt" || key == "messages") {
      return Invalid(key, "give 'prompt' or 'messages', not both");
    } else {
      return Invalid(key, absl::StrCat("Unrecognized request argument supplied: ", key));
    }
  }
  if (!has_input) return Invalid("prompt", "'prompt' or 'messages' is required");
  if (!request.tools.empty() && request.messages.empty()) {
    return Invalid("tools", "'tools' are rendered with 'messages' only");
  }
  return request;
}

std::variant<DetokenizeRequest, OpenAiError> ParseDetokenizeRequest(
    std::string_view body, std::string_view served_model) {
  auto object = ParseObject(body);
  if (auto* error = std::get_if<OpenAiError>(&object)) return *error;
  DetokenizeRequest request;
  bool has_tokens = false;
  for (const auto& [key, value] : std::get<Json>(object).items()) {
    if (key == "model") {
      if (auto error = CheckServedModel(value, served_model)) return *error;
    } else if (key == "tokens") {
      auto ids = TokenIds(value);
      if (!ids) {
        return Invalid(key, "'tokens' must be an array of token ids (integers of at least 0)");
      }
      request.tokens = *std::move(ids);
      has_tokens = true;
    } else {
      return Invalid(key, absl::StrCat("Unrecognized request argument supplied: ", key));
    }
  }
  if (!has_tokens) return Invalid("tokens", "'tokens' is required");
  return request;
}

}  // namespace tophat
