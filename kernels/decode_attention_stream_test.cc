// The CPU decode attention's rate over keys and values that are not in cache, as a decode
// step meets them (every layer's KV read once a step, between the weights): one query of
// bench-110m's shape (12 heads of 64, 12 KV heads) over 1,024 positions in blocks of 16,
// each call on the next of 16 pools (100 MB in all). A measurement, hidden from the default
// run:
//   build/release/kernels/tophat_kernels_test "[.attention_stream]"
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <vector>

#include "kernels/decode_attention.h"
#include "kernels/gemv.h"

namespace tophat::kernels {
namespace {

TEST_CASE("Paged decode attention streams keys and values out of cache", "[.attention_stream]") {
  constexpr int64_t kHeads = 12;
  constexpr int64_t kKvHeads = 12;
  constexpr int64_t kHeadDim = 64;
  constexpr int64_t kBlockSize = 16;
  constexpr int64_t kPositions = 1024;
  constexpr int64_t kBlocks = kPositions / kBlockSize;
  constexpr int kPools = 16;
  std::vector<at::Tensor> keys;
  std::vector<at::Tensor> values;
  for (int p = 0; p < kPools; ++p) {
    keys.push_back(at::randn({kBlocks, kBlockSize, kKvHeads, kHeadDim}));
    values.push_back(at::randn({kBlocks, kBlockSize, kKvHeads, kHeadDim}));
  }
  // Blocks in a scattered order, as a free list hands them out after churn.
  std::vector<int32_t> table(kBlocks);
  for (int64_t b = 0; b < kBlocks; ++b) table[b] = static_cast<int32_t>((b * 37) % kBlocks);
  const at::Tensor q = at::randn({kHeads, kHeadDim});
  at::Tensor out = at::empty({kHeads * kHeadDim});
  const double bytes = 2.0 * kPositions * kKvHeads * kHeadDim * sizeof(float);
  for (const int threads : {1, 2}) {
    SetSingleRowThreads(threads);
    constexpr int kCalls = 640;
    double best = 1e9;
    for (int round = 0; round < 3; ++round) {
      const auto start = std::chrono::steady_clock::now();
      for (int c = 0; c < kCalls; ++c) {
        REQUIRE(PagedDecodeAttention(q, keys[c % kPools], values[c % kPools], table, kPositions,
                                     0.125, out));
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                                    .count() /
                                kCalls);
    }
    std::printf("threads %d: %.1f us a call, %.2f GB/s of keys and values\n", threads,
                best * 1e6, bytes / best / 1e9);
  }
  SetSingleRowThreads(0);
}

}  // namespace
}  // namespace tophat::kernels
