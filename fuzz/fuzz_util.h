// Helpers shared by the fuzz targets.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace tophat::fuzz {

// A private directory for the inputs that must be files (the decoders under test open
// paths): in /dev/shm when it exists, so that each run costs no disk write.
inline const std::filesystem::path& ScratchDir() {
  static const std::filesystem::path dir = [] {
    std::string pattern =
        std::filesystem::exists("/dev/shm") ? "/dev/shm/tophat-fuzz-XXXXXX" : "/tmp/tophat-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    std::atexit([] { std::filesystem::remove_all(ScratchDir()); });
    return std::filesystem::path(pattern);
  }();
  return dir;
}

// Writes `data` to ScratchDir()/name and returns the path.
inline std::filesystem::path WriteInput(const std::string& name, const uint8_t* data,
                                        size_t size) {
  const std::filesystem::path path = ScratchDir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) std::abort();
  return path;
}

// A decoder that returns a status must never crash; when it says OK, callers check what it
// returned is consistent. A broken invariant is a finding: abort so that libFuzzer keeps
// the input.
#define TOPHAT_FUZZ_CHECK(condition)                                                  \
  do {                                                                                \
    if (!(condition)) {                                                               \
      std::fprintf(stderr, "fuzz invariant broken: %s (%s:%d)\n", #condition, __FILE__, \
                   __LINE__);                                                         \
      std::abort();                                                                   \
    }                                                                                 \
  } while (false)

}  // namespace tophat::fuzz
