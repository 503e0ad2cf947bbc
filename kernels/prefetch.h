// Software prefetch for the GEMV kernels, which read a matrix four rows at a time.
#pragma once

#include <cstdint>

namespace tophat::kernels {

// The kernels read a block of four rows with their bytes interleaved (64 bytes of each row in
// turn), and a decode matrix's rows are short (768 int8 values, 3 KiB in float32): too short
// for a prefetch a fixed distance ahead within a row to ever land, and four interleaved
// streams that restart every block are what the hardware prefetchers follow worst. Out of
// cache the int8 kernels read 7.5 GB/s on one core that way, where a loop touching one byte
// per line read 22 GB/s (docs/benchmarks.md; kernels/gemv_stream_test.cc). So each block
// prefetches the next one whole, in step with its own reads: called for every 64 bytes at `offset` into the current
// block's rows (row0's, rows `row_bytes` apart), it asks for the four lines at 4 * offset
// into the next block. With contiguous rows (the usual layout) the next block's bytes follow
// the current one's, so the whole block arrives as this one is computed. A prefetch past
// the matrix does nothing (it never faults).
[[gnu::always_inline]] inline void PrefetchNextBlock(const void* row0, int64_t row_bytes,
                                                     int64_t offset) {
  const char* ahead = static_cast<const char*>(row0) + 4 * row_bytes + 4 * offset;
  __builtin_prefetch(ahead, 0, 3);
  __builtin_prefetch(ahead + 64, 0, 3);
  __builtin_prefetch(ahead + 128, 0, 3);
  __builtin_prefetch(ahead + 192, 0, 3);
}

}  // namespace tophat::kernels
