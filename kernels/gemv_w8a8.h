// Linear layers over int8 weights and int8 activations ("W8A8"), for decode on a device's
// CPU: the weights as kernels/gemv_int8.h stores them (int8 with one float32 scale per row),
// and each row of x rounded to int8 as it enters the layer, per block of kActivationBlock
// values with one float32 scale per block (absmax / 127: what llama.cpp's Q8_0 does to the
// activations it multiplies with Q8_0 weights). The products are integer: a block's 32
// int8 × int8 products are summed exactly in int32 (AVX-512 VNNI's vpdpbusd, AVX2's
// vpmaddubsw + vpmaddwd, NEON's sdot or widening multiplies), then scaled by the block's scale and,
// once per row, the weight row's.
//
// Why: the weight-only int8 kernel widens every weight to float32 and multiplies in float,
// which on two Zen 4 cores tops out at 14-21 G weights/s, compute-bound below the memory's
// rate; integer dot products do 64 weights per instruction.
//
// What it computes is the float product of the dequantized weights with x as rounded
// (RoundActivationsInt8), up to float rounding: that is "the model as quantized" for a
// submodel that quantizes activations (SubmodelOptions.int8_activations). Every row of x is
// rounded on its own and computed by the same instructions however many rows there are, so
// a verification round's rows get exactly a decode step's numbers. Many rows (a prompt) take
// BLAS over the rounded x and the dequantized matrix: the same products, summed in float.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <ATen/ATen.h>

#include "kernels/gemv_int8.h"

namespace tophat::kernels {

inline constexpr int64_t kActivationBlock = 32;

// x [M, K] float32 rounded as the kernel rounds it: each row's blocks of kActivationBlock
// values (the last block whatever is left) as round(x / s) * s, s = max|x| / 127 over the
// block (a block of zeros stays zeros). The reference for the kernel, and the BLAS path.
at::Tensor RoundActivationsInt8(const at::Tensor& x);

// The integer kernels this CPU can run, plainest first (the last is the default). kAvxVnni:
// AVX-VNNI, vpdpbusd on 256-bit vectors (Intel's client cores since Alder Lake, which lack
// AVX-512; AMD's since Zen 5): its rows take the AVX2 kernels, its prompts the prompt kernel
// (kernels/gemm_int8.h). kNeonDot:
// Armv8.2's dot-product instructions (sdot; Cortex-A75 and later, so Jetson Orin's A78AE),
// four int8 products summed into each int32 lane in one instruction, where baseline NEON
// widens, multiplies and adds pairwise in three.
enum class W8A8Isa { kScalar, kAvx2, kAvxVnni, kAvx512Vnni, kNeon, kNeonDot };
std::string_view W8A8IsaName(W8A8Isa isa);
const std::vector<W8A8Isa>& SupportedW8A8Isas();

// x: [M, K] float32 CPU; bias: [N] float32 or undefined; out: [M, N] float32 contiguous.
// Allocates nothing for M <= kInt8KernelMaxRows once its per-thread buffers have grown.
void LinearW8A8Out(const at::Tensor& x, const Int8Matrix& weight, const at::Tensor& bias,
                   at::Tensor& out);
at::Tensor LinearW8A8(const at::Tensor& x, const Int8Matrix& weight, const at::Tensor& bias = {});

// One row of k floats rounded as the kernels round it: q[0, k) and one scale per block,
// block_scale[0, ceil(k / kActivationBlock)).
void RoundActivationRow(const float* x, int64_t k, int8_t* q, float* block_scale);
// The same with a named instruction set's vector rounding (kScalar: value by value), for
// tests: every set gives the same bytes and scales. Fails unless this CPU runs it.
void RoundActivationRowWithIsa(W8A8Isa isa, const float* x, int64_t k, int8_t* q,
                               float* block_scale);
// Rows [r0, r1) of y = (scale ⊙ W) x for one row x rounded by RoundActivationRow (q,
// block_scale), on the calling thread (no OpenMP inside), as LinearW8A8Out computes them:
// for callers that split the rows over threads of their own (kernels/decode_step.h).
void LinearRowsW8A8(const int8_t* w, int64_t ldw, const float* scale, const int8_t* q,
                    const float* block_scale, float* y, int64_t k, int64_t r0, int64_t r1);

// The integer kernel with a named instruction set (tests); M <= kInt8KernelMaxRows.
at::Tensor LinearW8A8WithIsa(W8A8Isa isa, const at::Tensor& x, const Int8Matrix& weight,
                             const at::Tensor& bias = {});

}  // namespace tophat::kernels
