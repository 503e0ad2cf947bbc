// Chat templates: a conversation (OpenAI-style messages) rendered the way the model was
// trained to read it. Hugging Face checkpoints carry the template as Jinja source in
// tokenizer_config.json ("chat_template"). tophat runs no Jinja: it recognises the common
// families by what the template's source *is* (the control tokens it writes), never by the
// model's name, and renders them here:
//   Llama 3   <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> (3.1's
//             "Cutting Knowledge Date" system header when the template writes one)
//   ChatML    <|im_start|>role\ncontent<|im_end|>\n (Qwen2 and others; a default system
//             message written literally in the template is used)
//   ChatML with <|im_sep|>  <|im_start|>role<|im_sep|>content<|im_end|> (Phi-4)
//   Mistral   <s>[INST] user [/INST]assistant</s>
//   DeepSeek-R1  BOS, the system message, then <｜User｜>user<｜Assistant｜>answer and
//             <｜end▁of▁sentence｜> (its distills of Qwen2.5 and Llama 3 too): a model
//             that thinks, earlier reasoning dropped
//   Gemma     BOS, <start_of_turn>user\ncontent<end_of_turn>\n, the assistant named "model"
//   Phi       <|user|>\ncontent<|end|>\n (Phi-3, Phi-3.5), or without the newlines
//             (Phi-4-mini: <|user|>content<|end|>)
//   harmony   gpt-oss's: <|start|>role<|message|>content<|end|>, a system message of the
//             template's own (the date, the reasoning effort), the caller's system message
//             as the developer's instructions, and answers in channels (harmony.h)
//   toy       the toy model's own plain-text template (`tophat toy-model`)
// Tools (OpenAI's tools, an assistant's tool_calls, "tool" messages) in the layouts of the two
// templates that define one, recognised by the instructions they write: Llama 3.1's JSON
// calls (tools in the first user message, one call a turn, answers as "ipython") and
// Qwen2.5's <tool_call> tags (tools in the system message, several calls a turn); gpt-oss's
// TypeScript namespace and calls in the commentary channel (one call a turn); and the toy
// model's. Other templates refuse tools rather than guess a layout.
// Anything else is an error naming the file: guessing a format silently degrades answers.
//
// The result keeps the template's control tokens apart from the text: content that spells
// "<|im_end|>" is encoded as the characters it is, so a message cannot end its own turn.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "models/tokenizers/reasoning.h"
#include "models/tokenizers/tokenizer.h"

namespace tophat {

enum class ChatFamily {
  kLlama3,
  kChatMl,
  kMistral,
  kToy,
  kDeepSeekR1,
  kGemma,
  kPhi,
  kChatMlImSep,
  kHarmony,
};
std::string_view ChatFamilyName(ChatFamily family);

// A call the assistant made to one of the request's tools (OpenAI's tool_calls[i]).
struct ToolCall {
  std::string id;         // "call_..."; the tool's answer names it (tool_call_id)
  std::string name;       // the function's
  std::string arguments;  // a JSON object, as text
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  // An assistant's reasoning, given apart from its content (OpenAI-style clients send back
  // `reasoning` / `reasoning_content`); a thinking template places it, others drop it.
  // Given (even empty), Qwen3's template takes the content as it is; not given, it takes
  // reasoning left in the content before its "</think>" out of it.
  std::optional<std::string> reasoning;
  std::vector<ToolCall> tool_calls;  // an assistant's calls (content may then be empty)
  std::string tool_call_id;          // a tool's answer: the call it answers
};

// How a family's model writes a tool call, as its template renders past calls: one call is
// `open + name + between + arguments (a JSON object) + close`, and several calls in one
// answer are joined by `separator` (nullopt: one call an answer). A tool's name is 1 to 64
// of [A-Za-z0-9_-], so it needs no escaping. For reading what a model wrote freely
// (tool_choice "auto"): a call starts at `start_tag` and ends at `end_tag` in the answer's
// text (both empty: the whole answer is one call, a JSON object), and its arguments are
// under `arguments_key`.
struct ToolCallSyntax {
  std::string open;
  std::string between;
  std::string close;
  std::optional<std::string> separator;
  std::string start_tag;
  std::string end_tag;
  std::string arguments_key;
};

// A rendered conversation: text, and the template's control tokens between runs of it.
struct RenderedChat {
  struct Piece {
    bool special = false;  // `text` is one control token's spelling (e.g. "<|eot_id|>")
    std::string text;
  };
  bool bos = false;  // the template begins with the tokenizer's BOS
  std::vector<Piece> pieces;
  // Everything as one string, control tokens spelled out (for logs and tests).
  std::string ToString() const;
};

// The source of tophat's toy-model template, as `tophat toy-model` writes it into
// tokenizer_config.json. Recognised by its first line.
extern const std::string_view kToyChatTemplateSource;

// What a request may switch in the template (vLLM's and SGLang's chat_template_kwargs).
struct ChatRenderOptions {
  // Qwen3's enable_thinking: false closes an empty reasoning block in the prompt, so the
  // model answers at once.
  bool enable_thinking = true;
  // gpt-oss's reasoning_effort ("low", "medium", "high"; "" for the template's default,
  // medium), written into its system message.
  std::string reasoning_effort;
  // gpt-oss's "Current date: YYYY-MM-DD"; "" for today's, in local time (as transformers'
  // strftime_now writes it).
  std::string date;
};

// How a template thinks (ChatTemplate::thinking()).
enum class ThinkingStyle {
  kNone,
  // Qwen3: the model opens <think> itself; enable_thinking=false writes an empty block into
  // the prompt; past reasoning is dropped but after the last user message.
  kSwitch,
  // QwQ, DeepSeek-R1: the prompt opens <think> for the model; past reasoning is always
  // dropped.
  kOpened,
  // DeepSeek-R1's first template: the model opens <think> itself, always; past reasoning is
  // dropped.
  kAlways,
};

class ChatTemplate {
 public:
  // The template of a checkpoint directory: tokenizer_config.json's "chat_template" (a string,
  // or a list of {"name", "template"} of which "default" is used). NOT_FOUND when the file or
  // the key is missing, INVALID_ARGUMENT for a template of no known family; both name the file.
  static absl::StatusOr<ChatTemplate> Load(const std::filesystem::path& dir);
  // From template source; `origin` names it in errors (a file, "--chat-template").
  static absl::StatusOr<ChatTemplate> FromSource(std::string_view source,
                                                 std::string_view origin);

