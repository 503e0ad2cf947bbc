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

// A layer's qkv projection of a few rows straight into what attention reads, in one launch:
// the products of x [rows, K] and qkv_weight [(heads + 2 kv_heads) head_dim, K] (+ qkv_bias,
// or undefined) rotated and stored as RotaryQkvToCache (kernels/rope.h) stores a qkv buffer
// holding them: queries into q_out [rows, heads, head_dim], keys and values into the slots
// of key_slots / value_slots ([num_slots, kv_heads, head_dim]; none for a negative slot).
// To the bit what SmallBatchGemmOut followed by RotaryQkvToCache gives, with no qkv buffer.
// The same conditions as SmallBatchGemmOut, and RotaryQkvToCache's on the rest; false,
// having done nothing, otherwise.
bool SmallBatchGemmRotaryQkvToCache(const at::Tensor& x, const at::Tensor& qkv_weight,
                                    const at::Tensor& qkv_bias, const at::Tensor& cos,
                                    const at::Tensor& sin, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, at::Tensor& key_slots,
                                    at::Tensor& value_slots, const at::Tensor& slots,
                                    at::Tensor& q_out);

}  // namespace tophat::kernels
