// Which few-row steps of a weight matrix take the small-batch GEMM kernel
// (kernels/small_batch_gemm.h) instead of BLAS. Neither wins everywhere: the kernel streams
// any shape's weights at the same rate, while cuBLAS's choice for a shape can be much faster
// or much slower (on an H100 at batch 1 it read o_proj at 1.6 TB/s and the larger matrices
// at 2.9), and the balance moves with the card and the row count. So it is measured once a
// submodel is on its GPU, per matrix shape and row count, as a decode step runs them: a
// CUDA graph of back-to-back launches (no host dispatch between them), the kernel taken only
// where it is faster by a margin (a near tie stays with BLAS, which every other path uses).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"

namespace tophat {

// Seconds per launch of each path for rows 1, 2, ... (index rows - 1).
struct SmallBatchTimings {
  std::vector<double> kernel_seconds;
  std::vector<double> blas_seconds;
};

// Bit r set (1 <= r <= the timings' length) where the kernel took at most (1 - margin) of
// BLAS's time for r rows. Pure: tested on any host.
uint32_t SmallBatchRowsMask(std::span<const double> kernel_seconds,
                            std::span<const double> blas_seconds, double margin = 0.03);

// The row counts whose bits a mask of SmallBatchRowsMask (WeightMatrix::small_batch_rows)
// sets, ascending. Pure.
std::vector<int64_t> SmallBatchRows(uint32_t mask);

// What a decode step does with a role's products besides storing them, and so what the
// timing compares: the kernel's form that does it in the same launch (kernels/small_batch_gemm.h)
// against cuBLAS followed by the kernel that does it. For gate_up the SwiGLU form against
// GEMM + SwiGluOut; for qkv the rotary form against GEMM + RotaryQkvToCache (rows written to
// a scratch cache of max_rows slots; heads, kv_heads and head_dim give the layout). A launch
// at batch 1 costs a few microseconds against a matrix read of 10 to 80, so timing the plain
// product alone could hand the step cuBLAS and the extra kernel where the fused form wins.
struct SmallBatchEpilogue {
  enum class Kind { kNone, kSwiGlu, kRotaryQkv };
  Kind kind = Kind::kNone;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
};

// Times both paths for rows 1..max_rows (at most kernels::kSmallBatchGemmMaxRows) on
// `weights`, matrices [N, K] of one shape on one CUDA device (every layer's matrix of one
// role), with `biases` ([N] each, one per weight) or none: best of three replays of a graph
// of 20 launches, each launch on the next of the weights. A step reads each layer's matrix
// once between the others, from memory, not from L2 (50 MB on an H100, which one o_proj of
// Llama-3-8B fits): 20 launches on one matrix would time L2. Errors: a CPU tensor or a
// build without CUDA kernels (Unimplemented), no weights, or weights and biases that do not
// pair, an epilogue whose layout does not match the weights (InvalidArgument), a shape or
// dtype the kernel or the epilogue's kernels do not take (FailedPrecondition), a capture or
// launch the runtime refuses (Internal).
absl::StatusOr<SmallBatchTimings> TimeSmallBatchGemm(std::span<const at::Tensor> weights,
                                                     std::span<const at::Tensor> biases,
                                                     int64_t max_rows,
                                                     const SmallBatchEpilogue& epilogue = {});

}  // namespace tophat
