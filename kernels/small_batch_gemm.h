// The small-batch GEMM of a decode step over tensors (kernels/small_batch_gemm_cuda.cuh has
// the kernel and why it exists).
#pragma once

#include <ATen/ATen.h>

#include "kernels/small_batch_gemm_cuda.cuh"  // kSmallBatchGemmMaxRows

namespace tophat::kernels {

// out [rows, N] = x [rows, K] · weightᵀ (+ bias [N]) through the small-batch kernel, when it
// takes these tensors: all on one CUDA device in float16 or bfloat16, 1 to
// kSmallBatchGemmMaxRows (8) rows, weight [N, K] contiguous with K a multiple of 8, x's and
// out's rows contiguous. Returns false, having done nothing, otherwise (a CPU tensor, a
// build without CUDA kernels): the caller takes BLAS. Throws c10::Error when the launch
// fails.
bool SmallBatchGemmOut(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                       at::Tensor& out);

// out [rows, N] = silu(x · gateᵀ) * (x · upᵀ) for gate_up = [gate; up] ([2N, K], the gate
// rows first), in one launch of the same kernel: to the bit what SmallBatchGemmOut into a
// [rows, 2N] buffer followed by SwiGluOut gives, without the intermediate. The same
// conditions, and false in the same cases.
bool SmallBatchGemmSwiGluOut(const at::Tensor& x, const at::Tensor& gate_up, at::Tensor& out);

}  // namespace tophat::kernels
