// The end of a reasoning's text while it is a character begun and not ended: a budget that
// cuts the reasoning waits for its text to end between characters (a byte-level vocabulary
// spells many characters in several tokens), so that the forced end leaves no broken
// character behind (AfterTokenConstraint, HarmonyCallConstraint). Header-only.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "models/tokenizers/tokenizer_utf8.h"

namespace tophat {

class PartialCharacter {
 public:
  // Tokens the reasoning may go on for past its budget while its text ends inside a
  // character: a character is at most 4 bytes and each token adds at least 1, so 3 complete
  // one begun within the budget; a model that keeps writing partial characters is cut after
  // them all the same.
  static constexpr int64_t kWait = 3;

  // After one more token's bytes (null: a special token, across which no character runs).
  void Push(const std::string* bytes) {
    if (bytes == nullptr) {
      size_ = 0;
      return;
    }
    // A pending character lies in the last 3 bytes: the token's, after what was pending.
    std::array<char, 6> last{};
    size_t size = 0;
    if (bytes->size() < 3) {
      for (uint8_t i = 0; i < size_; ++i) last[size++] = bytes_[i];
    }
    const size_t take = std::min<size_t>(bytes->size(), 3);
    for (size_t i = bytes->size() - take; i < bytes->size(); ++i) last[size++] = (*bytes)[i];
    const size_t pending = utf8::IncompleteSuffixLength(std::string_view(last.data(), size));
    for (size_t i = 0; i < pending; ++i) bytes_[i] = last[size - pending + i];
    size_ = static_cast<uint8_t>(pending);
  }
  // The text ends between characters.
  bool whole() const { return size_ == 0; }

 private:
  std::array<char, 3> bytes_{};
  uint8_t size_ = 0;
};

}  // namespace tophat
