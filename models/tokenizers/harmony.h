// OpenAI's harmony format, gpt-oss's chat layout: what its chat template writes for tools,
// and how its answers are read.
//
// A harmony conversation is a list of messages, each
//   <|start|>ROLE[ to=RECIPIENT]<|channel|>CHANNEL[ <|constrain|>TYPE]<|message|>BODY<|end|>
// where the assistant writes in three channels: `analysis` (its reasoning), `commentary`
// (calls to tools, addressed "to=functions.NAME", and short notes to the user) and `final`
// (the answer). An answer ends with <|return|>, or with <|call|> after a tool call. The
// control tokens are special tokens, which Decode skips, so an answer is read token by token
// (HarmonyReader), not from its text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "models/tokenizers/tokenizer.h"

namespace tophat {

// The tools of a request (each an OpenAI tool, {"type": "function", "function": {...}}, as
// JSON text in the app's key order) as gpt-oss's template declares them to the model: a
// TypeScript namespace, "## functions\n\nnamespace functions {\n\n" ... "} // namespace
// functions", each parameter's JSON schema written as a TypeScript type the way the template
// writes it (its whitespace quirks included, so the prompt is the one transformers renders).
// INVALID_ARGUMENT naming tools[i] for a tool without a description, which the template
// cannot render either.
absl::StatusOr<std::string> HarmonyToolNamespace(std::span<const std::string> tools);

// Python's json.dumps(value, ensure_ascii=False) of a string: `text` in quotes, escaped as
// Python escapes it (the template writes a tool's answer with tojson).
std::string PythonJsonString(std::string_view text);

// The ids of harmony's control tokens in a vocabulary.
struct HarmonyTokens {
  int32_t start = -1;      // <|start|>
  int32_t channel = -1;    // <|channel|>
  int32_t message = -1;    // <|message|>
  int32_t end = -1;        // <|end|>: a message ends, the answer goes on
  int32_t ret = -1;        // <|return|>: the answer ends
  int32_t call = -1;       // <|call|>: the answer ends in a tool call
  int32_t constrain = -1;  // <|constrain|>: the body's type follows (a call's "json")

  // INVALID_ARGUMENT naming the first token `tokenizer` lacks.
  static absl::StatusOr<HarmonyTokens> Find(const Tokenizer& tokenizer);
};

// A message of the answer addressed to a tool ("to=functions.get_weather"), read out.
struct HarmonyCall {
  std::string recipient;  // "functions.get_weather"
  std::string body;       // the arguments, as the model wrote them
};

// Reads an answer streamed token by token: the answer begins inside an assistant message's
// header (the prompt ends with "<|start|>assistant"). Bodies in the analysis channel are
// reasoning; in the final channel, and commentary with no recipient (a note to the user),
// content; a body with a recipient is a call, held until the end (calls()). Headers are never
// text of the answer.
//
// A model that does not write harmony is still read: a header of more than kMaxHeaderBytes
// without <|message|>, or one the answer ends in, was text, and is content. Bodies in a
// channel of no known name are content.
class HarmonyReader {
 public:
  static constexpr size_t kMaxHeaderBytes = 256;

  struct Parts {
    std::string reasoning;
    std::string content;
  };

  explicit HarmonyReader(HarmonyTokens tokens) : tokens_(tokens) {}

  // Token `id`, whose text (what it adds to the answer's decoded text; nothing for a control
  // token) is `text`. The text of no token (what a detokenizer released at the end) is pushed
  // with id -1.
  Parts Push(int32_t id, std::string_view text);
  // The end of the answer: a header it ended in, as content.
  Parts Flush();

  const std::vector<HarmonyCall>& calls() const { return calls_; }
  // Tokens of analysis messages, headers and ends included (usage's reasoning_tokens).
  int64_t reasoning_tokens() const { return reasoning_tokens_; }
  // Whether the answer has ended (<|return|> or <|call|>).
  bool ended() const { return state_ == State::kEnded; }

 private:
  enum class State {
    kHeader,  // between <|start|> (or the answer's start) and <|message|>
    kBody,    // after <|message|>
    kEnded,   // after <|return|> or <|call|>
  };
  enum class Channel { kReasoning, kContent, kCall };

  // The header read so far decides the body's channel.
  void OpenBody();
  // Text of the current message: released by its channel, or held for a call.
  void AddBody(std::string_view text, Parts& out);
  // Ends the current message (a call is kept).
  void CloseBody();
  // A header that was not one: its text is content, and the rest of the message too.
  void HeaderAsContent(Parts& out);
  void ResetHeader();

  HarmonyTokens tokens_;
  State state_ = State::kHeader;
  // The header so far: its text, a space where <|channel|> or <|constrain|> stood (for
  // reading it), and its text alone (what it was, if it was not a header).
  std::string header_;
  std::string header_text_;
  size_t channel_at_ = std::string::npos;  // where in header_ the channel's name begins
  int64_t header_tokens_ = 0;    // tokens of the header so far
  Channel channel_ = Channel::kContent;
  bool reasoning_written_ = false;  // a reasoning message was released (the next is set apart)
  bool reasoning_message_started_ = false;  // the current reasoning message released text
  HarmonyCall call_;             // the call being read (channel_ kCall)
  std::vector<HarmonyCall> calls_;
  int64_t reasoning_tokens_ = 0;
};

}  // namespace tophat
