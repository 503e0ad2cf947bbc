// Bearer tokens as configs hold them: whom each token stands for and the token's SHA-256,
// never the token itself (proto/channel_security.h checks calls against them).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tophat {

struct BearerToken {
  std::string name;        // whom the token stands for: an app, or a device on the cloud link
  std::string sha256_hex;  // SHA-256 of the token, 64 lowercase hex digits
  bool operator==(const BearerToken&) const = default;
};

// Parses config entries "NAME:SHA256HEX". Errors name `key`, the entry's index and the fault:
// an empty name or one with control characters, a name listed twice, a digest that is not 64
// hex digits (the token in clear, say), a digest listed twice.
absl::StatusOr<std::vector<BearerToken>> ParseBearerTokens(const std::vector<std::string>& entries,
                                                           std::string_view key);

}  // namespace tophat
