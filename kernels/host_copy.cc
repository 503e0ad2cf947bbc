#include "kernels/host_copy.h"

#include <algorithm>
#include <cstring>

#include <ATen/Parallel.h>

namespace tophat::kernels {

void ForEachHostCopy(int64_t n, int64_t bytes_each, absl::FunctionRef<void(int64_t)> fn) {
  if (n < 2 || n * bytes_each < kParallelCopyBytes) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kCopySliceBytes / std::max<int64_t>(1, bytes_each));
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fn(i);
  });
}

void CopyAll(std::span<const HostCopy> copies, std::vector<HostCopy>& slices) {
  slices.clear();
  int64_t total = 0;
  for (const HostCopy& copy : copies) {
    total += copy.bytes;
    for (int64_t done = 0; done < copy.bytes; done += kCopySliceBytes) {
      slices.push_back({.to = static_cast<char*>(copy.to) + done,
                        .from = static_cast<const char*>(copy.from) + done,
                        .bytes = std::min(kCopySliceBytes, copy.bytes - done)});
    }
  }
  const auto n = static_cast<int64_t>(slices.size());
  ForEachHostCopy(n, n == 0 ? 0 : total / n, [&](int64_t i) {
    const HostCopy& slice = slices[static_cast<size_t>(i)];
    std::memcpy(slice.to, slice.from, static_cast<size_t>(slice.bytes));
  });
}

}  // namespace tophat::kernels
