// A thinking model's answer split into its reasoning and its content, as vLLM's reasoning
// parsers and DeepSeek's API return them (message.reasoning beside message.content).
//
// Qwen3 (and QwQ, whose prompt opens the block itself) think first: the answer is
// "<think>\n" (Qwen3 writes it, QwQ's prompt holds it) + reasoning + "\n</think>\n\n" +
// content. Everything before the first "</think>" is reasoning, without the opening tag and
// the newlines around it; everything after it is content, without the newlines that start
// it. An answer cut off before "</think>" (max_tokens) is all reasoning: the model was still
// thinking. A later "</think>" is content, as the model wrote it.
#pragma once

#include <string>
#include <string_view>

namespace tophat {

// The tags around a thinking model's reasoning.
struct ReasoningMarkers {
  std::string start = "<think>";
  std::string end = "</think>";
};

// The two parts of an answer, streamed: each Push gives the text that is now known to be
// reasoning or content. Text that may still be the start of a tag, or newlines that may still
// be the ones before "</think>", is held until what follows settles it (at most a tag's
// length plus a run of newlines).
class ReasoningSplitter {
 public:
  struct Parts {
    std::string reasoning;
    std::string content;
  };

  explicit ReasoningSplitter(ReasoningMarkers markers = {});

  Parts Push(std::string_view text);
  // The end of the answer: what was held. A tag begun and not finished is the text it is.
  Parts Flush();

  // Whether the reasoning has ended ("</think>" seen).
  bool in_content() const { return state_ == State::kContent; }

 private:
  enum class State { kOpening, kReasoning, kContent };

  ReasoningMarkers markers_;
  State state_ = State::kOpening;
  std::string held_;                 // text not yet released
  bool reasoning_started_ = false;   // a reasoning byte other than a newline was released
  bool content_started_ = false;     // a content byte other than a newline was released
};

// Python's lstrip('\n') and rstrip('\n'), which the templates and the split trim with.
std::string_view LstripNewlines(std::string_view text);
std::string_view RstripNewlines(std::string_view text);

// The whole answer at once: ReasoningSplitter's parts of `text`.
ReasoningSplitter::Parts SplitReasoning(std::string_view text, const ReasoningMarkers& markers = {});

}  // namespace tophat
