// Linear layers over MXFP4 weights (models/formats/mxfp4.h: blocks of 32 e2m1 values, two a
// byte, each block scaled by a power of two), as gpt-oss's experts are released: y = x W^T
// (+ bias), x float32.
//
// Held as released, a weight is 4.25 bits: 17 bytes a block of 32, against 128 in float32,
// so a 20B gpt-oss's experts (19.1 billion weights) fit in 10 GB instead of 76, and decode, which
// streams each routed expert's weights once per token, reads 7.5 times fewer bytes. The kernel
// decodes each block in registers (a 16-entry table of the codes' values, times two so that they
// are integers), multiplies with x's float32 values, and scales the block's sum by its power of
// two: exactly the float32 product with the dequantized matrix, up to summation order (every
// MXFP4 value and scale is exact in float32, and a power of two scales exactly).
//
// Few rows of x (decode, a verification, an expert's routed rows) take the kernel; more
// dequantize a block of rows at a time and go to BLAS, as the int8 kernels do.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>

#include "kernels/gemv.h"
#include "kernels/gemv_w8a8.h"

namespace tophat::kernels {

struct Mxfp4Matrix {
  at::Tensor blocks;  // [N, K / 32, 16] uint8, rows contiguous: two codes a byte, low first
  at::Tensor scales;  // [N, K / 32] uint8: block g of row r is scaled by 2^(scales - 127)

  bool defined() const { return blocks.defined(); }
  int64_t rows() const { return blocks.size(0); }
  int64_t cols() const { return blocks.size(1) * 32; }
  // Bytes as held.
  int64_t bytes() const { return blocks.numel() + scales.numel(); }
  // The matrix in float32 [N, K], as DequantizeMxfp4 gives it.
  at::Tensor Dequantize() const;
};

// The e2m1 codes' values times two (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives): small
// integers, which int8 holds and int8-to-float conversion makes exact floats.
inline constexpr std::array<int8_t, 16> kMxfp4DoubledCodes = {0, 1,  2,  3,  4,  6,  8,  12,
                                                              0, -1, -2, -3, -4, -6, -8, -12};

// 2^(s - 128) for each stored exponent s: the block's scale, halved for the doubled codes.
const std::array<float, 256>& Mxfp4HalvedScales();

// `groups` blocks (16 bytes each) and their exponents into 32 float32 values each, as
// transformers dequantizes them (each code's value times 2^(s - 127); -0 kept). In parallel.
void DequantizeMxfp4Blocks(const uint8_t* blocks, const uint8_t* scales, int64_t groups,
                           float* out);

// Rows of x at most this many take the kernel; more dequantize and multiply by BLAS.
inline constexpr int64_t kMxfp4KernelMaxRows = 16;

// Whether the kernel takes these inputs: x [M <= kMxfp4KernelMaxRows, K] float32 on the CPU
// with unit column stride, out [M, N] float32 contiguous, bias [N] float32 or undefined.
bool Mxfp4KernelTakes(const at::Tensor& x, const Mxfp4Matrix& weight, const at::Tensor& bias,
                      const at::Tensor& out);

// x: [M, K] CPU (float32 for the kernel; any float dtype through BLAS); bias: [N] or undefined;
// out: [M, N] contiguous, x's dtype. Allocates nothing where the kernel takes the inputs.
void LinearMxfp4Out(const at::Tensor& x, const Mxfp4Matrix& weight, const at::Tensor& bias,
                    at::Tensor& out);
at::Tensor LinearMxfp4(const at::Tensor& x, const Mxfp4Matrix& weight, const at::Tensor& bias = {});

// The kernel with a named instruction set (tests); inputs Mxfp4KernelTakes.
at::Tensor LinearMxfp4WithIsa(CpuIsa isa, const at::Tensor& x, const Mxfp4Matrix& weight,
                              const at::Tensor& bias = {});

// With int8 activations (SubmodelOptions.int8_activations): each row of x rounded to int8 per
// block of 32 as kernels/gemv_w8a8.h rounds it (RoundActivationRow). MXFP4's blocks are 32 wide
// too, so each weight block meets one activation block, and its 32 products (doubled codes of
// at most 12 times int8) are summed exactly in int32: AVX-512 VNNI's vpdpbusd, AVX2's
// vpmaddubsw + vpmaddwd, NEON's sdot or widening multiplies. Each block's sum is then scaled by its
// power of two and x's block scale, in float. llama.cpp multiplies MXFP4 by 8-bit activations
// alike.
//
// Why: the float kernel widens every code to float32 and multiplies in float, and on two Zen 4
// cores that is arithmetic-bound at about a third of the memory's rate (docs/benchmarks.md);
// an integer dot product takes 64 codes an instruction.
//
// What it computes is the float product of the dequantized matrix with x as rounded
// (RoundActivationsInt8), up to float rounding; each row of x alike however many rows come
// with it. Many rows (a prompt): x as rounded, through LinearMxfp4Out's BLAS path.
void LinearMxfp4A8Out(const at::Tensor& x, const Mxfp4Matrix& weight, const at::Tensor& bias,
                      at::Tensor& out);
at::Tensor LinearMxfp4A8(const at::Tensor& x, const Mxfp4Matrix& weight,
                         const at::Tensor& bias = {});
// The integer kernel with a named instruction set (tests); inputs Mxfp4KernelTakes.
at::Tensor LinearMxfp4A8WithIsa(W8A8Isa isa, const at::Tensor& x, const Mxfp4Matrix& weight,
                                const at::Tensor& bias = {});

}  // namespace tophat::kernels
