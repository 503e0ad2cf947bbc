#include "device_agent/conversation_cache.h"

#include <vector>

#include <catch2/catch.hpp>

#include "models/runtime/model_init.h"

namespace tophat {
namespace {

using Clock = ConversationCache::Clock;

// A kept conversation of `tokens` (all of them in its "caches") holding `bytes` of shallow
// rows, parked as cloud session `session`.
ParkedConversation Kept(std::vector<int32_t> tokens, uint64_t session, int64_t bytes = 1024) {
  ParkedConversation kept;
  kept.length = static_cast<int64_t>(tokens.size());
  kept.tokens = std::move(tokens);
  kept.session_id = session;
  kept.epoch = 1;
  kept.shallow = at::zeros({bytes}, at::kByte);
  return kept;
}

std::vector<int32_t> Range(int32_t first, int32_t count) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < count; ++i) ids.push_back(first + i);
  return ids;
}

TEST_CASE("ConversationCache hands out the longest shared prefix, short of the prompt's end") {
  ConversationCache cache({.min_reuse_tokens = 4});
  std::vector<ConversationCache::Closed> closed;
  const Clock::time_point now = Clock::now();
  cache.Keep(Kept(Range(0, 20), 1), now, closed);
  std::vector<int32_t> other = Range(0, 6);
  other.push_back(99);
  cache.Keep(Kept(other, 2), now, closed);
  CHECK(cache.size() == 2);
  CHECK(closed.empty());

  // A prompt extending conversation 1: all 20 of its positions.
  std::vector<int32_t> next = Range(0, 20);
  next.push_back(500);
  auto taken = cache.Take(next, now, closed);
  REQUIRE(taken.has_value());
  CHECK(taken->conversation.session_id == 1);
  CHECK(taken->reuse == 20);
  CHECK(cache.size() == 1);  // it is the request's now

  // The very same prompt as conversation 2's tokens: all but the last position.
  taken = cache.Take(other, now, closed);
  REQUIRE(taken.has_value());
  CHECK(taken->conversation.session_id == 2);
  CHECK(taken->reuse == 6);
  CHECK(cache.size() == 0);
}

TEST_CASE("ConversationCache shares a copy of a kept conversation and keeps it") {
  ConversationCache cache({.min_reuse_tokens = 4});
  std::vector<ConversationCache::Closed> closed;
  const Clock::time_point now = Clock::now();
  ParkedConversation kept = Kept(Range(0, 10), 5);
  const ModelConfig config = TinyTestConfig();
  kept.input.emplace(config, 2, 16, at::kFloat, at::kCPU);
  kept.output.emplace(config, 1, 16, at::kFloat, at::kCPU);
  const int64_t heads = kept.input->pool().kv_heads();
  const int64_t dim = kept.input->pool().head_dim();
  for (int64_t l = 0; l < 2; ++l) {
    kept.input->Write(l, 0, at::randn({10, heads, dim}), at::randn({10, heads, dim}));
  }
  kept.input->Advance(10);
  kept.output->Write(0, 0, at::randn({10, heads, dim}), at::randn({10, heads, dim}));
  kept.output->Advance(10);
  kept.shallow = at::randn({16, 8});
  const at::Tensor input_rows = kept.input->ExportPositions(0, 10);
  const at::Tensor shallow_rows = kept.shallow.narrow(0, 0, 10).clone();
  cache.Keep(std::move(kept), now, closed);

  std::vector<int32_t> point = Range(0, 10);
  point.push_back(77);
  for (int fork = 0; fork < 3; ++fork) {  // every point gets it; the entry stays
    auto shared = cache.Share(point, now, closed);
    REQUIRE(shared.has_value());
    CHECK(shared->session_id == 5);
    CHECK(shared->reuse == 10);
    CHECK(shared->length == 10);
    CHECK(at::equal(shared->input, input_rows));
    CHECK(shared->output.size(1) == 1);
    CHECK_FALSE(shared->adapter.defined());
    CHECK(at::equal(shared->shallow, shallow_rows));
    shared->shallow.zero_();  // a copy: the kept rows do not change
    CHECK(cache.size() == 1);
  }
  CHECK_FALSE(cache.Share(Range(50, 10), now, closed).has_value());
  auto taken = cache.Take(point, now, closed);
  REQUIRE(taken.has_value());
  CHECK(at::equal(taken->conversation.shallow.narrow(0, 0, 10), shallow_rows));
}