  ChatFamily family() const { return family_; }

  // `messages` followed by the opening of the assistant's turn (Hugging Face's
  // add_generation_prompt), with `tools` (each an OpenAI tool, {"type": "function",
  // "function": {...}}, as JSON text whose key order is kept: the template writes it as
  // Python's json.dumps would, as transformers' tojson does). INVALID_ARGUMENT naming the
  // message (messages[i]) for a role the family has no place for, or an order it does not
  // allow; naming tools for a family without a tool layout.
  absl::StatusOr<RenderedChat> Render(std::span<const ChatMessage> messages,
                                      std::span<const std::string> tools = {},
                                      const ChatRenderOptions& options = {}) const;

  // Whether (and how) the model thinks before it answers: templates that write <think> and
  // </think> (ChatML's Qwen3 and QwQ, DeepSeek-R1's).
  ThinkingStyle thinking() const { return thinking_; }
  // Whether a request with `options` has the model think first (its answer starts in its
  // reasoning): a thinking template, and not switched off.
  bool Thinks(const ChatRenderOptions& options) const {
    return thinking_ == ThinkingStyle::kOpened || thinking_ == ThinkingStyle::kAlways ||
           (thinking_ == ThinkingStyle::kSwitch && options.enable_thinking);
  }

  // Whether the template renders tools, calls and their answers.
  bool takes_tools() const { return tools_; }
  // How this model writes a tool call, as text; nullopt where its template has no tool layout
  // tophat renders, or calls are not text (harmony's, read by HarmonyReader).
  std::optional<ToolCallSyntax> tool_call_syntax() const;

  // The control tokens that end an assistant turn ("<|eot_id|>", "<|im_end|>"; harmony's
  // <|return|> and <|call|>); none where the tokenizer's EOS does (Mistral) or the family
  // has none (toy).
  std::vector<std::string> turn_ends() const;

 private:
  ChatTemplate(ChatFamily family, std::string default_system, bool llama31_header,
               bool system_role, bool tools, ThinkingStyle thinking = ThinkingStyle::kNone)
      : family_(family),
        default_system_(std::move(default_system)),
        llama31_header_(llama31_header),
        system_role_(system_role),
        tools_(tools),
        thinking_(thinking) {}

  // gpt-oss's conversation (harmony.h).
  absl::StatusOr<RenderedChat> RenderHarmony(std::span<const ChatMessage> messages,
                                             std::span<const std::string> tools,
                                             const ChatRenderOptions& options) const;
  // ChatML's assistant message i of `messages` as a thinking template renders it.
  absl::Status AddThinkingAssistant(RenderedChat& chat, std::span<const ChatMessage> messages,
                                    size_t i, size_t last_query) const;

  ChatFamily family_;
  std::string default_system_;   // ChatML: system message used when none is given
  bool llama31_header_ = false;  // Llama 3.1: the "Cutting Knowledge Date" system header
  bool system_role_ = true;      // Mistral: whether the template places a system message
  bool tools_ = false;           // the template has a tool layout tophat renders
  ThinkingStyle thinking_ = ThinkingStyle::kNone;
  bool bos_ = false;           // Phi: the template begins with BOS (Phi-3's first one)
  bool role_newline_ = false;  // Phi: a newline after each role tag and <|end|> (Phi-3)
};

// What an answer says once its tool calls are read out (OpenAI's message.content and
// message.tool_calls).
struct ToolCallReading {
  std::string content;  // the text outside the calls
  std::vector<ToolCall> calls;  // ids left empty: the caller names them
};
// Reads the calls a model wrote in `syntax` from its answer's `text` (tool_choice "auto":
// the model chose freely). Each call must be a JSON object naming one of `names` with an
// object of arguments; if any fails to read, the whole text is content and there are no
// calls (the model wrote something else), as vLLM's parsers do. Arguments come back as
// compact JSON, their key order kept.
ToolCallReading ReadToolCalls(std::string_view text, const ToolCallSyntax& syntax,
                              std::span<const std::string> names);

// Token ids of a rendered conversation: BOS (if the template begins with it), each control
// token by its spelling in the vocabulary, and each run of text encoded as plain text.
// INVALID_ARGUMENT naming a control token the vocabulary lacks, or a BOS it has none of.
absl::StatusOr<std::vector<int32_t>> EncodeChat(const Tokenizer& tokenizer,
                                                const RenderedChat& chat);

}  // namespace tophat
