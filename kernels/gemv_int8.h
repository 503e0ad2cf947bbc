// Linear layers over int8 weights with one float32 scale per output channel (row), for the
// device's memory: y = x (scale ⊙ W)^T (+ bias), x float32.
//
// Weight-only quantization, as TensorRT-LLM's int8 weight-only mode: the activations stay
// float32, each weight row is stored as round(w / s) in [-127, 127] with s = max|w| / 127.
// A quarter of float32's bytes, so decode, which streams every weight once per token, reads
// a quarter as much. The kernel converts each int8 to float32 in registers and multiplies
// with x's float32 values; the row's scale is applied once to the finished sum. What it
// computes is exactly the float32 product with the dequantized matrix, up to summation
// order: "the model as quantized" is that dequantized model.
//
// Few rows of x (decode, a speculative round's verification) stream the weights once through
// the int8 kernel, every x row against each block of weight rows while it is in cache. Many
// rows (a prompt) dequantize the matrix once and go to BLAS.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

#include "kernels/gemv.h"

namespace tophat::kernels {

struct Int8Matrix {
  at::Tensor values;  // [N, K] int8, rows contiguous
  at::Tensor scale;   // [N] float32

  bool defined() const { return values.defined(); }
  int64_t rows() const { return values.size(0); }
  int64_t cols() const { return values.size(1); }
  // scale ⊙ values as float32 [N, K] (rows x, for a part of the rows).
  at::Tensor Dequantize() const;
};

// Per-row absmax quantization of a floating [N, K] matrix (any float dtype, CPU or not; the
// result is on the CPU). A row of zeros gets scale 0 and zeros.
Int8Matrix QuantizeInt8PerRow(const at::Tensor& weight);

// Stacks matrices with the same K along rows (q, k, v into qkv).
Int8Matrix ConcatRows(const std::vector<Int8Matrix>& parts);

// Rows of x at most this many take the int8 kernel; more dequantize and multiply by BLAS.
inline constexpr int64_t kInt8KernelMaxRows = 16;

// Whether the int8 kernels take these inputs: x [M <= kInt8KernelMaxRows, K] float32 on the
// CPU with unit column stride, out [M, N] float32 contiguous, bias [N] float32 or undefined.
// What LinearInt8Out and LinearW8A8Out check before their kernels.
bool Int8KernelTakes(const at::Tensor& x, const Int8Matrix& weight, const at::Tensor& bias,
                     const at::Tensor& out);

// x: [M, K] float32 CPU; bias: [N] float32 or undefined; out: [M, N] float32 contiguous.
// Allocates nothing for M <= kInt8KernelMaxRows.
void LinearInt8Out(const at::Tensor& x, const Int8Matrix& weight, const at::Tensor& bias,
                   at::Tensor& out);
at::Tensor LinearInt8(const at::Tensor& x, const Int8Matrix& weight, const at::Tensor& bias = {});

// The kernel with a named instruction set (tests); M <= kInt8KernelMaxRows.
at::Tensor LinearInt8WithIsa(CpuIsa isa, const at::Tensor& x, const Int8Matrix& weight,
                             const at::Tensor& bias = {});

// bfloat16 weights with float32 activations ("bfloat16 weights, float32 compute"): `weight`
// [N, K] bfloat16 CPU, rows contiguous; x, bias and out as LinearInt8Out. Each weight widens
// to float32 exactly (bfloat16 is float32's upper half), so this is the float32 product with
// the bfloat16 matrix, at half float32's bytes per weight. Few rows take the kernel, many
// go to BLAS a block of rows at a time, as int8. `bf16_prompts`: a prompt's rows (at least
// kF32GemmMinRows) are rounded to bfloat16 and multiplied in bfloat16 where the CPU has
// AVX512_BF16 (kernels/gemm_f32.h, LinearBf16PromptOut; SubmodelOptions.bf16_activations).
void LinearBf16Out(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                   at::Tensor& out, bool bf16_prompts = false);
at::Tensor LinearBf16(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {},
                      bool bf16_prompts = false);
at::Tensor LinearBf16WithIsa(CpuIsa isa, const at::Tensor& x, const at::Tensor& weight,
                             const at::Tensor& bias = {});

// Rows [r0, r1) of y = (scale ⊙ W) x for one row x of k floats, on the calling thread (no
// OpenMP inside), as LinearInt8Out computes them: for callers that split the rows over
// threads of their own (kernels/decode_step.h). w: rows of k int8 values, ldw apart; y:
// indexed by row. A row's value does not depend on r0 and r1 when they are multiples of four.
void LinearRowsInt8(const int8_t* w, int64_t ldw, const float* scale, const float* x, float* y,
                    int64_t k, int64_t r0, int64_t r1);
// The same for bfloat16 weights (LinearBf16Out's numbers); w: bfloat16 bit patterns.
void LinearRowsBf16(const uint16_t* w, int64_t ldw, const float* x, float* y, int64_t k,
                    int64_t r0, int64_t r1);

// Rows `ids` of a quantized table, dequantized: [ids.numel(), K] float32 (an embedding
// lookup).
at::Tensor GatherRowsInt8(const Int8Matrix& table, const at::Tensor& ids);

}  // namespace tophat::kernels
