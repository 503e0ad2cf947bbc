#include "models/tokenizers/harmony.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tophat {
namespace {

using OrderedJson = nlohmann::ordered_json;

std::string Dump(const OrderedJson& value) {
  return value.dump(-1, ' ', /*ensure_ascii=*/false, OrderedJson::error_handler_t::replace);
}

// Jinja's truth of a value: present, and not false, zero, empty or null.
bool Truthy(const OrderedJson* value) {
  if (value == nullptr || value->is_null()) return false;
  if (value->is_boolean()) return value->get<bool>();
  if (value->is_number()) return value->get<double>() != 0;
  if (value->is_string() || value->is_array() || value->is_object()) return !value->empty();
  return true;
}

const OrderedJson* Field(const OrderedJson& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(std::string(key));
  return it == object.end() ? nullptr : &*it;
}

// `value == text` in Jinja: a string equal to it.
bool Is(const OrderedJson* value, std::string_view text) {
  return value != nullptr && value->is_string() && value->get<std::string>() == text;
}

// Jinja's `+` of a string and a value the template expects to be a string: its text.
std::string Text(const OrderedJson& value) {
  return value.is_string() ? value.get<std::string>() : Dump(value);
}

// The template's render_typescript_type macro, its whitespace as Jinja (transformers'
// trim_blocks and lstrip_blocks) leaves it: a property of a nested object is preceded by a
// newline and 16 spaces, a oneOf's variants are parted by " | \n", and a variant's default by
// 20 spaces, because the template's `{{ }}` there do not trim. Schemas nest at most as deep
// as a request body (kMaxRequestNesting), so the recursion is bounded.
std::string TypeScriptType(const OrderedJson& spec) {
  const OrderedJson* type = Field(spec, "type");
  const bool nullable = Truthy(Field(spec, "nullable"));
  const std::string null_suffix = nullable ? " | null" : "";
  if (Is(type, "array")) {
    const OrderedJson* items = Field(spec, "items");
    if (items == nullptr) return "any[]" + null_suffix;
    const OrderedJson* item_type = Field(*items, "type");
    std::string out;
    if (Is(item_type, "string")) {
      out = "string[]";
    } else if (Is(item_type, "number") || Is(item_type, "integer")) {
      out = "number[]";
    } else if (Is(item_type, "boolean")) {
      out = "boolean[]";
    } else {
      const std::string inner = TypeScriptType(*items);
      out = inner == "object | object" || inner.size() > 50 ? "any[]" : inner + "[]";
    }
    return out + null_suffix;
  }
  if (type != nullptr && type->is_array() && !type->empty()) {
    // A list of types (Union[dict, list] and the like); Jinja joins their texts.
    std::string out;
    for (size_t i = 0; i < type->size(); ++i) {
      absl::StrAppend(&out, i == 0 ? "" : " | ", Text((*type)[i]));
    }
    return out;
  }
  if (const OrderedJson* one_of = Field(spec, "oneOf"); Truthy(one_of) && one_of->is_array()) {
    // The template means to write "any" for unions of objects, but its flag is set inside
    // the loop, where Jinja scopes it away: every union is written out.
    std::string out;
    for (size_t i = 0; i < one_of->size(); ++i) {
      const OrderedJson& variant = (*one_of)[i];
      out += TypeScriptType(variant);
      if (const OrderedJson* description = Field(variant, "description"); Truthy(description)) {
        absl::StrAppend(&out, "// ", Text(*description));
      }
      if (const OrderedJson* fallback = Field(variant, "default")) {
        absl::StrAppend(&out, std::string(20, ' '), "// default: ", Dump(*fallback));
      }
      if (i + 1 < one_of->size()) out += " | \n";
    }
    return out;
  }
  if (Is(type, "string")) {
    if (const OrderedJson* values = Field(spec, "enum"); Truthy(values) && values->is_array()) {
      std::string out = "\"";
      for (size_t i = 0; i < values->size(); ++i) {
        absl::StrAppend(&out, i == 0 ? "" : "\" | \"", Text((*values)[i]));
      }
      return out + "\"";
    }
    return "string" + null_suffix;
  }
  if (Is(type, "number") || Is(type, "integer")) return "number";
  if (Is(type, "boolean")) return "boolean";
  if (Is(type, "object")) {
    const OrderedJson* properties = Field(spec, "properties");
    if (!Truthy(properties) || !properties->is_object()) return "object";
    const OrderedJson* required = Field(spec, "required");
    std::string out = "{\n";
    bool first = true;
    for (auto it = properties->begin(); it != properties->end(); ++it) {
      if (!first) out += ", ";
      first = false;
      const bool needed = required != nullptr && required->is_array() &&
                          std::find(required->begin(), required->end(), it.key()) != required->end();
      absl::StrAppend(&out, it.key(), needed ? "" : "?", ": \n", std::string(16, ' '),
                      TypeScriptType(*it));
    }
    return out + "}";
  }
  return "any";
}

}  // namespace

