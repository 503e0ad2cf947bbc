// Finished conversations kept for their next turn (configs: conversation_cache): the device's
// KV caches and shallow states of every position, and the id of the cloud session parked with
// the same positions (ParkSession, docs/protocol.md). A request whose prompt starts with a
// kept conversation's tokens takes it, truncates both sides to the prefix they share and
// computes and sends only the rest, as vLLM's automatic prefix caching does for a server; a
// chat's second turn then does not re-send its first. Matching is by token ids, so it works
// for the SDK and the OpenAI endpoint alike, and a prompt that only shares a beginning (an
// edited last message, a regenerated answer) reuses that beginning. A prompt that parts from
// a kept conversation within that conversation's own last prompt (another conversation
// with the same system prompt or document) takes a copy instead (TakeOrShare), its cloud
// session forked, and the kept one stays for its own next turn.
//
// Bounded by the bytes the entries hold and by a keep-alive; beyond either, the least
// recently kept go first. What goes is handed back for the caller to close on the cloud.
// Lossless: the positions reused are the ones a fresh request would compute from the same
// tokens (tests/serving_test.cc checks the tokens against a fresh request's).
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include <ATen/ATen.h>

#include "models/runtime/kv_cache.h"

namespace tophat {

struct ParkedConversation {
  // The conversation so far; positions [0, length) are in every cache below, in `shallow`
  // and in the parked cloud session's KV.
  std::vector<int32_t> tokens;
  int64_t length = 0;
  uint64_t session_id = 0;  // the cloud session parked with it
  uint64_t epoch = 0;       // the stream it is parked on (a newer stream has lost it)
  std::optional<KvCache> input;
  std::optional<KvCache> output;
  std::optional<KvCache> adapter;  // when the drafter ran
  at::Tensor shallow;              // rows [0, length): what a replay re-sends
  // Where the last request's prompt ended in `tokens` (its answer follows), and whether the
  // cloud holding the session forks parked sessions (Hello.forks_sessions): TakeOrShare.
  int64_t prompt_length = 0;
  bool forkable = false;
  int64_t bytes = 0;               // device memory it holds
  std::chrono::steady_clock::time_point kept_at{};
};

struct ConversationCacheOptions {
  int64_t max_bytes = 512LL << 20;
  double keep_alive_s = 300;
  int64_t min_reuse_tokens = 16;  // shorter shared prefixes are not worth a resume
  size_t max_entries = 256;
};

class ConversationCache {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ConversationCache(ConversationCacheOptions options) : options_(options) {}

  struct Taken {
    ParkedConversation conversation;
    int64_t reuse = 0;  // positions to keep: the shared prefix, short of the prompt's end
  };
  // A cloud session to close: (epoch, session id).
  using Closed = std::pair<uint64_t, uint64_t>;

  // Removes and returns the kept conversation sharing the longest prefix with `prompt`, if
  // it shares at least min_reuse_tokens. At least the prompt's last position is left to
  // compute (its output gives the first new token). Expired entries go to `closed`.
  std::optional<Taken> Take(std::span<const int32_t> prompt, Clock::time_point now,
                            std::vector<Closed>& closed);
  // A copy of what Take would hand over, the entry left in place: for several requests that
  // all extend one kept conversation at once (an outline's points, a prompt's choices), each
  // forking its cloud session (ForkSession) instead of taking it. The device's KV of the
  // positions to keep, [0, reuse), as ExportPositions rows, and their shallow rows, copied.
  struct Shared {
    int64_t reuse = 0;
    int64_t length = 0;  // of the kept conversation (and its parked session)
    uint64_t session_id = 0;
    uint64_t epoch = 0;
    at::Tensor input;  // [2, layers, reuse, heads, dim]
    at::Tensor output;
    at::Tensor adapter;  // undefined when the drafter did not run
    at::Tensor shallow;  // rows [0, reuse)
  };
  std::optional<Shared> Share(std::span<const int32_t> prompt, Clock::time_point now,
                              std::vector<Closed>& closed);
  // For a request that may extend a kept conversation: Take's conversation when the prompt
  // continues it (it shares the conversation's last prompt, or all of that but its last
  // position: a next turn, a regenerated answer) or its cloud cannot fork it; else Share's
  // copy, the entry left for its own next turn (the prompt parted from it earlier: another
  // conversation sharing its beginning). Neither when nothing matches.
  struct Reuse {
    std::optional<Taken> taken;
    std::optional<Shared> shared;
  };
  Reuse TakeOrShare(std::span<const int32_t> prompt, Clock::time_point now,
                    std::vector<Closed>& closed);
  // Keeps `conversation` (its bytes computed here); what that pushes out, or what expired,
  // goes to `closed`. An entry larger than max_bytes by itself is not kept (and closed).
  void Keep(ParkedConversation conversation, Clock::time_point now, std::vector<Closed>& closed);

  // Removes the entry of session `session_id` on stream `epoch` (a prompt kept for its
  // choices, Agent::KeepPrompt), its session and any expired one's to `closed`; false when
  // it is gone already.
  bool Forget(uint64_t epoch, uint64_t session_id, Clock::time_point now,
              std::vector<Closed>& closed);

  size_t size() const;
  int64_t bytes() const;

  // Device bytes `conversation` holds: its caches' storage and its shallow rows.
  static int64_t BytesOf(const ParkedConversation& conversation);

 private:
  void ExpireLocked(Clock::time_point now, std::vector<Closed>& closed);
  // The entry sharing the longest prefix with `prompt` (at least min_reuse_tokens), and how
  // long that prefix is; entries_.end() when none.
  std::pair<std::list<ParkedConversation>::iterator, int64_t> BestLocked(
      std::span<const int32_t> prompt);
  void DropFrontLocked(std::vector<Closed>& closed);
  Taken TakeLocked(std::list<ParkedConversation>::iterator entry, int64_t reuse);
  // nullopt for an entry without both caches.
  static std::optional<Shared> CopyOf(const ParkedConversation& kept, int64_t reuse);

  const ConversationCacheOptions options_;
  mutable std::mutex mutex_;
  std::list<ParkedConversation> entries_;  // least recently kept first
  int64_t bytes_ = 0;
};

}  // namespace tophat
