#include "kernels/decode_attention.h"
#include "kernels/gemv.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace tophat::kernels {
namespace {

TEST_CASE("Decode attention matches the composite form with GQA and cache views", "[kernels]") {
  at::manual_seed(0);
  // Two threads even on a one-core machine: 300 positions x 4 heads x 32 split the heads.
  SetSingleRowThreads(2);
  for (int64_t positions : {1, 9, 200, 300}) {
    for (int64_t kv_heads : {1, 2, 4}) {
      const int64_t heads = 4;
      const int64_t hd = 32;
      // Views into a larger cache, as the engine passes them.
      at::Tensor cache_k = at::randn({512, kv_heads, hd});
      at::Tensor cache_v = at::randn({512, kv_heads, hd});
      at::Tensor keys = cache_k.narrow(0, 0, positions);
      at::Tensor values = cache_v.narrow(0, 0, positions);
      at::Tensor q = at::randn({heads, hd});
      at::Tensor out = at::empty({heads * hd});
      const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
      REQUIRE(DecodeAttention(q, keys, values, scale, out));
      const int64_t group = heads / kv_heads;
      at::Tensor k = keys.repeat_interleave(group, 1);    // [P, H, hd]
      at::Tensor v = values.repeat_interleave(group, 1);
      at::Tensor p = at::softmax(at::einsum("hd,phd->hp", {q, k}) * scale, -1);
      at::Tensor expected = at::einsum("hp,phd->hd", {p, v}).reshape({-1});
      INFO("positions=" << positions << " kv_heads=" << kv_heads);
      CHECK(at::allclose(out, expected, 1e-5, 1e-5));
    }
  }
  at::Tensor out = at::empty({8});
  CHECK_FALSE(DecodeAttention(at::randn({2, 4}, at::kDouble), at::randn({3, 1, 4}),
                              at::randn({3, 1, 4}), 0.5, out));
  SetSingleRowThreads(0);
}

// Block ids 0..num_blocks-1 in a shuffled order, as a free list hands them out after churn.
std::vector<int32_t> ShuffledIds(int64_t num_blocks, uint32_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  return ids;
}

TEST_CASE("Paged decode attention matches the composite form over shuffled blocks",
          "[kernels][paged]") {
  at::manual_seed(2);
  const int64_t heads = 4;
  const int64_t hd = 32;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (int64_t block_size : {1, 3, 16, 64}) {
    for (int64_t positions : {1, 9, 16, 17, 200}) {
      for (int64_t kv_heads : {1, 2, 4}) {
        const int64_t needed = (positions + block_size - 1) / block_size;
        const int64_t num_blocks = needed + 5;  // blocks the sequence does not hold, too
        at::Tensor key_blocks = at::randn({num_blocks, block_size, kv_heads, hd});
        at::Tensor value_blocks = at::randn({num_blocks, block_size, kv_heads, hd});
        std::vector<int32_t> table = ShuffledIds(num_blocks, static_cast<uint32_t>(positions));
        table.resize(needed + 1);  // one spare block past the last position
        at::Tensor q = at::randn({heads, hd});
        at::Tensor out = at::empty({heads * hd});
        REQUIRE(PagedDecodeAttention(q, key_blocks, value_blocks, table, positions, scale, out));

        // The sequence's rows, gathered into one contiguous [positions, kv_heads, hd] tensor.
        at::Tensor ids = at::tensor(std::vector<int64_t>(table.begin(), table.end()), at::kLong);
        at::Tensor keys = key_blocks.index_select(0, ids).reshape({-1, kv_heads, hd}).narrow(
            0, 0, positions);
        at::Tensor values = value_blocks.index_select(0, ids).reshape({-1, kv_heads, hd}).narrow(
            0, 0, positions);
        const int64_t group = heads / kv_heads;
        at::Tensor k = keys.repeat_interleave(group, 1);
        at::Tensor v = values.repeat_interleave(group, 1);
        at::Tensor p = at::softmax(at::einsum("hd,phd->hp", {q, k}) * scale, -1);
        at::Tensor expected = at::einsum("hp,phd->hd", {p, v}).reshape({-1});
        INFO("block_size=" << block_size << " positions=" << positions
                           << " kv_heads=" << kv_heads);
        CHECK(at::allclose(out, expected, 1e-5, 1e-5));
        // The contiguous kernel is the one-block case of the same loops: bit-identical.
        at::Tensor contiguous = at::empty({heads * hd});
        REQUIRE(DecodeAttention(q, keys, values, scale, contiguous));
        CHECK(at::equal(out, contiguous));

        // A sliding window: rows [first, positions) only, from inside a block, the same bits
        // as the contiguous kernel over those rows alone.
        if (positions < 2) continue;
        const int64_t first = positions / 2 + 1;
        at::Tensor windowed = at::empty({heads * hd});
        REQUIRE(PagedDecodeAttention(q, key_blocks, value_blocks, table, positions, scale, windowed,
                                     first));
        const at::Tensor seen_keys = keys.narrow(0, first, positions - first);
        const at::Tensor seen_values = values.narrow(0, first, positions - first);
        at::Tensor seen = at::empty({heads * hd});
        REQUIRE(DecodeAttention(q, seen_keys.contiguous(), seen_values.contiguous(), scale, seen));
        CHECK(at::equal(windowed, seen));
        CHECK_FALSE(at::allclose(windowed, out, 1e-3, 1e-3));
      }
    }
  }
}

TEST_CASE("Paged decode attention declines what it cannot read", "[kernels][paged]") {
  at::Tensor key_blocks = at::randn({4, 8, 2, 16});
  at::Tensor value_blocks = at::randn({4, 8, 2, 16});
  at::Tensor q = at::randn({4, 16});
  at::Tensor out = at::zeros({4 * 16});
  const std::vector<int32_t> two = {3, 1};
  CHECK(PagedDecodeAttention(q, key_blocks, value_blocks, two, 16, 0.25, out));
  out.zero_();
  // The table covers 16 positions, not 17.
  CHECK_FALSE(PagedDecodeAttention(q, key_blocks, value_blocks, two, 17, 0.25, out));
  // An id outside the pool.
  const std::vector<int32_t> bad = {3, 4};
  CHECK_FALSE(PagedDecodeAttention(q, key_blocks, value_blocks, bad, 9, 0.25, out));
  const std::vector<int32_t> negative = {-1};
  CHECK_FALSE(PagedDecodeAttention(q, key_blocks, value_blocks, negative, 1, 0.25, out));
  // Not float32, or not [blocks, block_size, kv_heads, head_dim].
  CHECK_FALSE(PagedDecodeAttention(q, key_blocks.to(at::kDouble), value_blocks.to(at::kDouble),
                                   two, 9, 0.25, out));
  CHECK_FALSE(PagedDecodeAttention(q, key_blocks[0], value_blocks[0], two, 8, 0.25, out));
  CHECK_FALSE(PagedDecodeAttention(q, key_blocks.transpose(2, 3), value_blocks.transpose(2, 3),
                                   two, 9, 0.25, out));
  // Nothing was written by the refusals.
  CHECK(out.abs().sum().item<float>() == 0.0f);
}

TEST_CASE("Off a GPU the batched paged decode kernel has no workspace and declines",
          "[kernels]") {
  // The CPU path attends chunk by chunk; nothing here may claim the CUDA kernel's buffers.
  CHECK_FALSE(PagedDecodeWorkspace(32, 8, 128, at::kCPU).defined());
  CHECK_FALSE(PagedDecodeSplitCounters(at::kCPU).defined());
  CHECK(PagedDecodeSplitCount(1, 32, 8, 128, at::Tensor()) == 1);
  const at::Tensor q = at::randn({1, 4, 32});
  const at::Tensor blocks = at::randn({2, 4, 2, 32});
  const at::Tensor tables = at::zeros({1, 2}, at::kInt);
  const at::Tensor lens = at::full({1}, 5, at::kInt);
  at::Tensor out = at::zeros({1, 4 * 32});
  CHECK_FALSE(PagedDecodeAttentionBatch(q, blocks, blocks, tables, lens, 0, 0.2, out,
                                        at::zeros({1024}), at::zeros({64}, at::kInt)));
  CHECK(out.abs().sum().item<float>() == 0.0f);
}

TEST_CASE("The fused split merge is on unless operators turn it off", "[kernels]") {
  struct Restore {
    ~Restore() { SetFusedSplitMerge(true); }
  } restore;
  CHECK(FusedSplitMerge());
  SetFusedSplitMerge(false);
  CHECK_FALSE(FusedSplitMerge());
  SetFusedSplitMerge(true);
  CHECK(FusedSplitMerge());
}

TEST_CASE("Gemma's GELU gate matches gelu(gate, tanh) * up", "[kernels]") {
  at::manual_seed(3);
  at::Tensor gate_up = at::randn({3, 2 * 50}) * 4;
  at::Tensor expected = at::gelu(gate_up.narrow(1, 0, 50), "tanh") * gate_up.narrow(1, 50, 50);
  at::Tensor out = at::empty({3, 50});
  GeluTanhGluOut(gate_up, out);
  CHECK(at::allclose(out, expected, 1e-5, 1e-5));
  // Elsewhere (here float64) ATen's own.
  at::Tensor gd = at::randn({2, 8}, at::kDouble);
  at::Tensor od = at::empty({2, 4}, at::kDouble);
  GeluTanhGluOut(gd, od);
  CHECK(at::allclose(od, at::gelu(gd.narrow(1, 0, 4), "tanh") * gd.narrow(1, 4, 4)));
}

TEST_CASE("Fused SwiGLU matches silu(gate) * up", "[kernels]") {
  at::manual_seed(1);
  at::Tensor gate_up = at::randn({3, 2 * 50}) * 4;
  at::Tensor expected = at::silu(gate_up.narrow(1, 0, 50)) * gate_up.narrow(1, 50, 50);
  CHECK(at::allclose(SwiGlu(gate_up), expected, 1e-5, 1e-5));
  at::Tensor gd = at::randn({2, 8}, at::kDouble);
  CHECK(at::allclose(SwiGlu(gd), at::silu(gd.narrow(1, 0, 4)) * gd.narrow(1, 4, 4)));
}

}  // namespace
}  // namespace tophat::kernels
