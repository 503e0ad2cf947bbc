#include "models/tokenizers/reasoning.h"

#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace tophat {
namespace {

using Parts = ReasoningSplitter::Parts;

// The answer fed in pieces cut at every place (each byte alone, then random cuts): the parts
// must be those of the whole.
Parts Streamed(const std::string& text, const std::vector<size_t>& cuts) {
  ReasoningSplitter splitter;
  Parts all;
  size_t from = 0;
  for (size_t cut : cuts) {
    Parts parts = splitter.Push(std::string_view(text).substr(from, cut - from));
    all.reasoning += parts.reasoning;
    all.content += parts.content;
    from = cut;
  }
  Parts parts = splitter.Push(std::string_view(text).substr(from));
  all.reasoning += parts.reasoning;
  all.content += parts.content;
  Parts tail = splitter.Flush();
  all.reasoning += tail.reasoning;
  all.content += tail.content;
  return all;
}

TEST_CASE("A thinking answer splits at the first </think>, tags and their newlines dropped",
          "[reasoning]") {
  struct Case {
    std::string text;
    std::string reasoning;
    std::string content;
  };
  const std::vector<Case> cases = {
      // Qwen3 writes the opening tag; QwQ's prompt held it.
      {"<think>\nWeigh 9.11 and 9.8.\n</think>\n\n9.8 is greater.", "Weigh 9.11 and 9.8.",
       "9.8 is greater."},
      {"Weigh them.\n</think>\n\n9.8", "Weigh them.", "9.8"},
      // Thinking switched off in the prompt is not this splitter's (nothing is split then);
      // an empty block the model writes itself is empty reasoning.
      {"<think>\n\n</think>\n\nHi", "", "Hi"},
      // Cut off while thinking: all reasoning; a partial end tag is text.
      {"<think>\nstill going\n\n", "still going", ""},
      {"<think>\nstill going</thi", "still going</thi", ""},
      // Newlines inside either part are kept; a second </think> is content.
      {"<think>\na\n\nb\n</think>\n\nc\n\nd </think> e", "a\n\nb", "c\n\nd </think> e"},
      // Tags that are not at the start are text.
      {"x <think> y</think>z", "x <think> y", "z"},
      {"<thin", "<thin", ""},
      {"", "", ""},
      {"\n\n", "", ""},
  };
  std::mt19937 rng(5);
  for (const Case& c : cases) {
    INFO("text: " << c.text);
    const Parts whole = SplitReasoning(c.text);
    CHECK(whole.reasoning == c.reasoning);
    CHECK(whole.content == c.content);
    std::vector<size_t> every;
    for (size_t i = 1; i < c.text.size(); ++i) every.push_back(i);
    const Parts bytewise = Streamed(c.text, every);
    CHECK(bytewise.reasoning == c.reasoning);
    CHECK(bytewise.content == c.content);
    for (int trial = 0; trial < 50 && c.text.size() > 1; ++trial) {
      std::vector<size_t> cuts;
      for (size_t i = 1; i < c.text.size(); ++i) {
        if (rng() % 3 == 0) cuts.push_back(i);
      }
      const Parts random = Streamed(c.text, cuts);
      CHECK(random.reasoning == c.reasoning);
      CHECK(random.content == c.content);
    }
  }
}

TEST_CASE("A streamed thinking answer releases reasoning and content as soon as they settle",
          "[reasoning]") {
  ReasoningSplitter splitter;
  CHECK(splitter.Push("<thi").reasoning.empty());  // may yet be the tag
  CHECK(splitter.Push("nk>\nLet me").reasoning == "Let me");
  // Newlines may be the ones before </think>: held until text follows them.
  CHECK(splitter.Push(" see.\n").reasoning == " see.");
  CHECK(splitter.Push("\nMore.</").reasoning == "\n\nMore.");
  CHECK_FALSE(splitter.in_content());
  const Parts end = splitter.Push("think>\n\nAnswer");
  CHECK(end.reasoning.empty());
  CHECK(end.content == "Answer");
  CHECK(splitter.in_content());
  CHECK(splitter.Push(": 42").content == ": 42");
  CHECK(splitter.Flush().content.empty());
}

}  // namespace
}  // namespace tophat
