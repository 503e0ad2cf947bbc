#include "models/tokenizers/chat_template.h"

#include <algorithm>
#include <ctime>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/tokenizers/harmony.h"
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

// Python's json.dumps(value, ensure_ascii=False, indent=indent) (transformers' tojson filter):
// ", " and ": " between items when compact (indent < 0), a newline and `indent` spaces a
// level otherwise. Scalars are written as nlohmann writes them, which for the values a
// request holds is how Python writes them. Request bodies nest at most 256 deep
// (kMaxRequestNesting), so the recursion is bounded.
void AppendPythonJson(const nlohmann::ordered_json& value, int indent, int level,
                      std::string& out) {
  const bool object = value.is_object();
  if (!object && !value.is_array()) {
    out += value.dump(-1, ' ', /*ensure_ascii=*/false,
                      nlohmann::ordered_json::error_handler_t::replace);
    return;
  }
  if (value.empty()) {
    out += object ? "{}" : "[]";
    return;
  }
  const std::string inner =
      indent < 0 ? "" : "\n" + std::string(static_cast<size_t>(indent * (level + 1)), ' ');
  out += object ? '{' : '[';
  bool first = true;
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (!first) out += indent < 0 ? ", " : ",";
    first = false;
    out += inner;
    if (object) {
      out += nlohmann::ordered_json(it.key()).dump(-1, ' ', false,
                                                  nlohmann::ordered_json::error_handler_t::replace);
      out += ": ";
    }
    AppendPythonJson(*it, indent, level + 1, out);
  }
  if (indent >= 0) out += "\n" + std::string(static_cast<size_t>(indent * level), ' ');
  out += object ? '}' : ']';
}

std::string PythonJson(const nlohmann::ordered_json& value, int indent = -1) {
  std::string out;
  AppendPythonJson(value, indent, 0, out);
  return out;
}

// A JSON text of the request's (a tool, a call's arguments) as the template writes it; the
// text was checked when the request was read, so a failure here names `what` for the log.
absl::StatusOr<std::string> PythonJsonText(std::string_view text, int indent,
                                           std::string_view what) {
  const auto value = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), " is not JSON"));
  }
  return PythonJson(value, indent);
}

// Each family's call layout, as its template renders a past call (the model was trained to
// write the same).
ToolCallSyntax HermesSyntax() {
  return {.open = "<tool_call>\n{\"name\": \"",
          .between = "\", \"arguments\": ",
          .close = "}\n</tool_call>",
          .separator = "\n",
          .start_tag = "<tool_call>",
          .end_tag = "</tool_call>",
          .arguments_key = "arguments"};
}
ToolCallSyntax Llama31Syntax() {
  return {.open = "{\"name\": \"",
          .between = "\", \"parameters\": ",
          .close = "}",
          .separator = std::nullopt,
          .start_tag = "",
          .end_tag = "",
          .arguments_key = "parameters"};
}
ToolCallSyntax ToySyntax() {
  return {.open = "<tool_call>{\"name\": \"",
          .between = "\", \"arguments\": ",
          .close = "}</tool_call>",
          .separator = " ",
          .start_tag = "<tool_call>",
          .end_tag = "</tool_call>",
          .arguments_key = "arguments"};
}

// One call in `syntax`, its arguments as the template writes them (tojson).
absl::StatusOr<std::string> RenderCall(const ToolCallSyntax& syntax, const ToolCall& call,
                                       size_t message, size_t index) {
  auto arguments = PythonJsonText(
      call.arguments, -1, absl::StrCat("messages[", message, "].tool_calls[", index, "].function.arguments"));
  if (!arguments.ok()) return arguments.status();
  return absl::StrCat(syntax.open, call.name, syntax.between, *arguments, syntax.close);
}

// Llama 3.1's and Qwen2.5's instructions, as their templates write them; also how they are
// recognised.
constexpr std::string_view kLlama31ToolPrompt =
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\nRespond in the format "
    "{\"name\": function name, \"parameters\": dictionary of argument name and its "
    "value}.Do not use variables.\n\n";
constexpr std::string_view kLlama31ToolMarker = "Given the following functions, please respond";
constexpr std::string_view kHermesToolHeader =
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr std::string_view kHermesToolFooter =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
constexpr std::string_view kHermesToolMarker =
    "You may call one or more functions to assist with the user query.";

