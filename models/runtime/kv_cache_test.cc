#include "models/runtime/kv_cache.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "models/runtime/model_init.h"

#include <catch2/catch.hpp>

namespace tophat {
namespace {

TEST_CASE("KV block pool validates its sizes and reports its footprint", "[kv_cache]") {
  const ModelConfig config = TinyTestConfig();  // 2 KV heads x 16
  auto pool = KvBlockPool::Create(config, 3, 5, 4, at::kFloat, at::kCPU);
  REQUIRE(pool.ok());
  CHECK((*pool)->num_blocks() == 5);
  CHECK((*pool)->block_size() == 4);
  CHECK((*pool)->num_layers() == 3);
  CHECK((*pool)->keys(2).sizes() == at::IntArrayRef({5, 4, 2, 16}));
  CHECK((*pool)->values(0).sizes() == at::IntArrayRef({5, 4, 2, 16}));
  CHECK((*pool)->BlocksFor(0) == 0);
  CHECK((*pool)->BlocksFor(4) == 1);
  CHECK((*pool)->BlocksFor(5) == 2);
  // K + V, 3 layers, 4 positions, 2 heads x 16 floats.
  CHECK(KvBlockPool::BytesPerBlock(config, 3, 4, at::kFloat) == 2 * 3 * 4 * 2 * 16 * 4);
  CHECK(KvBlockPool::BytesPerBlock(config, 3, 4, at::kBFloat16) == 2 * 3 * 4 * 2 * 16 * 2);
  // A submodel with no layers gets a valid, empty pool.
  CHECK(KvBlockPool::Create(config, 0, 5, 4, at::kFloat, at::kCPU).ok());

  const std::vector<std::tuple<int64_t, int64_t, int64_t>> bad_sizes = {
      {-1, 5, 4}, {3, 0, 4}, {3, 5, 0}, {3, int64_t{1} << 32, 1}};
  for (auto [layers, blocks, block_size] : bad_sizes) {
    auto bad = KvBlockPool::Create(config, layers, blocks, block_size, at::kFloat, at::kCPU);
    INFO(layers << " " << blocks << " " << block_size);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  }
  // 2^49 bytes per tensor: more than any machine's memory, refused by arithmetic before
  // anything is allocated (so it also holds under AddressSanitizer and with overcommit).
  auto huge = KvBlockPool::Create(config, 4, int64_t{1} << 20, int64_t{1} << 20, at::kFloat,
                                  at::kCPU);
  REQUIRE_FALSE(huge.ok());
  CHECK(huge.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(huge.status().message()), Catch::Contains("1048576 blocks"));
  CHECK_THAT(std::string(huge.status().message()), Catch::Contains("bytes of memory"));
}

TEST_CASE("A paged KV cache holds the blocks it is given", "[kv_cache]") {
  auto pool = KvBlockPool::Create(TinyTestConfig(), 2, 8, 4, at::kFloat, at::kCPU);
  REQUIRE(pool.ok());
  KvCache cache(*pool);
  CHECK(cache.paged());
  CHECK(cache.capacity() == 0);
  CHECK(cache.num_layers() == 2);
  CHECK(cache.block_table().empty());
  cache.AppendBlock(5);
  cache.AppendBlock(2);
  CHECK(cache.capacity() == 8);
  CHECK(std::vector<int32_t>(cache.block_table().begin(), cache.block_table().end()) ==
        std::vector<int32_t>{5, 2});
  CHECK(&cache.pool() == pool->get());
  CHECK_THROWS_AS(cache.AppendBlock(8), c10::Error);
  CHECK_THROWS_AS(cache.AppendBlock(-1), c10::Error);
  CHECK(cache.capacity() == 8);

  // A moved cache keeps its blocks.
  KvCache moved = std::move(cache);
  CHECK(moved.capacity() == 8);
}

TEST_CASE("A paged cache copies another's prefix into its own blocks (a fork)", "[kv_cache]") {
  auto pool = KvBlockPool::Create(TinyTestConfig(), 2, 8, 4, at::kFloat, at::kCPU);
  REQUIRE(pool.ok());
  const int64_t heads = (*pool)->kv_heads();
  const int64_t dim = (*pool)->head_dim();
  KvCache parked(*pool);
  parked.AppendBlock(3);
  parked.AppendBlock(1);
  const at::Tensor k = at::randn({6, heads, dim});
  const at::Tensor v = at::randn({6, heads, dim});
  for (int64_t l = 0; l < 2; ++l) parked.Write(l, 0, k, v);
  parked.Advance(6);

  KvCache fork(*pool);
  fork.AppendBlock(0);
  fork.AppendBlock(6);
  REQUIRE(fork.CopyPrefixFrom(parked, 5).ok());
  CHECK(fork.length() == 5);
  for (int64_t l = 0; l < 2; ++l) {
    CHECK(at::equal(fork.Keys(l, 5), parked.Keys(l, 5)));
    CHECK(at::equal(fork.Values(l, 5), parked.Values(l, 5)));
  }
  // Its own blocks: writing past the prefix leaves the parked cache as it was.
  fork.Write(0, 5, at::zeros({1, heads, dim}), at::zeros({1, heads, dim}));
  CHECK(at::equal(parked.Keys(0, 6), k));

  KvCache not_empty(*pool);
  not_empty.AppendBlock(2);
  not_empty.AppendBlock(4);
  not_empty.Advance(1);
  CHECK(not_empty.CopyPrefixFrom(parked, 4).code() == absl::StatusCode::kFailedPrecondition);
  KvCache too_small(*pool);
  too_small.AppendBlock(5);
  CHECK(too_small.CopyPrefixFrom(parked, 6).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(too_small.CopyPrefixFrom(parked, 7).code() == absl::StatusCode::kOutOfRange);
  KvCache contiguous(TinyTestConfig(), 2, 16, at::kFloat, at::kCPU);
  CHECK(contiguous.CopyPrefixFrom(parked, 4).code() == absl::StatusCode::kFailedPrecondition);

  // The pool's own block copy (what a pipeline's later stage does for a fork): every layer,
  // a block that is both source and destination read before it is written.
  const at::Tensor block3 = (*pool)->keys(1)[3].clone();
  const at::Tensor block1 = (*pool)->keys(1)[1].clone();
  const std::vector<int32_t> from = {3, 1};
  const std::vector<int32_t> to = {1, 7};
  REQUIRE((*pool)->CopyBlocks(from, to).ok());
  CHECK(at::equal((*pool)->keys(1)[1], block3));
  CHECK(at::equal((*pool)->keys(1)[7], block1));
  CHECK(at::equal((*pool)->values(0)[1], (*pool)->values(0)[3]));
  const std::vector<int32_t> outside = {8};
  const std::vector<int32_t> one = {0};
  CHECK((*pool)->CopyBlocks(outside, one).code() == absl::StatusCode::kInvalidArgument);
  CHECK((*pool)->CopyBlocks(from, one).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("ReleaseUnusedBlocks returns the trailing blocks the length does not need",
          "[kv_cache]") {
  auto pool = KvBlockPool::Create(TinyTestConfig(), 1, 16, 4, at::kFloat, at::kCPU);
  REQUIRE(pool.ok());
  KvCache cache(*pool);
  for (int32_t id : {9, 3, 14, 0}) cache.AppendBlock(id);
  cache.Advance(13);  // needs 4 blocks
  CHECK(cache.ReleaseUnusedBlocks().empty());
  REQUIRE(cache.Truncate(5).ok());  // needs 2
  std::vector<int32_t> released = {42};  // the out-param is appended to, not cleared
  CHECK(cache.ReleaseUnusedBlocks(released) == 2);
  CHECK(released == std::vector<int32_t>{42, 14, 0});
  CHECK(cache.capacity() == 8);
  CHECK(cache.length() == 5);
  REQUIRE(cache.Truncate(4).ok());  // exactly one block
  CHECK(cache.ReleaseUnusedBlocks() == std::vector<int32_t>{3});
  cache.Clear();
  CHECK(cache.ReleaseUnusedBlocks() == std::vector<int32_t>{9});
  CHECK(cache.capacity() == 0);
  CHECK(cache.ReleaseUnusedBlocks().empty());
}

TEST_CASE("A contiguous KV cache is one private block", "[kv_cache]") {
  KvCache cache(TinyTestConfig(), 2, 10, at::kFloat, at::kCPU);
  CHECK_FALSE(cache.paged());
  CHECK(cache.capacity() == 10);
  CHECK(cache.pool().num_blocks() == 1);
  CHECK(cache.pool().block_size() == 10);
  CHECK(cache.block_table().size() == 1);
  CHECK_THROWS_AS(cache.AppendBlock(0), c10::Error);
  cache.Advance(3);
  CHECK(cache.ReleaseUnusedBlocks().empty());
  cache.Clear();
  CHECK(cache.ReleaseUnusedBlocks().empty());
  CHECK(cache.capacity() == 10);
  CHECK_FALSE(cache.Truncate(1).ok());

  KvCache empty(TinyTestConfig(), 2, 0, at::kFloat, at::kCPU);
  CHECK(empty.capacity() == 0);
  CHECK_THROWS(KvCache(TinyTestConfig(), 2, -1, at::kFloat, at::kCPU));
}

TEST_CASE("A growing KV cache holds nothing until asked, then grows by at least half, keeping "
          "its rows, up to its maximum",
          "[kv_cache]") {
  const ModelConfig config = TinyTestConfig();  // 2 KV heads x 16
  KvCache cache = KvCache::Growing(config, 2, /*max_capacity=*/100, /*growth_step=*/8,
                                   at::kFloat, at::kCPU);
  CHECK(cache.growing());
  CHECK_FALSE(cache.paged());
  CHECK(cache.capacity() == 0);
  CHECK(cache.StorageBytes() == 0);
  REQUIRE(cache.Reserve(5).ok());
  CHECK(cache.capacity() == 8);  // one growth step
  // K + V, 2 layers, 8 positions, 2 heads x 16 floats.
  CHECK(cache.StorageBytes() == 2 * 2 * 8 * 2 * 16 * 4);
  at::manual_seed(5);
  const at::Tensor k = at::randn({30, 2, 16});
  const at::Tensor v = at::randn({30, 2, 16});
  for (int64_t l = 0; l < 2; ++l) cache.Write(l, 0, k.narrow(0, 0, 7), v.narrow(0, 0, 7));
  cache.Advance(7);
  REQUIRE(cache.Reserve(8).ok());
  CHECK(cache.capacity() == 8);  // already room
  // 9 > 8: max(9, 8 + 4) = 12, rounded up to the step: 16.
  REQUIRE(cache.Reserve(9).ok());
  CHECK(cache.capacity() == 16);
  for (int64_t l = 0; l < 2; ++l) {
    CHECK(at::equal(cache.Keys(l, 7), k.narrow(0, 0, 7)));
    CHECK(at::equal(cache.Values(l, 7), v.narrow(0, 0, 7)));
  }
  // max(30, 16 + 8) = 30, rounded up: 32.
  REQUIRE(cache.Reserve(30).ok());
  CHECK(cache.capacity() == 32);
  for (int64_t l = 0; l < 2; ++l) cache.Write(l, 7, k.narrow(0, 7, 23), v.narrow(0, 7, 23));
  cache.Advance(23);
  // max(33, 48) = 48, within the maximum.
  REQUIRE(cache.Reserve(33).ok());
  CHECK(cache.capacity() == 48);
  // max(49, 72) = 72, under the maximum.
  REQUIRE(cache.Reserve(49).ok());
  CHECK(cache.capacity() == 72);
  // max(73, 108) = 108 > 100: capped at 100.
  REQUIRE(cache.Reserve(73).ok());
  CHECK(cache.capacity() == 100);
  for (int64_t l = 0; l < 2; ++l) {
    CHECK(at::equal(cache.Keys(l, 30), k));
    CHECK(at::equal(cache.Values(l, 30), v));
  }
  const absl::Status too_many = cache.Reserve(101);
  CHECK(too_many.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(too_many.message()), Catch::Contains("needs 101 positions"));
  CHECK(cache.capacity() == 100);
  CHECK(cache.length() == 30);

  // A fixed contiguous cache only checks.
  KvCache fixed(config, 2, 10, at::kFloat, at::kCPU);
  CHECK(fixed.Reserve(10).ok());
  CHECK(fixed.Reserve(11).code() == absl::StatusCode::kResourceExhausted);
  CHECK(fixed.capacity() == 10);
  CHECK_THROWS_AS(KvCache::Growing(config, 2, 0, 8, at::kFloat, at::kCPU), c10::Error);
}

TEST_CASE("Importing KV rows into a growing cache grows it", "[kv_cache]") {
  const ModelConfig config = TinyTestConfig();
  KvCache cache = KvCache::Growing(config, 1, 64, 4, at::kFloat, at::kCPU);
  at::manual_seed(6);
  const at::Tensor rows = at::randn({2, 1, 10, 2, 16});
  REQUIRE(cache.ImportPositions(0, rows).ok());
  CHECK(cache.length() == 10);
  CHECK(cache.capacity() == 12);
  CHECK(at::equal(cache.Keys(0, 10), rows[0][0]));
  const absl::Status past = cache.ImportPositions(10, at::randn({2, 1, 60, 2, 16}));
  CHECK(past.code() == absl::StatusCode::kResourceExhausted);
  CHECK(cache.length() == 10);
}

TEST_CASE("Rows written across blocks read back in sequence order", "[kv_cache]") {
  at::manual_seed(3);
  const ModelConfig config = TinyTestConfig();
  auto pool = KvBlockPool::Create(config, 2, 9, 3, at::kFloat, at::kCPU);
  REQUIRE(pool.ok());
  KvCache cache(*pool);
  for (int32_t id : {7, 1, 4, 8, 2}) cache.AppendBlock(id);  // 15 positions
  at::Tensor k = at::randn({13, 2, 16});
  at::Tensor v = at::randn({13, 2, 16});
  // Chunks of 2, 6 and 5 rows: they start and end inside blocks.
  int64_t position = 0;
  for (int64_t n : {2, 6, 5}) {
    for (int64_t layer = 0; layer < 2; ++layer) {
      cache.Write(layer, position, k.narrow(0, position, n) * (layer + 1),
                  v.narrow(0, position, n) * (layer + 1));
    }
    position += n;
    cache.Advance(n);
  }
  for (int64_t layer = 0; layer < 2; ++layer) {
    CHECK(at::equal(cache.Keys(layer, 13), k * (layer + 1)));
    CHECK(at::equal(cache.Values(layer, 13), v * (layer + 1)));
    CHECK(at::equal(cache.Keys(layer, 2), k.narrow(0, 0, 2) * (layer + 1)));
  }
  // With the block ids given as a tensor (a GPU step uploads them once for every layer),
  // the rows are the same; ids that do not span the positions are ignored.
  const at::Tensor ids = at::tensor(std::vector<int32_t>{7, 1, 4, 8, 2, 0}, at::kInt);
  for (int64_t layer = 0; layer < 2; ++layer) {
    CHECK(at::equal(cache.Keys(layer, 13, ids), k * (layer + 1)));
    CHECK(at::equal(cache.Values(layer, 13, ids), v * (layer + 1)));
    CHECK(at::equal(cache.Keys(layer, 13, ids.narrow(0, 0, 2)), k * (layer + 1)));
  }
  // The given ids are the ones read: with the first two blocks swapped, rows 0-2 come from
  // block 1 (the sequence's rows 3-5).
  const at::Tensor swapped = at::tensor(std::vector<int32_t>{1, 7, 4, 8, 2}, at::kInt);
  CHECK(at::equal(cache.Keys(0, 13, swapped).narrow(0, 0, 3), k.narrow(0, 3, 3)));
  // Row 4 lives in the second block (id 1) at offset 1.
  CHECK(at::equal((*pool)->keys(0)[1][1], k[4]));
  // Positions inside the first block are a view of the pool, not a copy.
  CHECK(cache.Keys(0, 3).data_ptr() == (*pool)->keys(0)[7].data_ptr());
}

TEST_CASE("Exported KV rows put back after a truncation restore the cache exactly",
          "[kv_cache]") {
  const ModelConfig config = TinyTestConfig();
  for (const bool paged : {false, true}) {
    INFO("paged " << paged);
    std::shared_ptr<KvBlockPool> pool =
        *KvBlockPool::Create(config, 2, 8, 3, at::kFloat, at::kCPU);
    KvCache cache = paged ? KvCache(pool) : KvCache(config, 2, 24, at::kFloat, at::kCPU);
    if (paged) {
      for (int32_t b = 0; b < 8; ++b) cache.AppendBlock(b);
    }
    at::manual_seed(3);
    const at::Tensor k = at::randn({10, config.num_key_value_heads, config.head_dim});
    const at::Tensor v = at::randn({10, config.num_key_value_heads, config.head_dim});
    for (int64_t l = 0; l < 2; ++l) cache.Write(l, 0, k, v);
    cache.Advance(10);
    const at::Tensor branch = cache.ExportPositions(6, 4);
    CHECK(branch.sizes() == at::IntArrayRef({2, 2, 4, config.num_key_value_heads,
                                             config.head_dim}));
    REQUIRE(cache.Truncate(6).ok());
    // Another branch overwrites positions 6..8.
    const at::Tensor other = at::zeros({3, config.num_key_value_heads, config.head_dim});
    for (int64_t l = 0; l < 2; ++l) cache.Write(l, 6, other, other);
    cache.Advance(3);
    REQUIRE(cache.Truncate(6).ok());
    REQUIRE(cache.ImportPositions(6, branch).ok());
    CHECK(cache.length() == 10);
    for (int64_t l = 0; l < 2; ++l) {
      CHECK(at::equal(cache.Keys(l, 10), k));
      CHECK(at::equal(cache.Values(l, 10), v));
    }
    CHECK_FALSE(cache.ImportPositions(11, branch).ok());  // past the end: a gap
    CHECK_FALSE(cache.ImportPositions(0, at::zeros({2, 3, 4, 2, 16})).ok());  // wrong layers
  }
}

}  // namespace
}  // namespace tophat
