// Host memory copies of a step's hidden states, spread over LibTorch's intra-op threads when
// they are large. A prompt chunk of Llama-3-8B's states is 16 MiB (2,048 positions x 4,096 x
// bfloat16); one thread copies it at about 10 GB/s, some 1.5 ms, and a GPU engine step does
// it twice on its own thread (gathering the input into pinned staging, filling the result
// messages) while the raw forward it is measured against does neither. The intra-op threads
// sit idle on a GPU cloud while its engine thread copies, and a server's memory serves several
// threads at once. Below kParallelCopyBytes (a decode step of a few sessions) it all stays on
// the caller's thread: waking the pool would cost more than the copy.
//
// Here rather than beside the engine: ATen's parallel_for is an inline header that runs in
// parallel only in files compiled with -fopenmp, as this library's are.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"

namespace tophat::kernels {

// Work of at least this many bytes in all is split across threads.
inline constexpr int64_t kParallelCopyBytes = int64_t{2} << 20;
// About this much work a task: enough to pay for the hand-off, small enough to keep a few
// threads busy on one chunk.
inline constexpr int64_t kCopySliceBytes = int64_t{1} << 20;

// fn(i) for every i in [0, n), where each call's work is about `bytes_each` bytes of copying:
// in parallel over LibTorch's intra-op threads (about kCopySliceBytes of work a task) when
// n * bytes_each reaches kParallelCopyBytes, else in order on this thread. fn must not throw,
// and calls for different i must touch disjoint memory.
void ForEachHostCopy(int64_t n, int64_t bytes_each, absl::FunctionRef<void(int64_t)> fn);

struct HostCopy {
  void* to = nullptr;
  const void* from = nullptr;
  int64_t bytes = 0;
};

// Performs every copy (ranges must not overlap), cut into slices of at most kCopySliceBytes
// that ForEachHostCopy spreads. `slices` is the caller's scratch, kept between calls so that
// nothing is allocated once it has grown.
void CopyAll(std::span<const HostCopy> copies, std::vector<HostCopy>& slices);

}  // namespace tophat::kernels
