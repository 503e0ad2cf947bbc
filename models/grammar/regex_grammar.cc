#include "models/grammar/regex_grammar.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tophat {

absl::StatusOr<std::shared_ptr<const StringPattern>> CompileRegexFormat(std::string_view regex) {
  if (regex.size() > kMaxRegexFormatBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("regex: longer than ", kMaxRegexFormatBytes, " bytes"));
  }
  // The whole answer must match: the caller's anchors are dropped and the body anchored in a
  // group of its own, so that a '|' at its top stays inside them.
  std::string_view body = regex;
  const size_t dropped = !body.empty() && body.front() == '^' ? 1 : 0;
  body.remove_prefix(dropped);
  if (!body.empty() && body.back() == '$') {
    size_t backslashes = 0;
    while (backslashes + 1 < body.size() && body[body.size() - 2 - backslashes] == '\\') {
      ++backslashes;
    }
    if (backslashes % 2 == 0) body.remove_suffix(1);
  }
  absl::StatusOr<std::shared_ptr<const StringPattern>> pattern =
      StringPattern::Compile(absl::StrCat("^(?:", std::string(body), ")$"));
  if (!pattern.ok()) {
    std::string message(pattern.status().message());
    if (message.rfind("pattern: ", 0) == 0) message.erase(0, 9);
    // Offsets count from the group around the body ("(?:", after the anchor StringPattern
    // took): in the caller's regex they are 3 less, and 1 more past a '^' dropped here.
    constexpr std::string_view kAt = " at offset ";
    if (const size_t at = message.find(kAt); at != std::string::npos) {
      const size_t digits = at + kAt.size();
      size_t end = digits;
      while (end < message.size() && message[end] >= '0' && message[end] <= '9') ++end;
      int64_t offset = 0;
      if (end > digits && absl::SimpleAtoi(message.substr(digits, end - digits), &offset)) {
        offset = std::max<int64_t>(0, offset - 3 + static_cast<int64_t>(dropped));
        message.replace(digits, end - digits, absl::StrCat(offset));
      }
    }
    return absl::InvalidArgumentError(absl::StrCat("regex: ", message));
  }
  return pattern;
}

std::unique_ptr<TokenConstraint> MakeRegexConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const StringPattern> pattern) {
  RegexGrammar start(pattern.get());
  return std::make_unique<RegexConstraint>(std::move(vocabulary), std::move(end_ids),
                                           std::move(start), std::move(pattern));
}

}  // namespace tophat
