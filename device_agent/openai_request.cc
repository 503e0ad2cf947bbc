#include "device_agent/openai_request.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/json_depth.h"
#include "models/grammar/json_schema.h"
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
  if (key == "tools" || key == "functions") return value.is_array() && value.empty();
  if (key == "suffix") return value.is_string() && value.get<std::string>().empty();
  // No "off" value but absence.
  if (key == "tool_choice" || key == "function_call" ||
      key == "parallel_tool_calls") {
    return false;
  }
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
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
          !part["text"].is_string()) {
        return Invalid(param, absl::StrCat(param, ": only text content parts are supported"));
      }
      text += part["text"].get<std::string>();
    }
    return text;
  }
  return Invalid(param, absl::StrCat(param, " must be a string or an array of text parts"));
}

std::optional<OpenAiError> ParseMessages(const Json& value, std::vector<ChatMessage>& messages) {
  if (!value.is_array() || value.empty()) {
    return Invalid("messages", "'messages' must be a non-empty array");
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const Json& message = value[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!message.is_object()) return Invalid(where, absl::StrCat(where, " must be an object"));
    for (const auto& [key, field] : message.items()) {
      if (key != "role" && key != "content" && !(key == "name" && field.is_null())) {
        return Invalid(absl::StrCat(where, ".", key),
                       absl::StrCat(where, ".", key, " is not supported by this endpoint"));
      }
    }
    if (!message.contains("role") || !message["role"].is_string()) {
      return Invalid(absl::StrCat(where, ".role"), absl::StrCat(where, ".role is required"));
    }
    std::string role = message["role"].get<std::string>();
    // OpenAI's newer name for the system role.
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant") {
      return Invalid(absl::StrCat(where, ".role"),
                     absl::StrCat(where, ".role \"", role,
                                  "\" is not supported (system, developer, user, assistant)"));
    }
    if (!message.contains("content") || message["content"].is_null()) {
      return Invalid(absl::StrCat(where, ".content"),
                     absl::StrCat(where, ".content is required"));
    }
    auto content = MessageContent(message["content"], i);
    if (auto* error = std::get_if<OpenAiError>(&content)) return *error;
    messages.push_back({.role = std::move(role),
                        .content = std::get<std::string>(std::move(content))});
  }
  return std::nullopt;
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
      CompiledSchema::Compile(spec["schema"]);
  if (!compiled.ok()) {
    return Invalid(kKey, absl::StrCat("'response_format.json_schema.schema' ",
                                      compiled.status().message()));
  }
  return text;
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
          "'response_format' must be an object with a 'type': \"text\", \"json_object\" or "
          "\"json_schema\"";
      if (!value.is_object() || !value.contains("type") || !value["type"].is_string()) {
        return Invalid(key, kShape);
      }
      const std::string type = value["type"].get<std::string>();
      if (type != "text" && type != "json_object" && type != "json_schema") {
        return Invalid(key, kShape);
      }
      for (const auto& [field, unused] : value.items()) {
        if (field != "type" && !(type == "json_schema" && field == "json_schema")) {
          return Invalid(key, absl::StrCat("'response_format' of type \"", type,
                                           "\" has no field '", field, "'"));
        }
      }
      request.json_object = type == "json_object";
      if (type == "json_schema") {
        std::variant<std::string, OpenAiError> schema = ParseJsonSchemaFormat(value);
        if (auto* error = std::get_if<OpenAiError>(&schema)) return *error;
        request.json_schema = std::get<std::string>(std::move(schema));
      }
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
  const bool json_format = request.json_object || !request.json_schema.empty();
  if (json_format && request.outline_max_points != 0) {
    return Invalid("response_format", "a JSON 'response_format' cannot be combined with "
                                      "'tophat_outline'");
  }
  if (json_format && request.min_tokens > 0) {
    return Invalid("min_tokens", "'min_tokens' cannot be combined with a JSON "
                                 "'response_format': the object could be complete before it");
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
