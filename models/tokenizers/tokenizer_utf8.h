// UTF-8 helpers shared by the tokenizers and StreamingDetokenizer.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tophat::utf8 {

// The replacement character U+FFFD, encoded.
inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Returns true when `text` is well-formed UTF-8 (no overlongs, surrogates or code points
// above U+10FFFF).
bool IsValid(std::string_view text);

// Replaces each maximal ill-formed subsequence with U+FFFD, the policy of the Unicode
// standard (and of Rust's from_utf8_lossy, which Hugging Face tokenizers use), so byte-level
// decoders return text that JSON encoders accept. With `replace_each_byte`, every byte of an
// ill-formed subsequence gets its own U+FFFD instead, as SentencePiece does.
std::string ToValidLossy(std::string_view bytes, bool replace_each_byte = false);

// Returns how many bytes at the end of `text` are the start of a well-formed sequence that
// more bytes could still complete (0 when the text does not end mid-character).
size_t IncompleteSuffixLength(std::string_view text);

// Appends the UTF-8 encoding of `code_point` (assumed valid) to `out`.
void AppendCodePoint(char32_t code_point, std::string& out);

// Decodes the well-formed character starting at text[pos] and stores its length in *length.
// Returns U+FFFD with *length == 1 for an ill-formed byte.
char32_t DecodeAt(std::string_view text, size_t pos, size_t* length);

}  // namespace tophat::utf8
