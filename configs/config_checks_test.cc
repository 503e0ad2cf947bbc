#include "configs/config_checks.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

namespace tophat {
namespace {

TEST_CASE("CheckHostPort takes host:port and bracketed IPv6, port 0 only to listen") {
  CHECK(CheckHostPort("127.0.0.1:7100", false).ok());
  CHECK(CheckHostPort("[::1]:7100", false).ok());
  CHECK(CheckHostPort("[fe80::1%eth0]:7100", false).ok());
  CHECK(CheckHostPort("host_1.example-corp:1", false).ok());
  CHECK(CheckHostPort("0.0.0.0:0", true).ok());
  CHECK_FALSE(CheckHostPort("0.0.0.0:0", false).ok());
  CHECK_FALSE(CheckHostPort("[]:1", true).ok());
  CHECK_FALSE(CheckHostPort("unix:/tmp/sock", true).ok());
  CHECK_FALSE(CheckHostPort("", true).ok());
}

TEST_CASE("SplitHostPort takes host:port apart, brackets off an IPv6 host") {
  auto v4 = SplitHostPort("127.0.0.1:9100");
  REQUIRE(v4.has_value());
  CHECK(v4->host == "127.0.0.1");
  CHECK(v4->port == 9100);
  auto v6 = SplitHostPort("[::1]:0");
  REQUIRE(v6.has_value());
  CHECK(v6->host == "::1");
  CHECK(v6->port == 0);
  for (const char* bad : {"nowhere", "host:", "host:http", "host:65536", "host:-1", "host:80x"}) {
    CAPTURE(bad);
    CHECK_FALSE(SplitHostPort(bad).has_value());
  }
}

TEST_CASE("Enumerated values") {
  for (std::string_view dtype : {"float32", "float16", "bfloat16"}) CHECK(CheckDtype(dtype).ok());
  CHECK_FALSE(CheckDtype("fp16").ok());
  for (std::string_view wire : {"cloud", "scheduler", "float32", "float16", "bfloat16", "int8"}) {
    CHECK(CheckWireDtype(wire).ok());
  }
  CHECK_FALSE(CheckWireDtype("int4").ok());
  for (std::string_view wire : {"float32", "float16", "bfloat16", "int8"}) {
    CHECK(CheckWireDtypeChoice(wire).ok());
  }
  CHECK_FALSE(CheckWireDtypeChoice("cloud").ok());
  CHECK_FALSE(CheckWireDtypeChoice("scheduler").ok());
  CHECK(CheckDtypeOnDevice("float16", "cuda:1").ok());
  CHECK(CheckDtypeOnDevice("bfloat16", "cpu").ok());
  CHECK_THAT(std::string(CheckDtypeOnDevice("float16", "cpu").message()),
             Catch::Contains("float16 needs device: cuda"));
  for (std::string_view device : {"cpu", "cuda", "cuda:0", "cuda:15"})
    CHECK(CheckDevice(device).ok());
  for (std::string_view device : {"CPU", "cuda:", "cuda:-1", "cuda:1a", "mps", "cuda:99999"}) {
    INFO(device);
    CHECK_FALSE(CheckDevice(device).ok());
  }
  for (std::string_view level : {"trace", "debug", "info", "warn", "error"})
    CHECK(CheckLogLevel(level).ok());
  CHECK_FALSE(CheckLogLevel("warning").ok());
}

TEST_CASE("ResolveConfigPath joins relative paths to the config's directory") {
  CHECK(ResolveConfigPath("", "/etc/tophat/cloud.yaml").empty());
  CHECK(ResolveConfigPath("/abs/./x", "/etc/tophat/cloud.yaml") == "/abs/./x");
  CHECK(ResolveConfigPath("../b/c", "/etc/tophat/cloud.yaml") == "/etc/b/c");
  CHECK(ResolveConfigPath("b", "cloud.yaml") ==
        (std::filesystem::current_path() / "b").lexically_normal().string());
  CHECK(ResolveConfigPath("b", "conf/cloud.yaml") ==
        (std::filesystem::current_path() / "conf" / "b").lexically_normal().string());
}

TEST_CASE("PhysicalMemoryBytes reports this machine's memory") {
  const int64_t bytes = PhysicalMemoryBytes();
  CHECK(bytes > (int64_t{64} << 20));
  CHECK(bytes < (int64_t{1} << 52));
}

}  // namespace
}  // namespace tophat

namespace tophat {
namespace {

TEST_CASE("CheckCanListen names the key, the address and why it cannot be bound") {
  // A port this test holds: binding it again must fail, and say so.
  const int held = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(held >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(held, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  REQUIRE(listen(held, 1) == 0);
  socklen_t length = sizeof(address);
  REQUIRE(getsockname(held, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  const std::string in_use = "127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  const absl::Status status = CheckCanListen(in_use, "listen_address");
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(status.message()) ==
        "listen_address: cannot listen on " + in_use + ": Address already in use");
  // --check-config's report: the port in use said with whose it may be; a free one, empty
  // addresses and Unix sockets as they should be.
  CHECK(DescribeListenPorts({{"listen_address", in_use},
                             {"metrics_address", ""},
                             {"openai.address", "127.0.0.1:0"},
                             {"app", "unix:/nonexistent/agent.sock"}},
                            "tophat-agent") ==
        std::vector<std::string>{"listen_address " + in_use + ": listen_address: cannot listen on " +
                                     in_use + ": Address already in use (a running tophat-agent's?)",
                                 "openai.address 127.0.0.1:0: free"});
  close(held);
  CHECK(CheckCanListen(in_use, "listen_address").ok());
  CHECK(CheckCanListen("127.0.0.1:0", "listen_address").ok());
  CHECK(CheckCanListen("unix:/nonexistent/agent.sock", "listen_address").ok());
}

}  // namespace
}  // namespace tophat