// Kept(tokens, session) with device caches holding every token's position (random rows),
// its last request's prompt `prompt_length` tokens long, on a cloud that forks or not.
ParkedConversation KeptWithCaches(std::vector<int32_t> tokens, uint64_t session,
                                  int64_t prompt_length, bool forkable) {
  ParkedConversation kept = Kept(std::move(tokens), session);
  const ModelConfig config = TinyTestConfig();
  kept.input.emplace(config, 2, kept.length, at::kFloat, at::kCPU);
  kept.output.emplace(config, 1, kept.length, at::kFloat, at::kCPU);
  const int64_t heads = kept.input->pool().kv_heads();
  const int64_t dim = kept.input->pool().head_dim();
  for (KvCache* cache : {&*kept.input, &*kept.output}) {
    for (int64_t l = 0; l < cache->num_layers(); ++l) {
      cache->Write(l, 0, at::randn({kept.length, heads, dim}),
                   at::randn({kept.length, heads, dim}));
    }
    cache->Advance(kept.length);
  }
  kept.shallow = at::randn({kept.length, 8});
  kept.prompt_length = prompt_length;
  kept.forkable = forkable;
  return kept;
}

TEST_CASE(
    "ConversationCache takes a conversation its prompt continues, and copies one it only "
    "shares a beginning with") {
  ConversationCache cache({.min_reuse_tokens = 4});
  std::vector<ConversationCache::Closed> closed;
  const Clock::time_point now = Clock::now();
  // A 20-token prompt and its 10-token answer.
  ParkedConversation kept = KeptWithCaches(Range(0, 30), 7, /*prompt_length=*/20, true);
  const at::Tensor input_rows = kept.input->ExportPositions(0, 30);
  cache.Keep(std::move(kept), now, closed);

  // Another conversation with the first 10 tokens (a system prompt): a copy of those 10
  // positions, and the kept one stays.
  std::vector<int32_t> other = Range(0, 10);
  other.push_back(900);
  ConversationCache::Reuse found = cache.TakeOrShare(other, now, closed);
  CHECK_FALSE(found.taken.has_value());
  REQUIRE(found.shared.has_value());
  CHECK(found.shared->reuse == 10);
  CHECK(found.shared->length == 30);
  CHECK(found.shared->session_id == 7);
  CHECK(found.shared->input.size(2) == 10);  // only the positions to keep
  CHECK(at::equal(found.shared->input, input_rows.narrow(2, 0, 10)));
  CHECK(found.shared->shallow.size(0) == 10);
  CHECK(cache.size() == 1);

  // The same prompt but its last token (an answer regenerated, the last message edited at its
  // end): taken.
  std::vector<int32_t> again = Range(0, 19);
  again.push_back(901);
  found = cache.TakeOrShare(again, now, closed);
  CHECK_FALSE(found.shared.has_value());
  REQUIRE(found.taken.has_value());
  CHECK(found.taken->reuse == 19);
  CHECK(found.taken->conversation.session_id == 7);
  CHECK(cache.size() == 0);

  // Its next turn: taken. And on a cloud that cannot fork, even a shared beginning is taken.
  cache.Keep(KeptWithCaches(Range(0, 30), 8, 20, true), now, closed);
  found = cache.TakeOrShare(Range(0, 40), now, closed);
  REQUIRE(found.taken.has_value());
  CHECK(found.taken->reuse == 30);
  cache.Keep(KeptWithCaches(Range(0, 30), 9, 20, /*forkable=*/false), now, closed);
  found = cache.TakeOrShare(other, now, closed);
  REQUIRE(found.taken.has_value());
  CHECK(found.taken->conversation.session_id == 9);
  CHECK(found.taken->reuse == 10);
  // Nothing kept shares enough: neither.
  found = cache.TakeOrShare(Range(100, 20), now, closed);
  CHECK_FALSE(found.taken.has_value());
  CHECK_FALSE(found.shared.has_value());
  CHECK(closed.empty());
}

