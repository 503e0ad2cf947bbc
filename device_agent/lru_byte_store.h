// Values kept by id for the app that made them, bounded by bytes: past the bound the least
// recently used are forgotten, and one that alone is larger than the bound is not kept. What
// the OpenAI endpoint's kept responses and conversations share (openai_responses.h,
// openai_conversations.h). Not thread-safe: its owner locks.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <utility>

namespace tophat {

template <typename Value>
class LruByteStore {
 public:
  explicit LruByteStore(int64_t max_bytes) : max_bytes_(max_bytes) {}

  // Keeps `value` under `id` for `app`, counted as `bytes`, replacing what was there. False,
  // with nothing kept (what was there gone too), when `bytes` alone exceed the bound.
  bool Put(const std::string& id, const std::string& app, Value value, int64_t bytes) {
    Erase(id);
    entries_.push_front(Entry{.id = id, .app = app, .value = std::move(value), .bytes = 0});
    by_id_[id] = entries_.begin();
    return Resize(id, bytes);
  }

  // The value, made the most recently used; null when `id` is unknown, forgotten, or
  // another app's.
  Value* Find(const std::string& id, const std::string& app) {
    const auto found = by_id_.find(id);
    if (found == by_id_.end() || found->second->app != app) return nullptr;
    entries_.splice(entries_.begin(), entries_, found->second);
    return &found->second->value;
  }

  bool Erase(const std::string& id, const std::string& app) {
    const auto found = by_id_.find(id);
    if (found == by_id_.end() || found->second->app != app) return false;
    return Erase(id);
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
      ++forgotten_;
      return false;
    }
    while (bytes_ > max_bytes_) {
      const std::string oldest = entries_.back().id;
      Erase(oldest);
      ++forgotten_;
    }
    return by_id_.contains(id);
  }

  size_t size() const { return entries_.size(); }
  int64_t bytes() const { return bytes_; }
  // Values forgotten for the bound (not those erased) since the start.
  int64_t forgotten() const { return forgotten_; }

 private:
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
};

}  // namespace tophat