// DeepSeek-R1's control tokens (fullwidth bars, and U+2581 for its spaces).
constexpr std::string_view kDeepSeekUser = "<｜User｜>";
constexpr std::string_view kDeepSeekAssistant = "<｜Assistant｜>";
constexpr std::string_view kDeepSeekEnd = "<｜end▁of▁sentence｜>";

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
    case ChatFamily::kDeepSeekR1:
      return "deepseek_r1";
    case ChatFamily::kGemma:
      return "gemma";
    case ChatFamily::kPhi:
      return "phi";
    case ChatFamily::kChatMlImSep:
      return "chatml_im_sep";
    case ChatFamily::kHarmony:
      return "harmony";
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
      if (entry.is_object() && entry.value("name", nlohmann::json()) == "default" && entry.contains("template") &&
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
    return ChatTemplate(ChatFamily::kToy, "", false, true, /*tools=*/true);
  }
  if (Contains(source, "<|start|>") && Contains(source, "<|channel|>") &&
      Contains(source, "<|message|>")) {
    // gpt-oss's: harmony's messages and channels. Its builtin tools (browser, python) are a
    // kwarg tophat does not take.
    return ChatTemplate(ChatFamily::kHarmony, "", false, true, /*tools=*/true);
  }
  if (Contains(source, "<|start_header_id|>") &&
      Contains(source, "<|end_header_id|>") && Contains(source, "<|eot_id|>")) {
    const bool llama31 = Contains(source, "Cutting Knowledge Date");
    return ChatTemplate(ChatFamily::kLlama3, "", llama31, true,
                        llama31 && Contains(source, kLlama31ToolMarker));
  }
  if (Contains(source, kDeepSeekUser) && Contains(source, kDeepSeekAssistant)) {
    // DeepSeek-R1's (and its distills'): history keeps what follows an answer's </think>;
    // the generation prompt opens <think> and a newline (a Jinja escape in the source, or a
    // real one), or, in the first release's template, leaves the model to. DeepSeek's templates
    // that do not think (V2.5, V3) differ in more than that, and are not guessed.
    if (!Contains(source, "</think>")) {
      return absl::InvalidArgumentError(absl::StrCat(
          std::string(origin),
          ": chat_template writes <｜User｜> and <｜Assistant｜> but no </think>: only "
          "DeepSeek-R1's template (and its distills') is rendered; it is not guessed"));
    }
    const bool opens = Contains(source, std::string(kDeepSeekAssistant) + "<think>\\n") ||
                       Contains(source, std::string(kDeepSeekAssistant) + "<think>\n");
    return ChatTemplate(ChatFamily::kDeepSeekR1, "", false, true, /*tools=*/false,
                        opens ? ThinkingStyle::kOpened : ThinkingStyle::kAlways);
  }
  if (Contains(source, "<|im_start|>") && Contains(source, "<|im_sep|>") &&
      Contains(source, "<|im_end|>")) {
    // Phi-4's: the role and the content parted by <|im_sep|>, nothing between turns.
    // Phi-4-reasoning's writes a thinking instruction of its own, not rendered.
    if (Contains(source, "<think>")) {
      return absl::InvalidArgumentError(absl::StrCat(
          std::string(origin),
          ": chat_template writes <|im_sep|> and <think>: only Phi-4's template without "
          "reasoning is rendered in that layout; it is not guessed"));
    }
    return ChatTemplate(ChatFamily::kChatMlImSep, "", false, true, false);
  }
  if (Contains(source, "<|im_start|>") && Contains(source, "<|im_end|>")) {
    // A thinking template: Qwen3's switches with enable_thinking; QwQ's opens the block in
    // the prompt (its generation prompt is the literal below, Jinja's \n escapes and all).
    ThinkingStyle thinking = ThinkingStyle::kNone;
    if (Contains(source, "<think>") && Contains(source, "</think>")) {
      if (Contains(source, "enable_thinking")) {
        thinking = ThinkingStyle::kSwitch;
      } else if (Contains(source, "assistant\\n<think>\\n") ||
                 Contains(source, "assistant\n<think>\n")) {
        thinking = ThinkingStyle::kOpened;
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            std::string(origin),
            ": chat_template writes <think> and </think> in neither known layout (Qwen3's "
            "enable_thinking switch; QwQ's prompt that opens <think>); it is not guessed"));
      }
    }
    // Qwen3's template writes Qwen2.5's tool instructions and calls, without a default
    // system message; QwQ's in a layout of its own, not rendered.
    return ChatTemplate(ChatFamily::kChatMl, ChatMlDefaultSystem(source), false, true,
                        Contains(source, kHermesToolMarker) && thinking != ThinkingStyle::kOpened,
                        thinking);
  }
  if (Contains(source, "<start_of_turn>") && Contains(source, "<end_of_turn>")) {
    // Gemma 3's template opens the first turn with a system message; Gemma 2's (and Gemma
    // 1's) raises "System role not supported".
    return ChatTemplate(ChatFamily::kGemma, "", false,
                        !Contains(source, "System role not supported"), false);
  }
  if (Contains(source, "[INST]") && Contains(source, "[/INST]")) {
    return ChatTemplate(ChatFamily::kMistral, "", false, Contains(source, "system"), false);
  }
  if (Contains(source, "<|end|>") && Contains(source, "<|assistant|>")) {
    // Phi-3's templates write '<|assistant|>\n' (or '<|assistant|>' + '\n'), Phi-4-mini's
    // '<|' + role + '|>' with no newline; Phi-3's first one dropped system messages. Tools
    // (Phi-4-mini's <|tool|> layout) are not rendered.
    ChatTemplate phi(ChatFamily::kPhi, "", false, Contains(source, "system"), false);
    phi.bos_ = Contains(source, "bos_token");
    for (const char* spelling : {"<|assistant|>\n", "<|assistant|>\\n", "<|assistant|>' + '\n'",
                                 "<|assistant|>' + '\\n'"}) {
      phi.role_newline_ = phi.role_newline_ || Contains(source, spelling);
    }
    return phi;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(origin),
      ": chat_template is none of the families tophat renders (Llama 3: <|start_header_id|> "
      "... <|eot_id|>; ChatML/Qwen2: <|im_start|> ... <|im_end|> (Phi-4: with <|im_sep|>); "
      "Mistral: [INST] ... "
      "[/INST]; Gemma: <start_of_turn> ... <end_of_turn>; Phi: <|user|> ... <|end|>; "
      "DeepSeek-R1: <｜User｜> ... <｜Assistant｜>; gpt-oss: <|start|> ... <|channel|> ... "
      "<|message|>; tophat's toy model); it is not guessed"));
}

