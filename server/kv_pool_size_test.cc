#include "server/kv_pool_size.h"

#include <catch2/catch.hpp>

namespace tophat {
namespace {

TEST_CASE("The KV pool takes its configured size or a fraction of free GPU memory",
          "[server]") {
  constexpr int64_t kGiB = int64_t{1} << 30;
  SECTION("bytes on the CPU, whatever the device reports") {
    auto bytes = KvPoolBytes({.memory_bytes = 256 << 20});
    REQUIRE(bytes.ok());
    CHECK(*bytes == 256 << 20);
  }
  SECTION("a fraction of what the GPU has free") {
    auto bytes = KvPoolBytes(
        {.memory_bytes = 1, .memory_fraction = 0.9, .on_gpu = true, .device_free_bytes = 40 * kGiB});
    REQUIRE(bytes.ok());
    CHECK(*bytes == static_cast<int64_t>(0.9 * 40 * kGiB));
  }
  SECTION("a fraction on the CPU names the key to use instead") {
    auto bytes = KvPoolBytes({.memory_bytes = 1, .memory_fraction = 0.5});
    REQUIRE_FALSE(bytes.ok());
    CHECK(bytes.status().message().find("kv_cache.memory_bytes") != std::string::npos);
  }
  SECTION("a fraction without a memory report fails rather than guessing") {
    auto bytes = KvPoolBytes({.memory_fraction = 0.5, .on_gpu = true});
    REQUIRE_FALSE(bytes.ok());
    CHECK(bytes.status().code() == absl::StatusCode::kFailedPrecondition);
  }
  SECTION("bytes more than the GPU has free fail at start-up, naming the key") {
    auto bytes =
        KvPoolBytes({.memory_bytes = 50 * kGiB, .on_gpu = true, .device_free_bytes = 40 * kGiB});
    REQUIRE_FALSE(bytes.ok());
    CHECK(bytes.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(bytes.status().message().find("kv_cache.memory_bytes") != std::string::npos);
  }
  SECTION("bytes that fit are kept") {
    auto bytes =
        KvPoolBytes({.memory_bytes = 4 * kGiB, .on_gpu = true, .device_free_bytes = 40 * kGiB});
    REQUIRE(bytes.ok());
    CHECK(*bytes == 4 * kGiB);
  }
}

}  // namespace
}  // namespace tophat
