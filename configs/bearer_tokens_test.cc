#include "configs/bearer_tokens.h"

#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace tophat {
namespace {

// sha256("token-a"), from `printf %s token-a | sha256sum`.
constexpr char kDigestA[] = "a70bf50e531ce1a817561f2f5d5b6645d4e806becf58ccc5e8cf6b8045a090a8";

TEST_CASE("Bearer token entries are parsed, and every malformed entry is refused by index",
          "[tls]") {
  const std::string digest_b(64, 'b');
  auto parsed = ParseBearerTokens({std::string("chat-ui:") + kDigestA, "robot:" + digest_b},
                                  "app_tokens");
  REQUIRE(parsed.ok());
  REQUIRE(parsed->size() == 2);
  CHECK((*parsed)[0] == BearerToken{"chat-ui", kDigestA});
  CHECK((*parsed)[1].name == "robot");

  const auto refused = [](std::vector<std::string> entries, const std::string& expect) {
    auto result = ParseBearerTokens(entries, "app_tokens");
    INFO(result.status().ToString());
    REQUIRE_FALSE(result.ok());
    CHECK_THAT(std::string(result.status().message()), Catch::Contains(expect));
  };
  refused({"no-colon"}, "app_tokens[0]: expected NAME:SHA256");
  refused({std::string(":") + kDigestA}, "app_tokens[0]: empty name");
  refused({"a:token-in-clear"}, "is not a SHA-256 digest");
  // A token pasted in clear is not echoed into the log.
  CHECK_THAT(std::string(ParseBearerTokens({"a:token-in-clear"}, "k").status().message()),
             !Catch::Contains("token-in-clear"));
  refused({std::string("a:") + kDigestA, std::string("a:") + digest_b}, "app_tokens[1]: the name");
  refused({std::string("a:") + kDigestA, std::string("b:") + kDigestA}, "listed twice");
}

TEST_CASE("Device names are checked by index: empty, control characters, twice", "[tls]") {
  CHECK(CheckDeviceNames({}, "tls.revoked_devices").ok());
  CHECK(CheckDeviceNames({"device-1", "device 2"}, "tls.revoked_devices").ok());
  const auto refused = [](std::vector<std::string> names, const std::string& expect) {
    const absl::Status status = CheckDeviceNames(names, "tls.revoked_devices");
    INFO(status.ToString());
    CHECK_THAT(std::string(status.message()), Catch::Contains(expect));
  };
  refused({""}, "tls.revoked_devices[0]: empty name");
  refused({"a", "b\n"}, "tls.revoked_devices[1]: the name holds a control character");
  refused({"a", "b", "a"}, "tls.revoked_devices[2]: \"a\" is listed twice");
}

}  // namespace
}  // namespace tophat
