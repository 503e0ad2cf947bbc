// A strict reader over yaml-cpp shared by the cloud and agent config loaders. Loaders ask
// for each key they know by its dotted path ("kv_cache.block_size"); values they never ask
// for are reported as unknown keys, so a typo fails loudly instead of silently keeping a
// default. Errors are collected rather than returned one at a time, so one run of the
// daemon names every mistake in the file.
//
// Error format (one line per error, ordered by line):
//   configs/cloud.yaml:7: kv_cache.block_size: expected a positive integer, got "abc"
// Lines are 1-based. An error about a key the file does not contain has no line.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "yaml-cpp/yaml.h"

namespace tophat {

// Parses a byte size: a whole number of bytes ("1000000", "0"), or a number with a unit,
// optionally separated by spaces: B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB
// (powers of 1000). The number may have a fraction ("1.5GiB") if the result is a whole
// number of bytes. Units are case-sensitive because "mb" (millibits) and "Mb" (megabits)
// mean something else. Returns InvalidArgument for anything else, negatives and overflow.
absl::StatusOr<int64_t> ParseByteSize(std::string_view text);

// "512 B", "64 MiB", "15.6 GiB": the largest binary unit, one decimal unless exact.
std::string FormatByteSize(int64_t bytes);

// Formats and collects errors. With a non-empty source each reads "source:line: key: msg"
// ("source: key: msg" when line is 0); without one, "key: msg" (Validate*Config, where
// values may come from command-line flags rather than a file).
class ConfigErrors {
 public:
  explicit ConfigErrors(std::string source = "") : source_(std::move(source)) {}

  // `line` is 1-based; 0 when there is none.
  void Add(std::string_view key, int line, std::string_view message);
  bool empty() const { return errors_.empty(); }

  // OK when empty; otherwise InvalidArgument with every error, ordered by line (errors
  // without a line last), one per line of the message.
  absl::Status ToStatus() const;

 private:
  struct Error {
    int line;
    std::string text;
  };
  std::string source_;
  std::vector<Error> errors_;
};

// Which values a numeric read accepts.
enum class Bound { kAny, kNonNegative, kPositive };

// Usage:
//   TOPHAT_ASSIGN_OR_RETURN(YamlReader reader, YamlReader::Load(path));
//   reader.ReadInt("kv_cache.block_size", &config.kv_cache.block_size, Bound::kPositive);
//   ...
//   return reader.Finish();
//
// Each Read* takes a dotted key path. A key that is absent (or whose enclosing mapping is
// absent or empty) leaves *out unchanged, so callers pre-fill defaults. A present value of
// the wrong type or out of bounds records an error and also leaves *out unchanged. A null
// value (`key:` with nothing after it) is an error for scalars: `""` is the empty string.
// Not thread-safe; one reader per load.
class YamlReader {
 public:
  // Parses `yaml`; `source_name` (usually the file's path) prefixes every message. Syntax
  // errors, several documents in one stream, or a top level that is not a mapping are
  // returned here. An empty document is an empty mapping.
  static absl::StatusOr<YamlReader> Parse(std::string_view yaml, std::string source_name);

  // Reads and parses the file at `path`. NotFound when it does not exist; InvalidArgument
  // when it is not a readable regular file.
  static absl::StatusOr<YamlReader> Load(const std::filesystem::path& path);

  void ReadBool(std::string_view key, bool* out);
  void ReadInt(std::string_view key, int64_t* out, Bound bound = Bound::kAny);
  void ReadDouble(std::string_view key, double* out, Bound bound = Bound::kAny);
  // A duration in seconds written as a finite number ("30", "0.5").
  void ReadSeconds(std::string_view key, double* out, Bound bound = Bound::kNonNegative);
  // Any scalar, quoted or not ("7100" is the string "7100").
  void ReadString(std::string_view key, std::string* out);
  // A sequence of scalars; an empty sequence `[]` yields an empty list.
  void ReadStringList(std::string_view key, std::vector<std::string>* out);
  // A byte size as ParseByteSize accepts, or a plain integer.
  void ReadByteSize(std::string_view key, int64_t* out, Bound bound = Bound::kPositive);

  // Whether the file sets `key` (to anything, null included).
  bool Has(std::string_view key) const;
  // 1-based line of `key` in the file, or 0 when the file does not set it.
  int Line(std::string_view key) const;

  // Records an error about `key` at its line (for value checks done by the loaders after
  // reading). Only the first error per key is kept: later ones are consequences. When the
  // file does not set `key` (a default that conflicts with another key), the line of
  // `related_key` is used instead, so the message still points into the file.
  void AddError(std::string_view key, std::string_view message, std::string_view related_key = {});

  // Reports every key present in the file that no Read* asked for, duplicate keys and
  // non-scalar keys, then returns all recorded errors (OK if none). Call once, last.
  absl::Status Finish();

  const std::string& source_name() const { return source_name_; }

  // The file's values by dotted key ("scheduler.max_batch_tokens" -> "512"; a list or any
  // other value that is not a mapping as YAML's one-line flow text), to tell which keys a
  // reload changed. Keys that are not scalars are left out (Finish refuses them).
  std::map<std::string, std::string> Values() const;

 private:
  struct Entry {
    YAML::Node key;
    YAML::Node value;
  };

  YamlReader(const YAML::Node& root, std::string source_name);

  // Finds `key`, registering it as known. Returns false when absent, or when an enclosing
  // value is not a mapping (which records an error against that enclosing key).
  bool Find(std::string_view key, Entry* entry);
  // Looks `key` up without side effects.
  bool Lookup(std::string_view key, Entry* entry, std::string* not_a_map) const;
  void TypeError(std::string_view key, const Entry& entry, std::string_view expected);
  void CheckUnknown(const YAML::Node& map, const std::string& prefix);
  // The known key under `prefix` closest to `name` by edit distance, or "" if none is close.
  std::string ClosestSibling(std::string_view prefix, std::string_view name) const;

  // Behind a pointer because YAML::Node assignment writes through to the document, which
  // would make moving a reader into an existing one rewrite that one's tree.
  std::unique_ptr<YAML::Node> root_;
  std::string source_name_;
  ConfigErrors errors_;
  std::set<std::string, std::less<>> known_;       // every path a Read* asked for
  std::set<std::string, std::less<>> error_keys_;  // keys that already have an error
};

// The keys whose values differ between two YamlReader::Values, or that only one sets; sorted.
std::vector<std::string> ChangedConfigKeys(const std::map<std::string, std::string>& before,
                                           const std::map<std::string, std::string>& after);

// Of those keys, the ones not in `reloaded` (the keys a running daemon applies on a reload):
// what only a restart applies.
std::vector<std::string> KeysAwaitingRestart(const std::map<std::string, std::string>& before,
                                             const std::map<std::string, std::string>& after,
                                             std::span<const std::string_view> reloaded);

}  // namespace tophat