std::vector<std::string> ChatTemplate::turn_ends() const {
  switch (family_) {
    case ChatFamily::kLlama3:
      return {"<|eot_id|>"};
    case ChatFamily::kChatMl:
    case ChatFamily::kChatMlImSep:
      return {"<|im_end|>"};
    case ChatFamily::kGemma:
      return {"<end_of_turn>"};
    case ChatFamily::kPhi:
      return {"<|end|>"};
    case ChatFamily::kHarmony:
      // <|end|> ends a message, not the answer: the final one may follow the reasoning.
      return {"<|return|>", "<|call|>"};
    case ChatFamily::kMistral:
    case ChatFamily::kToy:
    case ChatFamily::kDeepSeekR1:
      return {};
  }
  return {};
}

std::optional<ToolCallSyntax> ChatTemplate::tool_call_syntax() const {
  if (!tools_) return std::nullopt;
  switch (family_) {
    case ChatFamily::kLlama3:
      return Llama31Syntax();
    case ChatFamily::kChatMl:
      return HermesSyntax();
    case ChatFamily::kToy:
      return ToySyntax();
    case ChatFamily::kMistral:
    case ChatFamily::kDeepSeekR1:
    case ChatFamily::kGemma:
    case ChatFamily::kPhi:
    case ChatFamily::kChatMlImSep:
    case ChatFamily::kHarmony:
      return std::nullopt;
  }
  return std::nullopt;
}

