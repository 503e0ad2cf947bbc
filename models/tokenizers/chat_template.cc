#include "models/tokenizers/chat_template.h"

#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tophat {

const std::string_view kToyChatTemplateSource =
    "{#- tophat-toy-chat: one 'role: content' line per message, then 'assistant:' -#}\n"
    "{%- for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ 'assistant:' }}{%- endif %}";

namespace {

constexpr std::string_view kToyMarker = "tophat-toy-chat";

// Llama 3.1's template writes these two lines into its system header; date_string defaults
// to this date when the caller gives none (as Hugging Face's rendering does).
constexpr std::string_view kLlama31Preamble =
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";

// A default system message written literally in a ChatML template (Qwen2's "You are a helpful
// assistant."): the text between "<|im_start|>system" and its newline, and "<|im_end|>", when
// it is plain text and not an expression. The newline may be a real one (the JSON string
// decoded) or Jinja's escape.
std::string ChatMlDefaultSystem(std::string_view source) {
  constexpr std::string_view kOpen = "<|im_start|>system";
  size_t from = 0;
  while ((from = source.find(kOpen, from)) != std::string_view::npos) {
    size_t at = from + kOpen.size();
    from = at;
    if (source.substr(at, 1) == "\n") {
      at += 1;
    } else if (source.substr(at, 2) == "\\n") {
      at += 2;
    } else {
      continue;
    }
    const size_t end = source.find("<|im_end|>", at);
    if (end == std::string_view::npos) continue;
    const std::string_view text = source.substr(at, end - at);
    if (text.empty() || text.find_first_of("'\"{}+") != std::string_view::npos) continue;
    return std::string(text);
  }
  return "";
}

void AddText(RenderedChat& chat, std::string_view text) {
  if (text.empty()) return;
  if (!chat.pieces.empty() && !chat.pieces.back().special) {
    chat.pieces.back().text.append(text);
  } else {
    chat.pieces.push_back({.special = false, .text = std::string(text)});
  }
}

void AddSpecial(RenderedChat& chat, std::string_view token) {
  chat.pieces.push_back({.special = true, .text = std::string(token)});
}

// Jinja's trim (Python's str.strip() on these texts).
std::string Trim(std::string_view text) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t first = text.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return "";
  return std::string(text.substr(first, text.find_last_not_of(kSpace) - first + 1));
}

bool Contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

absl::Status BadMessage(size_t index, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("messages[", index, "]: ", std::string(what)));
}

}  // namespace

std::string_view ChatFamilyName(ChatFamily family) {
  switch (family) {
    case ChatFamily::kLlama3:
      return "llama3";
    case ChatFamily::kChatMl:
      return "chatml";
    case ChatFamily::kMistral:
      return "mistral";
    case ChatFamily::kToy:
      return "toy";
  }
  return "unknown";
}

std::string RenderedChat::ToString() const {
  std::string out;
  for (const Piece& piece : pieces) out += piece.text;
  return out;
}

