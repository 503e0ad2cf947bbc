// Values kept by id for the app that made them, bounded by bytes: past the bound the least
// recently used are forgotten, and one that alone is larger than the bound is not kept. What
// the OpenAI endpoint's kept responses and conversations share (openai_responses.h,
// openai_conversations.h). With files (KeepIn), each value kept is also a file, written when it
// is put or changes and removed when it is erased or forgotten, so that the agent's next
// process takes them back (openai.store_dir). Not thread-safe: its owner locks, and the files
// are written under that lock, so that they change in the order the values do.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "device_agent/kept_files.h"

namespace tophat {

template <typename Value>
class LruByteStore {
 public:
  explicit LruByteStore(int64_t max_bytes) : max_bytes_(max_bytes) {}

  // Takes back the values `files` hold, the least recently written first (so that the bound,
  // if lowered since, forgets the oldest, and their files go), read by `decode` (a file it
  // refuses is set aside) and counted by `bytes_of`, as Put counts them. From then on every
  // value kept is also kept in `files`, as `encode` makes it; a file that cannot be written or
  // removed is reported to `on_error` (the value stays in memory) and counted. Returns
  // "FILE: why" for each file set aside. Call before the first Put.
  std::vector<std::string> KeepIn(
      KeptFiles files, const std::function<absl::StatusOr<Value>(const KeptFiles::Json&)>& decode,
      const std::function<int64_t(const std::string& id, const std::string& app, const Value&)>&
          bytes_of,
      std::function<KeptFiles::Json(const Value&)> encode,
      std::function<void(const absl::Status&)> on_error) {
    KeptFiles::Loaded loaded = files.Load();
    std::vector<std::string> set_aside = std::move(loaded.unreadable);
    std::vector<std::string> ids;
    for (KeptFiles::Object& object : loaded.objects) {
      absl::StatusOr<Value> value = decode(object.value);
      if (!value.ok()) {
        set_aside.push_back(files.SetAside(object.id, std::string(value.status().message())));
        continue;
      }
      const int64_t bytes = bytes_of(object.id, object.app, *value);
      Put(object.id, object.app, *std::move(value), bytes);
      ids.push_back(object.id);
    }
    for (const std::string& id : ids) {
      if (!Contains(id)) (void)files.Remove(id);
    }
    files_.emplace(Files{
        .files = std::move(files), .encode = std::move(encode), .on_error = std::move(on_error)});
    return set_aside;
  }

  // Keeps `value` under `id` for `app`, counted as `bytes`, replacing what was there. False,
  // with nothing kept (what was there gone too), when `bytes` alone exceed the bound.
  bool Put(const std::string& id, const std::string& app, Value value, int64_t bytes) {
    Erase(id);
    entries_.push_front(Entry{.id = id, .app = app, .value = std::move(value), .bytes = 0});
    by_id_[id] = entries_.begin();
    return Resize(id, bytes);
  }

  // The value, made the most recently used (its file too, so that the next process ranks it
  // so); null when `id` is unknown, forgotten, or another app's.
  Value* Find(const std::string& id, const std::string& app) {
    const auto found = by_id_.find(id);
    if (found == by_id_.end() || found->second->app != app) return nullptr;
    entries_.splice(entries_.begin(), entries_, found->second);
    if (files_) Report(files_->files.Touch(id));
    return &found->second->value;
  }

  bool Erase(const std::string& id, const std::string& app) {
    const auto found = by_id_.find(id);
    if (found == by_id_.end() || found->second->app != app) return false;
    Erase(id);
    RemoveFile(id);
    return true;
  }

  // After the value under `id` (just found, so the most recently used) changed: counts it as
  // `bytes`; forgets it when it alone is past the bound, else the least recently used while
  // they are. False when it was forgotten.
  bool Resize(const std::string& id, int64_t bytes) {
    const auto found = by_id_.find(id);
    if (found == by_id_.end()) return false;
    bytes_ += bytes - found->second->bytes;
    found->second->bytes = bytes;
    if (bytes > max_bytes_) {
      Erase(id);
      RemoveFile(id);
      ++forgotten_;
      return false;
    }
    while (bytes_ > max_bytes_) {
      const std::string oldest = entries_.back().id;
      Erase(oldest);
      RemoveFile(oldest);
      ++forgotten_;
    }
    if (!by_id_.contains(id)) return false;
    WriteFile(*found->second);
    return true;
  }

  bool Contains(const std::string& id) const { return by_id_.contains(id); }
  size_t size() const { return entries_.size(); }
  int64_t bytes() const { return bytes_; }
  // Values forgotten for the bound (not those erased) since the start.
  int64_t forgotten() const { return forgotten_; }
  // Files that could not be written or removed since KeepIn.
  int64_t file_errors() const { return file_errors_; }

 private:
  struct Files {
    KeptFiles files;
    std::function<KeptFiles::Json(const Value&)> encode;
    std::function<void(const absl::Status&)> on_error;
  };
  struct Entry;

  void Report(const absl::Status& status) {
    if (status.ok()) return;
    ++file_errors_;
    if (files_->on_error) files_->on_error(status);
  }
  void WriteFile(const Entry& entry) {
    if (files_) Report(files_->files.Write(entry.id, entry.app, files_->encode(entry.value)));
  }
  void RemoveFile(const std::string& id) {
    if (files_) Report(files_->files.Remove(id));
  }

  struct Entry {
    std::string id;
    std::string app;
    Value value;
    int64_t bytes = 0;
  };

  bool Erase(const std::string& id) {
    const auto found = by_id_.find(id);
    if (found == by_id_.end()) return false;
    bytes_ -= found->second->bytes;
    entries_.erase(found->second);
    by_id_.erase(found);
    return true;
  }

  const int64_t max_bytes_;
  std::list<Entry> entries_;  // most recently used first
  std::unordered_map<std::string, typename std::list<Entry>::iterator> by_id_;
  int64_t bytes_ = 0;
  int64_t forgotten_ = 0;
  std::optional<Files> files_;
  int64_t file_errors_ = 0;
};

}  // namespace tophat