absl::Status ChatTemplate::AddThinkingAssistant(RenderedChat& chat,
                                                std::span<const ChatMessage> messages, size_t i,
                                                size_t last_query) const {
  const ChatMessage& message = messages[i];
  std::string content = message.content;
  std::string reasoning = message.reasoning.value_or("");
  // Reasoning left in the content is taken out of it, as the templates do: QwQ's always keeps
  // content.split('</think>')[-1].lstrip('\n'); Qwen3's does when no reasoning was given
  // apart, the reasoning then the text before the first '</think>' after its last '<think>',
  // newlines trimmed.
  const size_t end = content.find("</think>");
  if (end != std::string::npos && (thinking_ == ThinkingStyle::kOpened || !message.reasoning)) {
    if (!message.reasoning) {
      std::string_view before = RstripNewlines(std::string_view(content).substr(0, end));
      if (const size_t start = before.rfind("<think>"); start != std::string_view::npos) {
        before.remove_prefix(start + std::string_view("<think>").size());
      }
      reasoning = LstripNewlines(before);
    }
    // A copy first: the view is into `content`.
    content = std::string(LstripNewlines(std::string_view(content).substr(
        content.rfind("</think>") + std::string_view("</think>").size())));
  }
  // Its calls, as Qwen3 writes them: each on a line of its own, the first right after the
  // content when there is none.
  std::string calls;
  if (!message.tool_calls.empty()) {
    const std::optional<ToolCallSyntax> syntax = tool_call_syntax();
    for (size_t c = 0; c < message.tool_calls.size(); ++c) {
      absl::StatusOr<std::string> call = RenderCall(*syntax, message.tool_calls[c], i, c);
      if (!call.ok()) return call.status();
      absl::StrAppend(&calls, c == 0 && content.empty() ? "" : "\n", *call);
    }
  }
  AddSpecial(chat, "<|im_start|>");
  // Qwen3 keeps the reasoning of the turns after the last user message (a tool-using turn
  // in progress), and the last message's block even when empty.
  const bool last = i + 1 == messages.size();
  if (thinking_ == ThinkingStyle::kSwitch && i > last_query && (last || !reasoning.empty())) {
    AddText(chat, "assistant\n");
    AddSpecial(chat, "<think>");
    AddText(chat, absl::StrCat("\n", std::string(LstripNewlines(RstripNewlines(reasoning))), "\n"));
    AddSpecial(chat, "</think>");
    AddText(chat, absl::StrCat("\n\n", std::string(LstripNewlines(content)), calls));
  } else {
    AddText(chat, absl::StrCat("assistant\n", content, calls));
  }
  AddSpecial(chat, "<|im_end|>");
  AddText(chat, "\n");
  return absl::OkStatus();
}

