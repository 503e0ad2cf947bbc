#include "kernels/prompt_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/gemv.h"
#include "kernels/test_inputs.h"

namespace tophat::kernels {
namespace {

struct Shape {
  int64_t heads;
  int64_t kv_heads;
  int64_t head_dim;
  int64_t n;
  int64_t past;
  int64_t block_size;
  int64_t window;
  bool sinks;
};

// A sequence's paged keys and values, in shuffled blocks with spares around them.
struct PagedSequence {
  at::Tensor key_blocks;
  at::Tensor value_blocks;
  std::vector<int32_t> table;
};

PagedSequence MakeSequence(int64_t positions, int64_t block_size, int64_t kv_heads,
                           int64_t head_dim, uint32_t seed) {
  const int64_t needed = (positions + block_size - 1) / block_size;
  const int64_t num_blocks = needed + 3;
  PagedSequence s;
  s.key_blocks = at::randn({num_blocks, block_size, kv_heads, head_dim});
  s.value_blocks = at::randn({num_blocks, block_size, kv_heads, head_dim});
  s.table.resize(static_cast<size_t>(num_blocks));
  std::iota(s.table.begin(), s.table.end(), 0);
  std::shuffle(s.table.begin(), s.table.end(), std::mt19937(seed));
  s.table.resize(static_cast<size_t>(needed));
  return s;
}

// The sequence's first `positions` rows, [positions, kv_heads, head_dim].
at::Tensor Gather(const at::Tensor& blocks, const std::vector<int32_t>& table, int64_t positions) {
  const at::Tensor ids = at::tensor(std::vector<int64_t>(table.begin(), table.end()), at::kLong);
  return blocks.index_select(0, ids)
      .reshape({-1, blocks.size(2), blocks.size(3)})
      .narrow(0, 0, positions);
}

// transformers' eager attention in float64: scores, the causal (and window) mask, a sink
// column, softmax, the column dropped, the weighted values.
at::Tensor Reference(const at::Tensor& q, const PagedSequence& s, int64_t past, double scale,
                     int64_t window, const at::Tensor& sinks) {
  const int64_t n = q.size(0);
  const int64_t heads = q.size(1);
  const int64_t total = past + n;
  const int64_t group = heads / s.key_blocks.size(2);
  const at::Tensor k =
      Gather(s.key_blocks, s.table, total).repeat_interleave(group, 1).to(at::kDouble);
  const at::Tensor v =
      Gather(s.value_blocks, s.table, total).repeat_interleave(group, 1).to(at::kDouble);
  at::Tensor scores = at::einsum("ihd,jhd->hij", {q.to(at::kDouble), k}) * scale;  // [H, n, total]
  const at::Tensor key_pos = at::arange(total, at::kLong).unsqueeze(0);
  const at::Tensor query_pos = at::arange(past, total, at::kLong).unsqueeze(1);
  at::Tensor hidden = key_pos > query_pos;
  if (window > 0) hidden.logical_or_(key_pos <= query_pos - window);
  scores.masked_fill_(hidden.unsqueeze(0), -INFINITY);
  at::Tensor probs;
  if (sinks.defined()) {
    const at::Tensor column = sinks.to(at::kDouble).view({heads, 1, 1}).expand({heads, n, 1});
    probs = at::softmax(at::cat({scores, column}, -1), -1).narrow(-1, 0, total);
  } else {
    probs = at::softmax(scores, -1);
  }
  return at::einsum("hij,jhd->ihd", {probs, v}).reshape({n, -1}).to(at::kFloat);
}

TEST_CASE("Prompt attention matches eager attention on every instruction set", "[kernels]") {
  at::manual_seed(3);
  const std::vector<Shape> shapes = {
      {4, 4, 32, 2, 0, 16, 0, false},     // verification-sized, no history
      {4, 4, 32, 33, 0, 16, 0, false},    // a tile and one more row
      {8, 2, 64, 70, 13, 7, 0, false},    // GQA, history, blocks not a power of two
      {6, 2, 36, 40, 100, 16, 0, true},   // dimensions not a multiple of 8; sinks
      {12, 1, 10, 9, 5, 3, 0, false},     // a group wider than a NEON tile; 10 dimensions
      {4, 2, 32, 80, 50, 16, 20, false},  // a sliding window inside the chunk
      {4, 2, 32, 5, 200, 8, 64, true},    // a window over the history; sinks
      {3, 1, 8, 130, 0, 64, 0, false},    // a group of 3 (tiles split positions' heads)
      {2, 2, 16, 300, 0, 32, 0, false},   // several key blocks per tile
      // One tile over a long history: its keys split between the threads, then merged.
      {8, 2, 64, 5, 1000, 16, 0, true},
      {8, 2, 64, 3, 1000, 16, 300, false},
      {4, 4, 64, 2, 700, 16, 0, false},
  };
  // Two threads even on a one-core machine, so that the split is taken.
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  for (CpuIsa isa : SupportedCpuIsas()) {
    for (const Shape& shape : shapes) {
      const PagedSequence s =
          MakeSequence(shape.past + shape.n, shape.block_size, shape.kv_heads, shape.head_dim,
                       static_cast<uint32_t>(shape.n + shape.past));
      // A view as the layers pass it: heads padded apart, positions further.
      const at::Tensor q =
          at::randn({shape.n, shape.heads, shape.head_dim + 4}).narrow(2, 0, shape.head_dim);
      const at::Tensor sinks = shape.sinks ? at::randn({shape.heads}) : at::Tensor();
      const double scale = 1.0 / std::sqrt(static_cast<double>(shape.head_dim));
      at::Tensor out = at::full({shape.n, shape.heads * shape.head_dim}, NAN);
      INFO("isa=" << CpuIsaName(isa) << " heads=" << shape.heads << " kv_heads=" << shape.kv_heads
                  << " head_dim=" << shape.head_dim << " n=" << shape.n << " past=" << shape.past
                  << " block=" << shape.block_size << " window=" << shape.window
                  << " sinks=" << shape.sinks);
      REQUIRE(PagedPromptAttentionWithIsa(isa, q, s.key_blocks, s.value_blocks, s.table, shape.past,
                                          scale, out, shape.window, 0, sinks));
      const at::Tensor expected = Reference(q, s, shape.past, scale, shape.window, sinks);
      CHECK(at::allclose(out, expected, 1e-5, 2e-5));
      CHECK((out - expected).abs().max().item<float>() < 2e-5f);
    }
  }
  at::set_num_threads(threads);
}

TEST_CASE("Prompt attention gives a query the same bits however its prompt is split", "[kernels]") {
  at::manual_seed(5);
  for (int64_t window : {0, 40}) {
    // Three KV heads of a group of 3: tiles hold different queries' heads in each split.
    const int64_t n = 150;
    const int64_t past = 17;
    const PagedSequence s = MakeSequence(past + n, 16, 3, 32, 9);
    const at::Tensor q = at::randn({n, 9, 32});
    const at::Tensor sinks = at::randn({9});
    at::Tensor whole = at::empty({n, 9 * 32});
    REQUIRE(PagedPromptAttention(q, s.key_blocks, s.value_blocks, s.table, past, 0.2, whole, window,
                                 0, sinks));
    for (int64_t split : {1, 2, 37, 64, 100, 149}) {
      at::Tensor parts = at::empty_like(whole);
      at::Tensor head = parts.narrow(0, 0, split);
      at::Tensor tail = parts.narrow(0, split, n - split);
      REQUIRE(PagedPromptAttention(q.narrow(0, 0, split), s.key_blocks, s.value_blocks, s.table,
                                   past, 0.2, head, window, 0, sinks));
      REQUIRE(PagedPromptAttention(q.narrow(0, split, n - split), s.key_blocks, s.value_blocks,
                                   s.table, past + split, 0.2, tail, window, 0, sinks));
      INFO("window=" << window << " split=" << split);
      CHECK(at::equal(parts, whole));
    }
  }
}

TEST_CASE("Prompt attention refuses what it does not compute", "[kernels]") {
  const PagedSequence s = MakeSequence(20, 8, 2, 16, 1);
  const at::Tensor q = at::randn({4, 4, 16});
  at::Tensor out = at::empty({4, 64});
  REQUIRE(PagedPromptAttention(q, s.key_blocks, s.value_blocks, s.table, 16, 0.25, out));
  // Softcapped scores (Gemma 2) are the composite path's.
  CHECK_FALSE(
      PagedPromptAttention(q, s.key_blocks, s.value_blocks, s.table, 16, 0.25, out, 0, 50.0));
  CHECK_FALSE(PagedPromptAttention(q.to(at::kDouble), s.key_blocks, s.value_blocks, s.table, 16,
                                   0.25, out));
  // A table short of the rows (three blocks of 8 hold 24), or naming a block the pool lacks.
  CHECK(PagedPromptAttention(q, s.key_blocks, s.value_blocks, s.table, 20, 0.25, out));
  CHECK_FALSE(PagedPromptAttention(q, s.key_blocks, s.value_blocks, s.table, 21, 0.25, out));
  std::vector<int32_t> bad = s.table;
  bad.back() = 99;
  CHECK_FALSE(PagedPromptAttention(q, s.key_blocks, s.value_blocks, bad, 16, 0.25, out));
  at::Tensor small = at::empty({4, 32});
  CHECK_FALSE(PagedPromptAttention(q, s.key_blocks, s.value_blocks, s.table, 16, 0.25, small));
  // Heads that do not group over the KV heads.
  CHECK_FALSE(PagedPromptAttention(at::randn({4, 3, 16}), s.key_blocks, s.value_blocks, s.table, 16,
                                   0.25, small));
}

// The composite form AttendChunk takes without the kernel: gather, bmm, mask, softmax, bmm.
void Composite(const at::Tensor& q, const PagedSequence& s, int64_t past, double scale,
               at::Tensor& out) {
  const int64_t n = q.size(0);
  const int64_t total = past + n;
  const int64_t kv_heads = s.key_blocks.size(2);
  const int64_t group = q.size(1) / kv_heads;
  const int64_t hd = q.size(2);
  const at::Tensor keys = Gather(s.key_blocks, s.table, total);
  const at::Tensor values = Gather(s.value_blocks, s.table, total);
  const at::Tensor qh =
      q.view({n, kv_heads, group, hd}).permute({1, 0, 2, 3}).reshape({kv_heads, n * group, hd});
  at::Tensor scores = at::bmm(qh, keys.permute({1, 2, 0})).mul_(scale);
  const at::Tensor key_pos = at::arange(total, at::kLong);
  const at::Tensor query_pos = at::arange(past, total, at::kLong).unsqueeze(1);
  const at::Tensor hidden = key_pos.unsqueeze(0) > query_pos;
  scores.view({kv_heads, n, group, total}).masked_fill_(hidden.view({1, n, 1, total}), -INFINITY);
  const at::Tensor probs = at::softmax(scores, -1, at::kFloat);
  const at::Tensor context = at::bmm(probs, values.permute({1, 0, 2}));
  out.copy_(context.view({kv_heads, n, group, hd}).permute({1, 0, 2, 3}).reshape({n, -1}));
}

TEST_CASE("Prompt attention against the composite form (timing)", "[.prompt_attention]") {
  at::manual_seed(4);
  struct Case {
    const char* name;
    int64_t heads, kv_heads, hd, n, past;
  };
  const Case cases[] = {
      {"bench-110m, 512-token prompt", 12, 12, 64, 512, 0},
      {"bench-110m, 2,048-token prompt", 12, 12, 64, 2048, 0},
      {"Llama-3-8B heads, 512 after 1,536", 32, 8, 128, 512, 1536},
      {"Llama-3-8B heads, verify 4 after 1,024", 32, 8, 128, 4, 1024},
      {"bench-110m, verify 5 after 1,100", 12, 12, 64, 5, 1100},
      {"bench-110m, verify 8 after 1,100", 12, 12, 64, 8, 1100},
      {"bench-110m, 12 after 1,100", 12, 12, 64, 12, 1100},
      {"bench-110m, 16 after 1,100", 12, 12, 64, 16, 1100},
      {"bench-110m, 32 after 1,100", 12, 12, 64, 32, 1100},
  };
  std::printf("%-40s %12s %12s %8s %10s\n", "case", "composite ms", "kernel ms", "ratio",
              "GFLOP/s");
  for (const Case& c : cases) {
    const PagedSequence s = MakeSequence(c.past + c.n, 16, c.kv_heads, c.hd, 7);
    const at::Tensor q = at::randn({c.n, c.heads, c.hd});
    at::Tensor out = at::empty({c.n, c.heads * c.hd});
    at::Tensor expected = at::empty_like(out);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.hd));
    Composite(q, s, c.past, scale, expected);
    REQUIRE(PagedPromptAttention(q, s.key_blocks, s.value_blocks, s.table, c.past, scale, out));
    CHECK(at::allclose(out, expected, 1e-4, 1e-4));
    const double composite =
        testing::BestSeconds(5, [&] { Composite(q, s, c.past, scale, expected); });
    const double kernel = testing::BestSeconds(5, [&] {
      PagedPromptAttention(q, s.key_blocks, s.value_blocks, s.table, c.past, scale, out);
    });
    // Products the causal shape needs: each query sees past + i + 1 keys, twice (scores and
    // values), hd multiply-adds each.
    const double products = static_cast<double>(c.heads) * c.hd *
                            (static_cast<double>(c.n) * c.past + c.n * (c.n + 1) / 2.0) * 2;
    std::printf("%-40s %12.3f %12.3f %7.2fx %10.1f\n", c.name, composite * 1e3, kernel * 1e3,
                composite / kernel, 2 * products / kernel / 1e9);
  }
}

}  // namespace
}  // namespace tophat::kernels
