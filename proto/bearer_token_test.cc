#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "base/test_util.h"
#include "proto/channel_security.h"

namespace tophat {
namespace {


TEST_CASE("Sha256Hex matches sha256sum", "[tls]") {
  // printf %s abc | sha256sum
  CHECK(Sha256Hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(Sha256Hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_CASE("A token file gives its first line, trimmed, and an empty one is refused", "[tls]") {
  const testing::TempDir dir;
  const std::string path = (dir.path() / "token").string();
  std::ofstream(path) << "  s3cret \nignored\n";
  auto token = ReadTokenFile(path, "cloud_tls.token_file");
  REQUIRE(token.ok());
  CHECK(*token == "s3cret");
  std::ofstream(path) << "\n";
  CHECK_THAT(std::string(ReadTokenFile(path, "cloud_tls.token_file").status().message()),
             Catch::Contains("holds no token"));
  CHECK_THAT(std::string(ReadTokenFile(path + ".missing", "cloud_tls.token_file").status().message()),
             Catch::Contains("cloud_tls.token_file: cannot read"));
}

}  // namespace
}  // namespace tophat