absl::StatusOr<RenderedChat> ChatTemplate::Render(std::span<const ChatMessage> messages,
                                                  std::span<const std::string> tools,
                                                  const ChatRenderOptions& options) const {
  RenderedChat chat;
  bool any_tool = !tools.empty();
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role.empty()) return BadMessage(i, "role is empty");
    any_tool = any_tool || !messages[i].tool_calls.empty() || messages[i].role == "tool";
  }
  if (any_tool && !tools_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tools: this model's chat template (", std::string(ChatFamilyName(family_)),
        ") has no tool-call layout tophat renders (Llama 3.1's, Qwen2.5's and gpt-oss's do); "
        "tools, tool calls and tool messages are refused rather than written in a guessed "
        "layout"));
  }
  const std::optional<ToolCallSyntax> syntax = tool_call_syntax();
  std::vector<std::string> tool_texts;
  for (size_t t = 0; t < tools.size(); ++t) {
    // Llama 3.1 writes each tool indented by 4, the others compact.
    auto text = PythonJsonText(tools[t], family_ == ChatFamily::kLlama3 ? 4 : -1,
                               absl::StrCat("tools[", t, "]"));
    if (!text.ok()) return text.status();
    tool_texts.push_back(*std::move(text));
  }
  // An assistant's calls, joined as the family joins them.
  const auto calls_text = [&](size_t i, std::string_view before) -> absl::StatusOr<std::string> {
    std::string out;
    for (size_t c = 0; c < messages[i].tool_calls.size(); ++c) {
      auto call = RenderCall(*syntax, messages[i].tool_calls[c], i, c);
      if (!call.ok()) return call.status();
      absl::StrAppend(&out, c == 0 ? std::string(before) : *syntax->separator, *call);
    }
    return out;
  };
  switch (family_) {
    case ChatFamily::kHarmony:
      return RenderHarmony(messages, tools, options);
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
        AddText(chat, absl::StrCat("\n\n", tools.empty() ? "" : "Environment: ipython\n",
                                   std::string(kLlama31Preamble), system));
        AddSpecial(chat, "<|eot_id|>");
      }
      if (!tools.empty()) {
        // The tools go into the first message after the system's, under a user header.
        if (first == messages.size()) {
          return absl::InvalidArgumentError(
              "tools: Llama 3.1's template puts them in the first user message, and there is "
              "none");
        }
        std::string text(kLlama31ToolPrompt);
        for (const std::string& tool : tool_texts) absl::StrAppend(&text, tool, "\n\n");
        AddSpecial(chat, "<|start_header_id|>");
        AddText(chat, "user");
        AddSpecial(chat, "<|end_header_id|>");
        AddText(chat, absl::StrCat("\n\n", text, Trim(messages[first].content)));
        AddSpecial(chat, "<|eot_id|>");
        ++first;
      }
      for (size_t i = first; i < messages.size(); ++i) {
        std::string role = messages[i].role;
        std::string content = absl::StrCat("\n\n", Trim(messages[i].content));
        if (!messages[i].tool_calls.empty()) {
          if (messages[i].tool_calls.size() != 1) {
            return BadMessage(i, "Llama 3.1's template takes one tool call a message");
          }
          auto call = calls_text(i, "");
          if (!call.ok()) return call.status();
          content = absl::StrCat("\n\n", *call);
        } else if (role == "tool") {
          // The template writes a string answer with tojson, quoted.
          role = "ipython";
          content = absl::StrCat("\n\n", PythonJson(nlohmann::ordered_json(messages[i].content)));
        }
        AddSpecial(chat, "<|start_header_id|>");
        AddText(chat, role);
        AddSpecial(chat, "<|end_header_id|>");
        AddText(chat, content);
        AddSpecial(chat, "<|eot_id|>");
      }
      AddSpecial(chat, "<|start_header_id|>");
      AddText(chat, "assistant");
      AddSpecial(chat, "<|end_header_id|>");
      AddText(chat, "\n\n");
      return chat;
    }
    case ChatFamily::kChatMl: {
      const bool leading_system = !messages.empty() && messages[0].role == "system";
      if (!tools.empty()) {
        // Qwen2.5: the tools follow the system message (or the default) in one turn. Qwen3:
        // the system message and a blank line when there is one, else the tools alone.
        std::string_view header = kHermesToolHeader;
        std::string system = leading_system ? messages[0].content : default_system_;
        if (thinking_ == ThinkingStyle::kSwitch && system.empty()) header.remove_prefix(2);
        std::string text = absl::StrCat("system\n", system, std::string(header));
        for (const std::string& tool : tool_texts) absl::StrAppend(&text, "\n", tool);
        text += std::string(kHermesToolFooter);
        AddSpecial(chat, "<|im_start|>");
        AddText(chat, text);
        AddSpecial(chat, "<|im_end|>");
        AddText(chat, "\n");
      } else if (!default_system_.empty() && !leading_system) {
        AddSpecial(chat, "<|im_start|>");
        AddText(chat, absl::StrCat("system\n", default_system_));
        AddSpecial(chat, "<|im_end|>");
        AddText(chat, "\n");
      }
      // Qwen3's last query: the last user message (tools, whose answers would be user turns
      // too, are refused for thinking templates).
      size_t last_query = messages.empty() ? 0 : messages.size() - 1;
      for (size_t i = messages.size(); i-- > 0;) {
        const std::string& content = messages[i].content;
        if (messages[i].role == "user" &&
            !(content.starts_with("<tool_response>") && content.ends_with("</tool_response>"))) {
          last_query = i;
          break;
        }
      }
      for (size_t i = !tools.empty() && leading_system ? 1 : 0; i < messages.size(); ++i) {
        const ChatMessage& message = messages[i];
        if (thinking_ != ThinkingStyle::kNone && message.role == "assistant") {
          if (absl::Status added = AddThinkingAssistant(chat, messages, i, last_query);
              !added.ok()) {
            return added;
          }
          continue;
        }
        if (message.role == "tool") {
          // A run of answers shares one user turn.
          if (i == 0 || messages[i - 1].role != "tool") {
            AddSpecial(chat, "<|im_start|>");
            AddText(chat, "user");
          }
          AddText(chat, absl::StrCat("\n<tool_response>\n", message.content, "\n</tool_response>"));
          if (i + 1 == messages.size() || messages[i + 1].role != "tool") {
            AddSpecial(chat, "<|im_end|>");
            AddText(chat, "\n");
          }
          continue;
        }
        AddSpecial(chat, "<|im_start|>");
        if (message.tool_calls.empty()) {
          AddText(chat, absl::StrCat(message.role, "\n", message.content));
        } else {
          auto calls = calls_text(i, "\n");
          if (!calls.ok()) return calls.status();
          AddText(chat, absl::StrCat(message.role, message.content.empty() ? "" : "\n",
                                     message.content, *calls));
        }
        AddSpecial(chat, "<|im_end|>");
        AddText(chat, "\n");
      }
      AddSpecial(chat, "<|im_start|>");
      AddText(chat, "assistant\n");
      if (thinking_ == ThinkingStyle::kOpened) {
        AddSpecial(chat, "<think>");
        AddText(chat, "\n");
      } else if (thinking_ == ThinkingStyle::kSwitch && !options.enable_thinking) {
        AddSpecial(chat, "<think>");
        AddText(chat, "\n\n");
        AddSpecial(chat, "</think>");
        AddText(chat, "\n\n");
      }
      return chat;
    }
    case ChatFamily::kDeepSeekR1: {
      // BOS, then the last system message wherever it stands, as bare text; then the turns.
      chat.bos = true;
      const std::string* system_text = nullptr;
      for (const ChatMessage& message : messages) {
        if (message.role == "system") system_text = &message.content;
      }
      if (system_text) AddText(chat, *system_text);
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& message = messages[i];
        if (message.role == "system") continue;
        if (message.role == "user") {
          AddSpecial(chat, kDeepSeekUser);
          AddText(chat, message.content);
        } else if (message.role == "assistant") {
          // What follows its last </think>, newlines and all: earlier reasoning is dropped,
          // given apart or left in the content.
          std::string_view content = message.content;
          if (const size_t end = content.rfind("</think>"); end != std::string_view::npos) {
            content.remove_prefix(end + std::string_view("</think>").size());
          }
          AddSpecial(chat, kDeepSeekAssistant);
          AddText(chat, content);
          AddSpecial(chat, kDeepSeekEnd);
        } else {
          return BadMessage(i, absl::StrCat("role \"", message.role,
                                            "\": DeepSeek-R1's template places system, user and "
                                            "assistant messages only"));
        }
      }
      AddSpecial(chat, kDeepSeekAssistant);
      if (thinking_ == ThinkingStyle::kOpened) {
        AddSpecial(chat, "<think>");
        AddText(chat, "\n");
      }
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
    case ChatFamily::kGemma: {
      // BOS; a leading system message's text, and two newlines, open the first turn;
      // turns alternate from user, the assistant's named "model", each one's content
      // trimmed; then the model's turn is opened.
      chat.bos = true;
      size_t first = 0;
      std::string prefix;
      if (!messages.empty() && messages[0].role == "system") {
        if (!system_role_) {
          return BadMessage(0, "this model's chat template (Gemma 2's) has no system role");
        }
        prefix = absl::StrCat(messages[0].content, "\n\n");
        first = 1;
      }
      for (size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& message = messages[i];
        if (message.role != "user" && message.role != "assistant") {
          return BadMessage(i, absl::StrCat("role \"", message.role,
                                            "\": Gemma's template takes system (first), user "
                                            "and assistant"));
        }
        if ((message.role == "user") != ((i - first) % 2 == 0)) {
          return BadMessage(i,
                            "Gemma's template needs user and assistant turns to alternate, "
                            "starting with user");
        }
        AddSpecial(chat, "<start_of_turn>");
        AddText(chat, absl::StrCat(message.role == "assistant" ? "model" : "user", "\n",
                                   i == first ? prefix : "", Trim(message.content)));
        AddSpecial(chat, "<end_of_turn>");
        AddText(chat, "\n");
      }
      AddSpecial(chat, "<start_of_turn>");
      AddText(chat, "model\n");
      return chat;
    }
    case ChatFamily::kChatMlImSep: {
      // Each message as <|im_start|>role<|im_sep|>content<|im_end|>, in the order given,
      // nothing between them; then the assistant's start. Phi-4's template writes system,
      // user and assistant messages and drops any other.
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& message = messages[i];
        if (message.role != "system" && message.role != "user" && message.role != "assistant") {
          return BadMessage(i, absl::StrCat("role \"", message.role,
                                            "\": Phi-4's template takes system, user and "
                                            "assistant"));
        }
        AddSpecial(chat, "<|im_start|>");
        AddText(chat, message.role);
        AddSpecial(chat, "<|im_sep|>");
        AddText(chat, message.content);
        AddSpecial(chat, "<|im_end|>");
      }
      AddSpecial(chat, "<|im_start|>");
      AddText(chat, "assistant");
      AddSpecial(chat, "<|im_sep|>");
      return chat;
    }
    case ChatFamily::kPhi: {
      // Each message as <|role|>, its content and <|end|> (with a newline after the tag and
      // after <|end|> in Phi-3's), in the order given; then the assistant's tag.
      chat.bos = bos_;
      const std::string newline = role_newline_ ? "\n" : "";
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& message = messages[i];
        if (message.role != "system" && message.role != "user" && message.role != "assistant") {
          return BadMessage(i, absl::StrCat("role \"", message.role,
                                            "\": Phi's template takes system, user and "
                                            "assistant"));
        }
        if (message.role == "system" && !system_role_) {
          return BadMessage(i, "this model's chat template (Phi) has no system role");
        }
        AddSpecial(chat, absl::StrCat("<|", message.role, "|>"));
        AddText(chat, absl::StrCat(newline, message.content));
        AddSpecial(chat, "<|end|>");
        if (!newline.empty()) AddText(chat, newline);
      }
      AddSpecial(chat, "<|assistant|>");
      if (!newline.empty()) AddText(chat, newline);
      return chat;
    }
    case ChatFamily::kToy: {
      // tophat's own layout: the tools on a line of their own, calls in the toy's syntax.
      if (!tools.empty()) {
        AddText(chat, absl::StrCat("tools: [", absl::StrJoin(tool_texts, ", "), "]\n"));
      }
      for (size_t i = 0; i < messages.size(); ++i) {
        auto calls = calls_text(i, messages[i].content.empty() ? "" : " ");
        if (!calls.ok()) return calls.status();
        AddText(chat, absl::StrCat(messages[i].role, ": ", messages[i].content, *calls, "\n"));
      }
      AddText(chat, "assistant:");
      return chat;
    }
  }
  return absl::InternalError("unknown chat family");
}

