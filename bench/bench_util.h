// Small helpers shared by the serving benchmarks: medians, a scratch directory that removes
// itself, writing config files and the JSON report.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tophat::bench {

using BenchClock = std::chrono::steady_clock;

inline double SecondsBetween(BenchClock::time_point start, BenchClock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

inline double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class ScratchDir {
 public:
  static absl::StatusOr<ScratchDir> Create(const std::string& prefix) {
    std::error_code ec;
    std::filesystem::path base = std::filesystem::temp_directory_path(ec);
    if (ec) base = "/tmp";
    std::string pattern = (base / (prefix + "-XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError(absl::StrCat(pattern, ": cannot create a scratch directory"));
    }
    return ScratchDir(pattern);
  }
  ScratchDir(ScratchDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  ScratchDir& operator=(ScratchDir&&) = delete;
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  explicit ScratchDir(std::filesystem::path path) : path_(std::move(path)) {}
  std::filesystem::path path_;
};

// Writes `text` to `path` (a config file for a process the benchmark starts).
inline absl::Status WriteTextFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) return absl::UnavailableError(absl::StrCat(path.string(), ": cannot write"));
  return absl::OkStatus();
}

inline absl::Status WriteJson(const nlohmann::json& report, const std::string& path) {
  std::ofstream out(path);
  out << report.dump(2) << "\n";
  if (!out) return absl::InternalError(absl::StrCat("--json: cannot write ", path));
  return absl::OkStatus();
}

// A benchmark's ending: the table, then the JSON report on one line (for scripts reading
// stdout), and the report indented into `json_path` when one is given.
inline absl::Status PrintReport(const std::string& table, const nlohmann::json& report,
                                const std::string& json_path) {
  std::printf("%s", table.c_str());
  std::printf("%s\n", report.dump().c_str());
  if (json_path.empty()) return absl::OkStatus();
  return WriteJson(report, json_path);
}

}  // namespace tophat::bench
