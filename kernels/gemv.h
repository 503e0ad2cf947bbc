// Single-row linear layer for decode: y = x W^T (+ bias), x of one row.
//
// Why not at::linear: for one row OpenBLAS sgemm packs (copies) the whole weight matrix
// before multiplying, which reads it twice and reached 11-17 GB/s of a measured 66 GB/s
// here (docs/benchmarks.md). Decode is bound by reading the weights once, so this kernel
// streams each weight row exactly once, in memory order, with rows split across threads.
#pragma once

#include <ATen/ATen.h>

namespace tophat::kernels {

// x: [1, K] float32 CPU; weight: [N, K] float32 CPU contiguous; bias: [N] or undefined.
// Returns [1, N]. Other dtypes/devices/shapes fall back to at::linear.
at::Tensor LinearSingleRow(const at::Tensor& x, const at::Tensor& weight,
                           const at::Tensor& bias = {});

// Copies `t` into memory backed by transparent huge pages (2 MiB, MADV_HUGEPAGE), which
// read ~25% faster than 4 KiB pages when streamed (fewer TLB misses). Returns `t` itself for
// non-CPU tensors or when the mapping fails.
at::Tensor CopyToHugePages(const at::Tensor& t);

}  // namespace tophat::kernels