absl::StatusOr<RenderedChat> ChatTemplate::RenderHarmony(std::span<const ChatMessage> messages,
                                                         std::span<const std::string> tools,
                                                         const ChatRenderOptions& options) const {
  // gpt-oss's template (openai/gpt-oss-20b's chat_template.jinja): its own system message,
  // the caller's first system (or developer) message and the tools as the developer's,
  // then the turns; earlier reasoning dropped but for a tool call's with no answer after it.
  RenderedChat chat;
  const auto message = [&chat](std::string_view header, std::string_view channel,
                               std::string_view body, std::string_view end) {
    AddSpecial(chat, "<|start|>");
    AddText(chat, header);
    if (!channel.empty()) {
      AddSpecial(chat, "<|channel|>");
      AddText(chat, channel);
    }
    AddSpecial(chat, "<|message|>");
    AddText(chat, body);
    AddSpecial(chat, end);
  };
  std::string date = options.date;
  if (date.empty()) {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char text[16];
    date.assign(text, std::strftime(text, sizeof(text), "%Y-%m-%d", &local));
  }
  message("system", "",
          absl::StrCat("You are ChatGPT, a large language model trained by OpenAI.\n"
                       "Knowledge cutoff: 2024-06\nCurrent date: ",
                       date, "\n\nReasoning: ",
                       options.reasoning_effort.empty() ? "medium" : options.reasoning_effort,
                       "\n\n# Valid channels: analysis, commentary, final. Channel must be "
                       "included for every message.",
                       tools.empty() ? ""
                                     : "\nCalls to these tools must go to the commentary "
                                       "channel: 'functions'."),
          "<|end|>");
  size_t first = 0;
  std::string developer;
  if (!messages.empty() && messages[0].role == "system") {
    developer = messages[0].content;
    first = 1;
  }
  if (!developer.empty() || !tools.empty()) {
    std::string body;
    if (!developer.empty()) absl::StrAppend(&body, "# Instructions\n\n", developer, "\n\n");
    if (!tools.empty()) {
      absl::StatusOr<std::string> declared = HarmonyToolNamespace(tools);
      if (!declared.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("tools: ", declared.status().message()));
      }
      absl::StrAppend(&body, "# Tools\n\n", *declared);
    }
    message("developer", "", body, "<|end|>");
  }
  // A tool's answer names the call it answers by the last call's function.
  std::optional<std::string> last_call;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& turn = messages[i];
    if (turn.role == "user") {
      message("user", "", turn.content, "<|end|>");
    } else if (turn.role == "assistant" && turn.tool_calls.empty()) {
      message("assistant", "final", turn.content, "<|end|>");
      last_call.reset();
    } else if (turn.role == "assistant") {
      if (turn.tool_calls.size() > 1) {
        return BadMessage(i, "gpt-oss's template writes one tool call an assistant message; give "
                             "each call a message of its own");
      }
      const std::string reasoning = turn.reasoning.value_or("");
      if (!turn.content.empty() && !reasoning.empty()) {
        return BadMessage(i, "content and reasoning both given beside a tool call: gpt-oss's "
                             "template takes the call's reasoning in one or the other");
      }
      // The call's reasoning is kept while no answer follows it.
      bool answered = false;
      for (size_t j = i + 1; j < messages.size(); ++j) {
        answered = answered || (messages[j].role == "assistant" && messages[j].tool_calls.empty());
      }
      const std::string& analysis = turn.content.empty() ? reasoning : turn.content;
      if (!analysis.empty() && !answered) message("assistant", "analysis", analysis, "<|end|>");
      const ToolCall& call = turn.tool_calls[0];
      absl::StatusOr<std::string> arguments = PythonJsonText(
          call.arguments, -1, absl::StrCat("messages[", i, "].tool_calls[0].function.arguments"));
      if (!arguments.ok()) return arguments.status();
      message(absl::StrCat("assistant to=functions.", call.name), "commentary json", *arguments,
              "<|call|>");
      last_call = call.name;
    } else if (turn.role == "tool") {
      if (!last_call) {
        return BadMessage(i, "a tool's answer with no assistant tool call before it (gpt-oss's "
                             "template names the tool from the call)");
      }
      message(absl::StrCat("functions.", *last_call, " to=assistant"), "commentary",
              PythonJsonString(turn.content), "<|end|>");
    }
    // A system message after the first is not written, as the template writes none.
  }
  AddSpecial(chat, "<|start|>");
  AddText(chat, "assistant");
  return chat;
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

