#include "models/tokenizers/reasoning.h"

#include <algorithm>
#include <utility>

namespace tophat {
namespace {

// The length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialTagAtEnd(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

std::string_view LstripNewlines(std::string_view text) {
  return text.substr(std::min(text.find_first_not_of('\n'), text.size()));
}

std::string_view RstripNewlines(std::string_view text) {
  const size_t last = text.find_last_not_of('\n');
  return text.substr(0, last == std::string_view::npos ? 0 : last + 1);
}

ReasoningSplitter::ReasoningSplitter(ReasoningMarkers markers) : markers_(std::move(markers)) {}

ReasoningSplitter::Parts ReasoningSplitter::Push(std::string_view text) {
  Parts out;
  held_.append(text);
  if (state_ == State::kOpening) {
    // Newlines, then perhaps the opening tag (Qwen3 writes it; QwQ's prompt held it).
    const size_t first = held_.find_first_not_of('\n');
    if (first == std::string::npos) return out;
    const std::string_view rest = std::string_view(held_).substr(first);
    if (rest.size() < markers_.start.size() &&
        markers_.start.compare(0, rest.size(), rest) == 0) {
      return out;  // may yet be the tag
    }
    held_.erase(0, first);
    if (held_.compare(0, markers_.start.size(), markers_.start) == 0) {
      held_.erase(0, markers_.start.size());
    }
    state_ = State::kReasoning;
  }
  if (state_ == State::kReasoning) {
    const size_t end = held_.find(markers_.end);
    std::string reasoning;
    if (end != std::string::npos) {
      // The newlines before the tag are the layout's, not the reasoning's.
      reasoning = RstripNewlines(std::string_view(held_).substr(0, end));
      held_.erase(0, end + markers_.end.size());
      state_ = State::kContent;
    } else {
      // Release all but a partial tag at the end and the newlines just before it.
      size_t keep = PartialTagAtEnd(held_, markers_.end);
      const size_t before = held_.size() - keep;
      const size_t last = held_.find_last_not_of('\n', before == 0 ? 0 : before - 1);
      const size_t release = last == std::string::npos || before == 0 ? 0 : last + 1;
      reasoning = held_.substr(0, release);
      held_.erase(0, release);
    }
    if (!reasoning_started_)
      reasoning.erase(0, reasoning.size() - LstripNewlines(reasoning).size());
    reasoning_started_ = reasoning_started_ || !reasoning.empty();
    out.reasoning = std::move(reasoning);
  }
  if (state_ == State::kContent) {
    if (!content_started_) {
      held_.erase(0, held_.size() - LstripNewlines(held_).size());
      content_started_ = !held_.empty();
    }
    out.content = std::move(held_);
    held_.clear();
  }
  return out;
}

ReasoningSplitter::Parts ReasoningSplitter::Flush() {
  Parts out;
  switch (state_) {
    case State::kOpening:
      // A tag begun and not finished is reasoning text; newlines alone are nothing.
      out.reasoning = LstripNewlines(held_);
      break;
    case State::kReasoning:
      // Cut off while thinking: a partial end tag is text; the newlines before it are kept
      // only when something follows them.
      if (!LstripNewlines(held_).empty()) {
        out.reasoning = reasoning_started_ ? held_ : std::string(LstripNewlines(held_));
      }
      break;
    case State::kContent:
      out.content = std::move(held_);
      break;
  }
  held_.clear();
  return out;
}

ReasoningSplitter::Parts SplitReasoning(std::string_view text, const ReasoningMarkers& markers) {
  ReasoningSplitter splitter(markers);
  ReasoningSplitter::Parts parts = splitter.Push(text);
  ReasoningSplitter::Parts tail = splitter.Flush();
  parts.reasoning += tail.reasoning;
  parts.content += tail.content;
  return parts;
}

}  // namespace tophat
