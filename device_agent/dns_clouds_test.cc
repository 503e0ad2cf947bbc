#include "device_agent/dns_clouds.h"

#include <catch2/catch.hpp>

namespace tophat {
namespace {

TEST_CASE("A host resolves to its addresses with the port, each once", "[dns_clouds]") {
  absl::StatusOr<std::vector<std::string>> loopback = ResolveHostAddresses("127.0.0.1", 7100);
  REQUIRE(loopback.ok());
  CHECK(*loopback == std::vector<std::string>{"127.0.0.1:7100"});
  absl::StatusOr<std::vector<std::string>> six = ResolveHostAddresses("::1", 7100);
  REQUIRE(six.ok());
  CHECK(*six == std::vector<std::string>{"[::1]:7100"});
  absl::StatusOr<std::vector<std::string>> localhost = ResolveHostAddresses("localhost", 7100);
  REQUIRE(localhost.ok());
  CHECK(std::find(localhost->begin(), localhost->end(), "127.0.0.1:7100") != localhost->end());
  // .invalid never resolves (RFC 2606).
  absl::StatusOr<std::vector<std::string>> none = ResolveHostAddresses("no-such.invalid", 7100);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(none.status().message()), Catch::Contains("\"no-such.invalid\""));
}

TEST_CASE("A DNS name's slots each hold another address, and keep theirs while it resolves",
          "[dns_clouds]") {
  absl::StatusOr<std::unique_ptr<DnsClouds>> one = DnsClouds::Create("dns:///127.0.0.1:7100", 0);
  REQUIRE(one.ok());
  CHECK((*one)->slots() == 1);  // as many as it resolves to
  CHECK((*one)->host() == "127.0.0.1");
  absl::StatusOr<std::unique_ptr<DnsClouds>> two = DnsClouds::Create("dns:///127.0.0.1:7100", 2);
  REQUIRE(two.ok());
  // The one address goes to the first slot that asks; the other has none left.
  absl::StatusOr<std::string> second = (*two)->AddressFor(1);
  REQUIRE(second.ok());
  CHECK(*second == "127.0.0.1:7100");
  absl::StatusOr<std::string> first = (*two)->AddressFor(0);
  REQUIRE_FALSE(first.ok());
  CHECK_THAT(std::string(first.status().message()),
             Catch::Contains("\"127.0.0.1\" resolves to 1 address(es), each held by another of "
                             "this agent's 2 streams"));
  // Asked again, a slot keeps what it holds.
  CHECK((*two)->AddressFor(1).value_or("") == "127.0.0.1:7100");
  absl::StatusOr<std::unique_ptr<DnsClouds>> six = DnsClouds::Create("dns:///[::1]:7100", 1);
  REQUIRE(six.ok());
  CHECK((*six)->AddressFor(0).value_or("") == "[::1]:7100");
  for (const char* bad : {"127.0.0.1:7100", "dns:///host", "dns:///host:0", "dns:///:7100",
                          "dns:///host:port"}) {
    INFO(bad);
    CHECK_FALSE(DnsClouds::Create(bad, 1).ok());
  }
}

}  // namespace
}  // namespace tophat