namespace {

// One call's JSON object: {"name": one of `names`, arguments_key (or "arguments"): {...}}.
std::optional<ToolCall> ReadOneCall(std::string_view text, const ToolCallSyntax& syntax,
                                    std::span<const std::string> names) {
  const auto value = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!value.is_object() || !value.contains("name") || !value["name"].is_string()) {
    return std::nullopt;
  }
  const std::string name = value["name"].get<std::string>();
  if (std::find(names.begin(), names.end(), name) == names.end()) return std::nullopt;
  auto arguments = value.find(syntax.arguments_key);
  if (arguments == value.end()) arguments = value.find("arguments");
  if (arguments == value.end() || !arguments->is_object()) return std::nullopt;
  return ToolCall{.id = "",
                  .name = name,
                  .arguments = arguments->dump(-1, ' ', false,
                                               nlohmann::ordered_json::error_handler_t::replace)};
}

}  // namespace

ToolCallReading ReadToolCalls(std::string_view text, const ToolCallSyntax& syntax,
                              std::span<const std::string> names) {
  ToolCallReading none{.content = std::string(text), .calls = {}};
  if (syntax.start_tag.empty()) {
    // The whole answer is one call, or none.
    std::optional<ToolCall> call = ReadOneCall(Trim(text), syntax, names);
    if (!call) return none;
    return ToolCallReading{.content = "", .calls = {*std::move(call)}};
  }
  size_t at = text.find(syntax.start_tag);
  if (at == std::string_view::npos) return none;
  ToolCallReading reading{.content = Trim(text.substr(0, at)), .calls = {}};
  while (at != std::string_view::npos) {
    const size_t body = at + syntax.start_tag.size();
    const size_t end = text.find(syntax.end_tag, body);
    if (end == std::string_view::npos) return none;
    std::optional<ToolCall> call = ReadOneCall(text.substr(body, end - body), syntax, names);
    if (!call) return none;
    reading.calls.push_back(*std::move(call));
    const size_t after = end + syntax.end_tag.size();
    at = text.find(syntax.start_tag, after);
    // Between and after the calls only whitespace: anything else is not a list of calls.
    const std::string_view rest =
        text.substr(after, at == std::string_view::npos ? std::string_view::npos : at - after);
    if (!Trim(rest).empty()) return none;
  }
  return reading;
}

}  // namespace tophat