absl::StatusOr<ChatTemplate> ChatTemplate::Load(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(path.string(), " does not exist: the model ships no chat template"));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  if (!in) return absl::DataLossError(absl::StrCat("cannot read ", path.string()));
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(contents.str());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), " is not valid JSON: ", e.what()));
  }
  const auto it = config.is_object() ? config.find("chat_template") : config.end();
  if (!config.is_object() || it == config.end() || it->is_null()) {
    return absl::NotFoundError(absl::StrCat(path.string(), " has no chat_template"));
  }
  if (it->is_string()) return FromSource(it->get<std::string>(), path.string());
  // transformers may save several named templates; "default" is the chat one.
  if (it->is_array()) {
    for (const nlohmann::json& entry : *it) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        return FromSource(entry["template"].get<std::string>(),
                          absl::StrCat(path.string(), " (chat_template \"default\")"));
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        path.string(), ": chat_template is a list with no {\"name\": \"default\", \"template\"}"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path.string(), ": chat_template is neither a string nor a list"));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromSource(std::string_view source,
                                                      std::string_view origin) {
  if (Contains(source, kToyMarker)) {
    return ChatTemplate(ChatFamily::kToy, "", false, true);
  }
  if (Contains(source, "<|start_header_id|>") &&
      Contains(source, "<|end_header_id|>") && Contains(source, "<|eot_id|>")) {
    return ChatTemplate(ChatFamily::kLlama3, "",
                        Contains(source, "Cutting Knowledge Date"), true);
  }
  if (Contains(source, "<|im_start|>") && Contains(source, "<|im_end|>")) {
    return ChatTemplate(ChatFamily::kChatMl, ChatMlDefaultSystem(source), false, true);
  }
  if (Contains(source, "[INST]") && Contains(source, "[/INST]")) {
    return ChatTemplate(ChatFamily::kMistral, "", false, Contains(source, "system"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(origin),
      ": chat_template is none of the families tophat renders (Llama 3: <|start_header_id|> "
      "... <|eot_id|>; ChatML/Qwen2: <|im_start|> ... <|im_end|>; Mistral: [INST] ... "
      "[/INST]; tophat's toy model); it is not guessed"));
}

std::optional<std::string> ChatTemplate::end_of_turn() const {
  switch (family_) {
    case ChatFamily::kLlama3:
      return "<|eot_id|>";
    case ChatFamily::kChatMl:
      return "<|im_end|>";
    case ChatFamily::kMistral:
    case ChatFamily::kToy:
      return std::nullopt;
  }
  return std::nullopt;
}

absl::StatusOr<RenderedChat> ChatTemplate::Render(std::span<const ChatMessage> messages) const {
  RenderedChat chat;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role.empty()) return BadMessage(i, "role is empty");
  }
  switch (family_) {
    case ChatFamily::kLlama3: {
      chat.bos = true;
      size_t first = 0;
      if (llama31_header_) {
        // 3.1 always writes a system header; a leading system message goes into it.
        std::string system;
        if (!messages.empty() && messages[0].role == "system") {
          system = Trim(messages[0].content);
          first = 1;
        }
        AddSpecial(chat, "<|start_header_id|>");
        AddText(chat, "system");
        AddSpecial(chat, "<|end_header_id|>");
        AddText(chat, absl::StrCat("\n\n", std::string(kLlama31Preamble), system));
        AddSpecial(chat, "<|eot_id|>");
      }
      for (size_t i = first; i < messages.size(); ++i) {
        AddSpecial(chat, "<|start_header_id|>");
        AddText(chat, messages[i].role);
        AddSpecial(chat, "<|end_header_id|>");
        AddText(chat, absl::StrCat("\n\n", Trim(messages[i].content)));
        AddSpecial(chat, "<|eot_id|>");
      }
      AddSpecial(chat, "<|start_header_id|>");
      AddText(chat, "assistant");
      AddSpecial(chat, "<|end_header_id|>");
      AddText(chat, "\n\n");
      return chat;
    }
    case ChatFamily::kChatMl: {
      if (!default_system_.empty() && (messages.empty() || messages[0].role != "system")) {
        AddSpecial(chat, "<|im_start|>");
        AddText(chat, absl::StrCat("system\n", default_system_));
        AddSpecial(chat, "<|im_end|>");
        AddText(chat, "\n");
      }
      for (const ChatMessage& message : messages) {
        AddSpecial(chat, "<|im_start|>");
        AddText(chat, absl::StrCat(message.role, "\n", message.content));
        AddSpecial(chat, "<|im_end|>");
        AddText(chat, "\n");
      }
      AddSpecial(chat, "<|im_start|>");
      AddText(chat, "assistant\n");
      return chat;
    }
    case ChatFamily::kMistral: {
      chat.bos = true;
      size_t first = 0;
      std::string system;
      if (!messages.empty() && messages[0].role == "system") {
        if (!system_role_) {
          return BadMessage(0, "this model's chat template (Mistral) has no system role");
        }
        system = messages[0].content;
        first = 1;
      }
      // The system message goes before the last user message, as Mistral's templates that
      // take one place it.
      size_t last_user = messages.size();
      for (size_t i = first; i < messages.size(); ++i) {
        const bool user_turn = (i - first) % 2 == 0;
        if (messages[i].role != "user" && messages[i].role != "assistant") {
          return BadMessage(i, absl::StrCat("role \"", messages[i].role,
                                            "\": Mistral's template takes system (first), user "
                                            "and assistant"));
        }
        if ((messages[i].role == "user") != user_turn) {
          return BadMessage(i, "Mistral's template needs user and assistant turns to alternate, "
                               "starting with user");
        }
        if (user_turn) last_user = i;
      }
      for (size_t i = first; i < messages.size(); ++i) {
        if (messages[i].role == "user") {
          const std::string content = i == last_user && !system.empty()
                                          ? absl::StrCat(system, "\n\n", messages[i].content)
                                          : messages[i].content;
          AddText(chat, absl::StrCat("[INST] ", content, " [/INST]"));
        } else {
          AddText(chat, messages[i].content);
          AddSpecial(chat, "</s>");
        }
      }
      return chat;
    }
    case ChatFamily::kToy: {
      for (const ChatMessage& message : messages) {
        AddText(chat, absl::StrCat(message.role, ": ", message.content, "\n"));
      }
      AddText(chat, "assistant:");
      return chat;
    }
  }
  return absl::InternalError("unknown chat family");
}

absl::StatusOr<std::vector<int32_t>> EncodeChat(const Tokenizer& tokenizer,
                                                const RenderedChat& chat) {
  std::vector<int32_t> ids;
  if (chat.bos) {
    const std::optional<int32_t> bos = tokenizer.bos_id();
    if (!bos) {
      return absl::InvalidArgumentError(
          "the chat template begins with BOS, and the tokenizer has none");
    }
    ids.push_back(*bos);
  }
  for (const RenderedChat::Piece& piece : chat.pieces) {
    if (piece.special) {
      const std::optional<int32_t> id = tokenizer.PieceToId(piece.text);
      if (!id) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the chat template's control token ", piece.text, " is not in the vocabulary"));
      }
      ids.push_back(*id);
      continue;
    }
    absl::StatusOr<std::vector<int32_t>> text = tokenizer.Encode(piece.text, false);
    if (!text.ok()) return text.status();
    ids.insert(ids.end(), text->begin(), text->end());
  }
  return ids;
}

}  // namespace tophat