std::string PythonJsonString(std::string_view text) {
  return Dump(OrderedJson(std::string(text)));
}

absl::StatusOr<std::string> HarmonyToolNamespace(std::span<const std::string> tools) {
  std::string out = "## functions\n\nnamespace functions {\n\n";
  for (size_t t = 0; t < tools.size(); ++t) {
    const std::string where = absl::StrCat("tools[", t, "]");
    const OrderedJson tool = OrderedJson::parse(tools[t], nullptr, /*allow_exceptions=*/false);
    const OrderedJson* function = Field(tool, "function");
    if (function == nullptr || !function->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has no function"));
    }
    const OrderedJson* description = Field(*function, "description");
    if (description == nullptr || description->is_null()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".function.description: gpt-oss's chat template writes each tool's "
                 "description above it, and this tool has none"));
    }
    const OrderedJson* name = Field(*function, "name");
    absl::StrAppend(&out, "// ", Text(*description), "\ntype ",
                    name != nullptr ? Text(*name) : "", " = ");
    const OrderedJson* parameters = Field(*function, "parameters");
    const OrderedJson* properties =
        Truthy(parameters) ? Field(*parameters, "properties") : nullptr;
    if (!Truthy(properties) || !properties->is_object()) {
      out += "() => any;\n\n";
      continue;
    }
    const OrderedJson* required = Field(*parameters, "required");
    out += "(_: {\n";
    for (auto it = properties->begin(); it != properties->end(); ++it) {
      const OrderedJson& spec = *it;
      if (const OrderedJson* about = Field(spec, "description"); Truthy(about)) {
        absl::StrAppend(&out, "// ", Text(*about), "\n");
      }
      const bool needed = required != nullptr && required->is_array() &&
                          std::find(required->begin(), required->end(), it.key()) != required->end();
      absl::StrAppend(&out, it.key(), needed ? "" : "?", ": ", TypeScriptType(spec));
      if (const OrderedJson* fallback = Field(spec, "default")) {
        // An enum's and a union's default as its text, any other as JSON.
        if (Truthy(Field(spec, "enum"))) {
          absl::StrAppend(&out, ", // default: ", Text(*fallback));
        } else if (Truthy(Field(spec, "oneOf"))) {
          absl::StrAppend(&out, "// default: ", Text(*fallback));
        } else {
          absl::StrAppend(&out, ", // default: ", Dump(*fallback));
        }
      }
      out += ",\n";
    }
    out += "}) => any;\n\n";
  }
  return out + "} // namespace functions";
}

absl::StatusOr<HarmonyTokens> HarmonyTokens::Find(const Tokenizer& tokenizer) {
  HarmonyTokens tokens;
  const std::pair<std::string_view, int32_t*> wanted[] = {
      {"<|start|>", &tokens.start},   {"<|channel|>", &tokens.channel},
      {"<|message|>", &tokens.message}, {"<|end|>", &tokens.end},
      {"<|return|>", &tokens.ret},    {"<|call|>", &tokens.call},
      {"<|constrain|>", &tokens.constrain}};
  for (const auto& [spelling, id] : wanted) {
    const std::optional<int32_t> found = tokenizer.PieceToId(spelling);
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the chat template is gpt-oss's harmony format, and the tokenizer has no ",
          std::string(spelling), " token"));
    }
    *id = *found;
  }
  return tokens;
}

