#include "configs/config_checks.h"

#include <catch2/catch.hpp>
#include <filesystem>

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

TEST_CASE("Enumerated values") {
  for (std::string_view dtype : {"float32", "float16", "bfloat16"}) CHECK(CheckDtype(dtype).ok());
  CHECK_FALSE(CheckDtype("fp16").ok());
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
