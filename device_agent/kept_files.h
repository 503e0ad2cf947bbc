// The OpenAI endpoint's kept objects (stored responses, conversations) as files, so that they
// outlive the agent's process (openai.store_dir): one JSON file per object, `ID.json`, holding
// the object's id, the app that made it and its value. Each write goes whole to `ID.json.tmp`,
// is synced and renamed over the old file, and the folder is synced, so a crash or a power
// loss leaves the old file or the new one, never part of one. Text stays on the device: the
// files are the agent's alone (0600, in a folder made 0700). Not thread-safe: the store that
// owns it locks.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tophat {

// What a store took back from its files as the agent started.
struct RestoredObjects {
  size_t kept = 0;                     // objects held now
  std::vector<std::string> set_aside;  // "FILE: why", each file moved aside
};

class KeptFiles {
 public:
  using Json = nlohmann::ordered_json;

  // Opens `dir`, making it (0700) with its parents when missing. Errors name the folder.
  static absl::StatusOr<KeptFiles> Open(std::filesystem::path dir);
  // What Open would find, changing nothing (--check-config): the objects' files `dir` holds
  // (0 when it is still to be made), or the error Open would give.
  static absl::StatusOr<size_t> Check(const std::filesystem::path& dir);

  struct Object {
    std::string id;
    std::string app;
    Json value;
  };
  struct Loaded {
    std::vector<Object> objects;  // the least recently written or used (Touch) first
    // "FILE: why" for each file that could not be read back; each is moved aside to
    // FILE.unreadable (kept for a person to look at, not read again).
    std::vector<std::string> unreadable;
  };
  // The objects the folder holds. Leftover temporary files (a write a crash cut short) are
  // removed.
  Loaded Load() const;

  // Writes (or replaces) the object's file. `id` must be 1 to 128 of [A-Za-z0-9_-]: ids name
  // files, and the endpoint's own (resp_..., conv_...) are of that form.
  absl::Status Write(const std::string& id, const std::string& app, const Json& value) const;
  // Removes it; a file that is not there is no error.
  absl::Status Remove(const std::string& id) const;
  // Marks the object's file used now (its modification time), so that Load ranks it by its
  // last use and a lowered bound forgets what was least recently used, as the store in memory
  // does. Not synced: after a power cut the rank may be a use behind. A file that is not
  // there (its write failed, and was reported) is no error.
  absl::Status Touch(const std::string& id) const;
  // Moves a file Load read but whose value its owner cannot use aside to FILE.unreadable, as
  // Load does with those it cannot read: "FILE: why (moved to ...)".
  std::string SetAside(const std::string& id, std::string_view why) const;

  const std::filesystem::path& dir() const { return dir_; }
  // The file an object is kept in.
  std::filesystem::path FileOf(const std::string& id) const;

 private:
  explicit KeptFiles(std::filesystem::path dir) : dir_(std::move(dir)) {}
  static std::string SetAsideFile(const std::filesystem::path& path, std::string_view why);

  std::filesystem::path dir_;
};

// `dir` held by this process: an advisory lock on DIR/.lock, which the kernel lets go when the
// process ends, however it ends. A second agent given the same openai.store_dir would write
// over the first's files and remove those it forgets; it is refused at start instead.
class FolderLock {
 public:
  // Makes `dir` as KeptFiles::Open does. Errors name the folder and, when another process
  // holds it, that process's pid.
  static absl::StatusOr<FolderLock> Take(const std::filesystem::path& dir);
  FolderLock(FolderLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FolderLock& operator=(FolderLock&& other) noexcept;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  ~FolderLock();

 private:
  explicit FolderLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace tophat
