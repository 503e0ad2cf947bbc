#include "kernels/host_copy.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <vector>

#include <ATen/Parallel.h>

namespace tophat::kernels {
namespace {

TEST_CASE("CopyAll copies every range exactly, across slice edges and beside untouched bytes",
          "[kernels][host_copy]") {
  // Copies of a few bytes, of exactly a slice, and of several slices and a bit: above
  // kParallelCopyBytes in all (threads) and, for the first two alone, below it.
  const std::vector<int64_t> sizes = {3, kCopySliceBytes, 2 * kCopySliceBytes + 777, 5000};
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  REQUIRE(total >= kParallelCopyBytes);
  std::vector<uint8_t> source(static_cast<size_t>(total));
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 7 + 1);
  for (size_t used : {size_t{2}, sizes.size()}) {
    INFO(used << " copies");
    // Each copy lands with a guard byte before and after it, in reverse order.
    std::vector<uint8_t> destination(static_cast<size_t>(total) + 2 * sizes.size(), 0xEE);
    std::vector<HostCopy> copies;
    int64_t from = 0;
    int64_t to = static_cast<int64_t>(destination.size());
    for (size_t c = 0; c < used; ++c) {
      to -= sizes[c] + 1;
      copies.push_back({.to = destination.data() + to, .from = source.data() + from,
                        .bytes = sizes[c]});
      from += sizes[c];
      --to;  // the guard below this copy
    }
    std::vector<HostCopy> slices;
    CopyAll(copies, slices);
    std::vector<bool> written(destination.size(), false);
    for (const HostCopy& copy : copies) {
      const auto* got = static_cast<const uint8_t*>(copy.to);
      const auto* want = static_cast<const uint8_t*>(copy.from);
      CHECK(std::equal(want, want + copy.bytes, got));
      const auto offset = static_cast<size_t>(got - destination.data());
      std::fill(written.begin() + offset, written.begin() + offset + copy.bytes, true);
    }
    size_t untouched = 0;
    for (size_t i = 0; i < destination.size(); ++i) {
      if (!written[i] && destination[i] == 0xEE) ++untouched;
    }
    CHECK(untouched == static_cast<size_t>(std::count(written.begin(), written.end(), false)));
    // No slice is larger than kCopySliceBytes: 1 + 1 + 3 + 1 of them for all four copies.
    CHECK(slices.size() == (used == 2 ? 2u : 6u));
    for (const HostCopy& slice : slices) CHECK(slice.bytes <= kCopySliceBytes);
  }
}

TEST_CASE("ForEachHostCopy calls each index once, on this thread below the threshold and "
          "across the intra-op threads above it",
          "[kernels][host_copy]") {
  const int64_t n = 64;
  for (int64_t bytes_each : {int64_t{1024}, kParallelCopyBytes / 16}) {
    const bool large = n * bytes_each >= kParallelCopyBytes;
    INFO(bytes_each << " bytes each");
    std::vector<std::atomic<int>> calls(n);
    std::atomic<int> in_parallel{0};
    ForEachHostCopy(n, bytes_each, [&](int64_t i) {
      calls[static_cast<size_t>(i)].fetch_add(1);
      if (at::in_parallel_region()) in_parallel.fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) CHECK(calls[static_cast<size_t>(i)].load() == 1);
    if (!large) {
      CHECK(in_parallel.load() == 0);
    } else if (at::get_num_threads() > 1) {
      CHECK(in_parallel.load() > 0);
    }
  }
  // Nothing to do, and one call alone, stay here.
  int count = 0;
  ForEachHostCopy(0, kParallelCopyBytes, [&](int64_t) { ++count; });
  ForEachHostCopy(1, 4 * kParallelCopyBytes, [&](int64_t) { ++count; });
  CHECK(count == 1);
}

}  // namespace
}  // namespace tophat::kernels
