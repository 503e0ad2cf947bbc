// Bearer tokens as configs hold them: whom each token stands for and the token's SHA-256,
// never the token itself (proto/channel_security.h checks calls against them).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
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

// Bearer tokens that a config reload replaces while calls are checked against them. Each check
// sees one set whole, the old or the new. Thread-safe.
class BearerTokenSet {
 public:
  explicit BearerTokenSet(std::vector<BearerToken> tokens = {})
      : tokens_(std::make_shared<const std::vector<BearerToken>>(std::move(tokens))) {}
  void Replace(std::vector<BearerToken> tokens) {
    auto replacement = std::make_shared<const std::vector<BearerToken>>(std::move(tokens));
    std::lock_guard<std::mutex> lock(mutex_);
    tokens_ = std::move(replacement);
  }
  std::shared_ptr<const std::vector<BearerToken>> Get() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return tokens_;
  }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<const std::vector<BearerToken>> tokens_;
};

// Checks a list of names (devices, apps): errors name `key`, the entry's index and the fault
// (an empty name, one with control characters, a name listed twice).
absl::Status CheckDeviceNames(const std::vector<std::string>& names, std::string_view key);

}  // namespace tophat
