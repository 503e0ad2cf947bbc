#include "models/tokenizers/tokenizer_utf8.h"

#include <algorithm>

namespace tophat::utf8 {
namespace {

struct Scan {
  // The whole character when `valid`, otherwise the maximal ill-formed subpart (>= 1).
  size_t length;
  bool valid;
  // Ill-formed only because the text ended: more bytes could still complete it.
  bool truncated;
};

Scan ScanAt(std::string_view text, size_t pos) {
  const auto lead = static_cast<unsigned char>(text[pos]);
  if (lead < 0x80) return {1, true, false};
  size_t continuations = 0;
  // The second byte's range is narrower for some leads; that is what rules out overlongs,
  // surrogates and code points past U+10FFFF.
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    continuations = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    continuations = 2;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    continuations = 3;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return {1, false, false};
  }
  for (size_t i = 1; i <= continuations; ++i) {
    if (pos + i >= text.size()) return {i, false, true};
    const auto byte = static_cast<unsigned char>(text[pos + i]);
    if (byte < lo || byte > hi) return {i, false, false};
    lo = 0x80;
    hi = 0xBF;
  }
  return {continuations + 1, true, false};
}

}  // namespace

bool IsValid(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const Scan scan = ScanAt(text, pos);
    if (!scan.valid) return false;
    pos += scan.length;
  }
  return true;
}

std::string ToValidLossy(std::string_view bytes, bool replace_each_byte) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    const Scan scan = ScanAt(bytes, pos);
    if (scan.valid) {
      out.append(bytes.substr(pos, scan.length));
      pos += scan.length;
    } else {
      out.append(kReplacement);
      pos += replace_each_byte ? 1 : scan.length;
    }
  }
  return out;
}

size_t IncompleteSuffixLength(std::string_view text) {
  // A character is at most 4 bytes, so only a lead byte among the last 3 can be pending.
  const size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const size_t pos = n - back;
    if (static_cast<unsigned char>(text[pos]) < 0xC0) continue;
    const Scan scan = ScanAt(text, pos);
    return scan.truncated ? back : 0;
  }
  return 0;
}

void AppendCodePoint(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t DecodeAt(std::string_view text, size_t pos, size_t* length) {
  const Scan scan = ScanAt(text, pos);
  if (!scan.valid) {
    *length = 1;
    return U'\uFFFD';
  }
  *length = scan.length;
  const auto lead = static_cast<unsigned char>(text[pos]);
  if (scan.length == 1) return lead;
  static constexpr unsigned char kLeadMask[] = {0, 0, 0x1F, 0x0F, 0x07};
  char32_t cp = lead & kLeadMask[scan.length];
  for (size_t i = 1; i < scan.length; ++i) {
    cp = (cp << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3F);
  }
  return cp;
}

}  // namespace tophat::utf8