void HarmonyReader::OpenBody() {
  // The recipient: "to=NAME" in the role's part or the channel's; the channel: the first
  // word after <|channel|>.
  std::string recipient;
  if (const size_t to = header_.find("to="); to != std::string::npos) {
    const size_t from = to + 3;
    const size_t until = header_.find_first_of(" \t\n", from);
    recipient = header_.substr(from, until == std::string::npos ? std::string::npos : until - from);
  }
  std::string channel;
  if (channel_at_ != std::string::npos) {
    const size_t from = header_.find_first_not_of(" \t\n", channel_at_);
    if (from != std::string::npos) {
      const size_t until = header_.find_first_of(" \t\n", from);
      channel = header_.substr(from, until == std::string::npos ? std::string::npos : until - from);
    }
  }
  if (!recipient.empty() && recipient != "user" && recipient != "all") {
    channel_ = Channel::kCall;
    call_ = HarmonyCall{.recipient = std::move(recipient), .body = ""};
  } else {
    channel_ = channel == "analysis" ? Channel::kReasoning : Channel::kContent;
  }
  if (channel_ == Channel::kReasoning) reasoning_tokens_ += header_tokens_;
  reasoning_message_started_ = false;
  ResetHeader();
  state_ = State::kBody;
}

void HarmonyReader::AddBody(std::string_view text, Parts& out) {
  if (text.empty()) return;
  switch (channel_) {
    case Channel::kReasoning:
      // Messages of reasoning one after another are parted by a blank line.
      if (!reasoning_message_started_ && reasoning_written_) out.reasoning += "\n\n";
      out.reasoning.append(text);
      reasoning_message_started_ = true;
      reasoning_written_ = true;
      return;
    case Channel::kContent:
      out.content.append(text);
      return;
    case Channel::kCall:
      call_.body.append(text);
      return;
  }
}

void HarmonyReader::CloseBody() {
  if (channel_ == Channel::kCall) calls_.push_back(std::move(call_));
  call_ = {};
  channel_ = Channel::kContent;
}

void HarmonyReader::HeaderAsContent(Parts& out) {
  out.content += header_text_;
  ResetHeader();
  channel_ = Channel::kContent;
  reasoning_message_started_ = false;
  state_ = State::kBody;
}

void HarmonyReader::ResetHeader() {
  header_.clear();
  header_text_.clear();
  channel_at_ = std::string::npos;
  header_tokens_ = 0;
}

HarmonyReader::Parts HarmonyReader::Push(int32_t id, std::string_view text) {
  Parts out;
  if (state_ == State::kEnded) return out;
  const bool counted = state_ == State::kBody && channel_ == Channel::kReasoning;
  if (id >= 0 && counted) ++reasoning_tokens_;
  if (id == tokens_.ret || id == tokens_.call) {
    if (state_ == State::kBody) CloseBody();
    if (state_ == State::kHeader) HeaderAsContent(out);
    state_ = State::kEnded;
    return out;
  }
  if (id == tokens_.end || id == tokens_.start) {
    // A message ends (<|start|> with no <|end|> before it ends one too); a header begins.
    if (state_ == State::kBody) CloseBody();
    if (state_ == State::kHeader && id == tokens_.start && !header_text_.empty()) {
      HeaderAsContent(out);
    }
    if (state_ == State::kBody) {
      state_ = State::kHeader;
      ResetHeader();
    }
    if (id == tokens_.start) ++header_tokens_;
    return out;
  }
  if (state_ == State::kBody && id == tokens_.channel) {
    // A channel named with no <|end|><|start|> before it: a new message's header.
    CloseBody();
    state_ = State::kHeader;
    ResetHeader();
  }
  if (state_ == State::kHeader) {
    // A <|channel|> that ended a message of reasoning was counted there.
    if (id >= 0 && !counted) ++header_tokens_;
    if (id == tokens_.message) {
      OpenBody();
      return out;
    }
    if (id == tokens_.channel) {
      header_ += ' ';
      channel_at_ = header_.size();
      return out;
    }
    if (id == tokens_.constrain) {
      header_ += ' ';
      return out;
    }
    header_.append(text);
    header_text_.append(text);
    if (header_text_.size() > kMaxHeaderBytes) HeaderAsContent(out);
    return out;
  }
  if (id == tokens_.message || id == tokens_.constrain) return out;  // stray: nothing to show
  AddBody(text, out);
  return out;
}

HarmonyReader::Parts HarmonyReader::Flush() {
  Parts out;
  if (state_ == State::kHeader && !header_text_.empty()) HeaderAsContent(out);
  if (state_ == State::kBody) CloseBody();
  state_ = State::kEnded;
  return out;
}

}  // namespace tophat
