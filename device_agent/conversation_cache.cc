#include "device_agent/conversation_cache.h"

#include <algorithm>

namespace tophat {

int64_t ConversationCache::BytesOf(const ParkedConversation& conversation) {
  int64_t bytes = 0;
  for (const std::optional<KvCache>* cache :
       {&conversation.input, &conversation.output, &conversation.adapter}) {
    if (cache->has_value()) bytes += (*cache)->StorageBytes();
  }
  if (conversation.shallow.defined()) bytes += conversation.shallow.nbytes();
  return bytes;
}

void ConversationCache::DropFrontLocked(std::vector<Closed>& closed) {
  closed.emplace_back(entries_.front().epoch, entries_.front().session_id);
  bytes_ -= entries_.front().bytes;
  entries_.pop_front();
}

void ConversationCache::ExpireLocked(Clock::time_point now, std::vector<Closed>& closed) {
  const auto keep_alive = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.keep_alive_s));
  // Kept in order of keeping, so the expired ones are at the front.
  while (!entries_.empty() && now - entries_.front().kept_at >= keep_alive) {
    DropFrontLocked(closed);
  }
}

std::optional<ConversationCache::Taken> ConversationCache::Take(std::span<const int32_t> prompt,
                                                                Clock::time_point now,
                                                                std::vector<Closed>& closed) {
  std::lock_guard<std::mutex> lock(mutex_);
  ExpireLocked(now, closed);
  const auto [best, best_reuse] = BestLocked(prompt);
  if (best == entries_.end()) return std::nullopt;
  return TakeLocked(best, best_reuse);
}

ConversationCache::Taken ConversationCache::TakeLocked(
    std::list<ParkedConversation>::iterator entry, int64_t reuse) {
  Taken taken{.conversation = std::move(*entry), .reuse = reuse};
  bytes_ -= taken.conversation.bytes;
  entries_.erase(entry);
  return taken;
}

std::pair<std::list<ParkedConversation>::iterator, int64_t> ConversationCache::BestLocked(
    std::span<const int32_t> prompt) {
  auto best = entries_.end();
  int64_t best_reuse = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    // A conversation's caches may hold positions past its tokens (drafts accepted after a
    // stop token): only positions with a token can match.
    const int64_t limit = std::min({it->length, static_cast<int64_t>(it->tokens.size()),
                                    static_cast<int64_t>(prompt.size()) - 1});
    int64_t shared = 0;
    while (shared < limit && it->tokens[shared] == prompt[shared]) ++shared;
    if (shared > best_reuse) {
      best_reuse = shared;
      best = it;
    }
  }
  if (best_reuse < std::max<int64_t>(1, options_.min_reuse_tokens)) return {entries_.end(), 0};
  return {best, best_reuse};
}

std::optional<ConversationCache::Shared> ConversationCache::Share(
    std::span<const int32_t> prompt, Clock::time_point now, std::vector<Closed>& closed) {
  std::lock_guard<std::mutex> lock(mutex_);
  ExpireLocked(now, closed);
  const auto [best, reuse] = BestLocked(prompt);
  if (best == entries_.end()) return std::nullopt;
  return CopyOf(*best, reuse);
}

std::optional<ConversationCache::Shared> ConversationCache::CopyOf(const ParkedConversation& kept,
                                                                   int64_t reuse) {
  if (!kept.input.has_value() || !kept.output.has_value()) return std::nullopt;
  Shared shared{.reuse = reuse,
                .length = kept.length,
                .session_id = kept.session_id,
                .epoch = kept.epoch,
                .input = kept.input->ExportPositions(0, reuse),
                .output = kept.output->ExportPositions(0, reuse),
                .shallow = kept.shallow.narrow(0, 0, reuse).clone()};
  if (kept.adapter.has_value()) shared.adapter = kept.adapter->ExportPositions(0, reuse);
  return shared;
}

ConversationCache::Reuse ConversationCache::TakeOrShare(std::span<const int32_t> prompt,
                                                        Clock::time_point now,
                                                        std::vector<Closed>& closed) {
  std::lock_guard<std::mutex> lock(mutex_);
  ExpireLocked(now, closed);
  const auto [best, reuse] = BestLocked(prompt);
  if (best == entries_.end()) return {};
  if (!best->forkable || reuse >= best->prompt_length - 1) {
    return {.taken = TakeLocked(best, reuse)};
  }
  return {.shared = CopyOf(*best, reuse)};
}

void ConversationCache::Keep(ParkedConversation conversation, Clock::time_point now,
                             std::vector<Closed>& closed) {
  conversation.bytes = BytesOf(conversation);
  conversation.kept_at = now;
  std::lock_guard<std::mutex> lock(mutex_);
  ExpireLocked(now, closed);
  if (conversation.bytes > options_.max_bytes || options_.max_entries == 0) {
    closed.emplace_back(conversation.epoch, conversation.session_id);
    return;
  }
  bytes_ += conversation.bytes;
  entries_.push_back(std::move(conversation));
  while (bytes_ > options_.max_bytes || entries_.size() > options_.max_entries) {
    DropFrontLocked(closed);
  }
}

bool ConversationCache::Forget(uint64_t epoch, uint64_t session_id, Clock::time_point now,
                               std::vector<Closed>& closed) {
  std::lock_guard<std::mutex> lock(mutex_);
  ExpireLocked(now, closed);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->epoch != epoch || it->session_id != session_id) continue;
    closed.emplace_back(epoch, session_id);
    bytes_ -= it->bytes;
    entries_.erase(it);
    return true;
  }
  return false;
}

size_t ConversationCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

int64_t ConversationCache::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

}  // namespace tophat