TEST_CASE("ConversationCache forgets one kept entry by its session, and its bytes with it") {
  ConversationCache cache({.min_reuse_tokens = 4});
  std::vector<ConversationCache::Closed> closed;
  const Clock::time_point now = Clock::now();
  cache.Keep(Kept(Range(0, 10), 1, 1000), now, closed);
  cache.Keep(Kept(Range(0, 12), 2, 3000), now, closed);
  REQUIRE(cache.bytes() == 4000);

  CHECK_FALSE(cache.Forget(/*epoch=*/2, /*session_id=*/1, now, closed));  // another stream's
  CHECK_FALSE(cache.Forget(1, 3, now, closed));
  CHECK(closed.empty());
  CHECK(cache.Forget(1, 2, now, closed));
  CHECK(closed == std::vector<ConversationCache::Closed>{{1, 2}});
  CHECK(cache.size() == 1);
  CHECK(cache.bytes() == 1000);
  CHECK_FALSE(cache.Forget(1, 2, now, closed));  // gone already
  // What is left is session 1's, whatever prompt asks.
  auto taken = cache.Take(Range(0, 13), now, closed);
  REQUIRE(taken.has_value());
  CHECK(taken->conversation.session_id == 1);
}

TEST_CASE("ConversationCache matches only positions that have a token") {
  // Drafts accepted after a stop token are in the caches (length 24) but not in the tokens
  // (20): a prompt that goes on past the tokens reuses 20, reading nothing beyond them.
  ConversationCache cache({.min_reuse_tokens = 4});
  std::vector<ConversationCache::Closed> closed;
  const Clock::time_point now = Clock::now();
  ParkedConversation kept = Kept(Range(0, 20), 3);
  kept.length = 24;
  cache.Keep(std::move(kept), now, closed);
  auto taken = cache.Take(Range(0, 30), now, closed);
  REQUIRE(taken.has_value());
  CHECK(taken->reuse == 20);
}

TEST_CASE("ConversationCache: too short a shared prefix starts afresh") {
  ConversationCache cache({.min_reuse_tokens = 8});
  std::vector<ConversationCache::Closed> closed;
  cache.Keep(Kept(Range(0, 20), 1), Clock::now(), closed);
  std::vector<int32_t> prompt = Range(0, 7);
  prompt.push_back(1000);
  prompt.push_back(1001);
  CHECK_FALSE(cache.Take(prompt, Clock::now(), closed).has_value());
  CHECK(cache.size() == 1);
}

TEST_CASE("ConversationCache lets the least recently kept go past its bytes and keep-alive") {
  ConversationCache cache({.max_bytes = 3000, .keep_alive_s = 10, .min_reuse_tokens = 1});
  std::vector<ConversationCache::Closed> closed;
  const Clock::time_point t0 = Clock::now();
  cache.Keep(Kept(Range(0, 5), 1, 1000), t0, closed);
  cache.Keep(Kept(Range(100, 5), 2, 1000), t0 + std::chrono::seconds(1), closed);
  cache.Keep(Kept(Range(200, 5), 3, 1500), t0 + std::chrono::seconds(2), closed);
  // 3,500 bytes: the oldest goes, and its cloud session is to be closed.
  REQUIRE(closed.size() == 1);
  CHECK(closed[0] == ConversationCache::Closed{1, 1});
  CHECK(cache.bytes() == 2500);
  // Larger than the whole budget: never kept.
  closed.clear();
  cache.Keep(Kept(Range(300, 5), 4, 4000), t0 + std::chrono::seconds(3), closed);
  REQUIRE(closed.size() == 1);
  CHECK(closed[0].second == 4);
  // Past the keep-alive the rest expire on the next look.
  closed.clear();
  CHECK_FALSE(cache.Take(Range(100, 6), t0 + std::chrono::seconds(30), closed).has_value());
  CHECK(closed.size() == 2);
  CHECK(cache.size() == 0);
  CHECK(cache.bytes() == 0);
}

}  // namespace
}  // namespace tophat
