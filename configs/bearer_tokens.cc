#include "configs/bearer_tokens.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tophat {
namespace {

absl::Status CheckName(const std::string& name, const std::string& where) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty name"));
  for (const char c : name) {
    if (absl::ascii_iscntrl(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name holds a control character"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<BearerToken>> ParseBearerTokens(const std::vector<std::string>& entries,
                                                           std::string_view key) {
  std::vector<BearerToken> tokens;
  absl::flat_hash_set<std::string> names;
  absl::flat_hash_set<std::string> digests;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string where = absl::StrCat(std::string(key), "[", i, "]");
    const size_t colon = entries[i].rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": expected NAME:SHA256 (the token's digest: printf %s TOKEN | sha256sum)"));
    }
    BearerToken token{entries[i].substr(0, colon),
                      absl::AsciiStrToLower(entries[i].substr(colon + 1))};
    if (absl::Status name = CheckName(token.name, where); !name.ok()) return name;
    const bool hex = token.sha256_hex.size() == 64 &&
                     std::all_of(token.sha256_hex.begin(), token.sha256_hex.end(),
                                 [](char c) { return absl::ascii_isxdigit(c); });
    if (!hex) {
      // The value is not echoed: it may be the token itself, pasted in clear.
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": what follows the name (", token.sha256_hex.size(),
          " characters) is not a SHA-256 digest (64 hex digits; configs hold the token's "
          "digest, not the token: printf %s TOKEN | sha256sum)"));
    }
    if (!names.insert(token.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name \"", token.name, "\" is listed twice"));
    }
    if (!digests.insert(token.sha256_hex).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": this digest is listed twice (two names would share a token)"));
    }
    tokens.push_back(std::move(token));
  }
  return tokens;
}

absl::Status CheckDeviceNames(const std::vector<std::string>& names, std::string_view key) {
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string where = absl::StrCat(std::string(key), "[", i, "]");
    if (absl::Status name = CheckName(names[i], where); !name.ok()) return name;
    if (!seen.insert(names[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"", names[i], "\" is listed twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tophat
