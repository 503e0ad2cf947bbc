// A prompt's rows through integer products: the many-row counterpart of the W8A8 and MXFP4
// kernels with int8 activations (kernels/gemv_w8a8.h, kernels/gemv_mxfp4.h), for prefill on
// a device's CPU.
//
// Why: a prompt is arithmetic-bound, not memory-bound. Before this, its rows went to BLAS in
// float32 over a dequantized copy of the weights: 16 multiply-adds an instruction on AVX-512,
// 4 on NEON. Integer dot products do 64 (vpdpbusd) or 16 (sdot) an instruction.
//
// How: x's rows are rounded as the row kernels round them (RoundActivationRow: int8 per block
// of 32, a float scale a block). The weights are repacked, a panel of kInt8GemmPanel rows at a
// time, so that each vector holds four consecutive values (one int32 lane) of 16 (AVX-512), 8
// (AVX-VNNI) or 4 (NEON) different weight rows; one x row's four values go into every lane
// (a broadcast), so each lane's dot product belongs to one output and no horizontal sums are
// needed. A block's 32 products are exact in int32; each block's sum is then scaled in float by x's
// block scale (and by MXFP4's power of two), and an int8 matrix's row scale multiplies the
// end. The panel is read in chunks of a few blocks that stay in the L1 cache while a tile of
// four x rows at a time goes through them.
//
// What it computes is the float product of the dequantized weights with x as rounded
// (RoundActivationsInt8), up to float rounding: the same numbers as the row kernels and the
// BLAS path, summed in another order.
#pragma once

#include <cstdint>

#include "kernels/gemv_w8a8.h"

namespace tophat::kernels {

// Weight rows a panel holds: three 16-lane vectors on AVX-512, six 8-lane ones on AVX-VNNI,
// twelve 4-lane ones on NEON.
inline constexpr int64_t kInt8GemmPanel = 48;

// The weights as held, one of two kinds: int8 rows with one float scale each
// (kernels/gemv_int8.h), or MXFP4 blocks with their exponents (kernels/gemv_mxfp4.h).
struct Int8GemmWeights {
  int64_t rows = 0;
  int64_t cols = 0;
  // int8: row r's values at int8_values + r * int8_stride, its scale at row_scale[r].
  const int8_t* int8_values = nullptr;
  int64_t int8_stride = 0;
  const float* row_scale = nullptr;
  // MXFP4 (cols a multiple of 32): row r's blocks at mxfp4_blocks + r * cols / 2, their
  // exponents at mxfp4_scales + r * cols / 32.
  const uint8_t* mxfp4_blocks = nullptr;
  const uint8_t* mxfp4_scales = nullptr;
};

// Whether `isa` has the prompt kernel: AVX-512 VNNI, AVX-VNNI and Armv8.2's dot products. Elsewhere
// (AVX2, baseline NEON, scalar) integer products are no faster than BLAS's float ones, and
// prompts keep BLAS.
bool HasInt8Gemm(W8A8Isa isa);

// y[i, r] = sum over k of W[r, k] * round(x)[i, k], for x [m, cols] float32 with row stride
// ldx and y [m, rows] float32 with row stride ldy; `isa` must HasInt8Gemm. Threads over
// panels of weight rows (ATen's pool). Allocates per-thread buffers that grow once.
void Int8GemmRows(W8A8Isa isa, const float* x, int64_t ldx, int64_t m,
                  const Int8GemmWeights& weights, float* y, int64_t ldy);

// k values (a multiple of 32) in nibble order, block by block: each block's 16 even-indexed
// values, then its 16 odd ones, as an MXFP4 block's low and high nibbles hold them.
void ToNibbleOrder(const int8_t* q, int64_t k, int8_t* ordered);

}  // namespace tophat::kernels
