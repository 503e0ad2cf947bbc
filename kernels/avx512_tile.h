// What the AVX-512 prompt kernels' tiles (kernels/gemm_int8.cc, kernels/gemm_f32.cc) do alike
// around their products: the lanes of a panel inside the matrix, the partial sums a tile
// starts from, and the float sums it stores. x86-64 only; inlined into callers compiled for
// AVX-512.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace tophat::kernels {

// mask[v]: the lanes of 16-lane vector v that hold one of the panel's first `valid` rows.
template <int kVectors>
__attribute__((target("avx512f"), always_inline)) inline void PanelLaneMasks(
    int64_t valid, __mmask16 (&mask)[kVectors]) {
#pragma GCC unroll 16
  for (int v = 0; v < kVectors; ++v) {
    const int64_t lanes = std::clamp<int64_t>(valid - 16 * v, 0, 16);
    mask[v] = static_cast<__mmask16>((1u << lanes) - 1u);
  }
}

// acc[i][v]: zero for a tile's first chunk, else what y holds for x row i0 + i (the sums of
// the chunks before).
template <int kRows, int kVectors>
__attribute__((target("avx512f"), always_inline)) inline void StartPartialSums(
    bool first, const __mmask16 (&mask)[kVectors], const float* y, int64_t ldy, int64_t i0,
    __m512 (&acc)[kRows][kVectors]) {
#pragma GCC unroll 16
  for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 16
    for (int v = 0; v < kVectors; ++v) {
      acc[i][v] =
          first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[v], y + (i0 + i) * ldy + 16 * v);
    }
  }
}

// y's rows i0.. of the panel's valid lanes: the sums, plus `bias` (the panel's, or null).
template <int kRows, int kVectors>
__attribute__((target("avx512f"), always_inline)) inline void StorePartialSums(
    const __m512 (&acc)[kRows][kVectors], const __mmask16 (&mask)[kVectors], const float* bias,
    float* y, int64_t ldy, int64_t i0) {
#pragma GCC unroll 16
  for (int v = 0; v < kVectors; ++v) {
    const __m512 b =
        bias != nullptr ? _mm512_maskz_loadu_ps(mask[v], bias + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      _mm512_mask_storeu_ps(y + (i0 + i) * ldy + 16 * v, mask[v], _mm512_add_ps(acc[i][v], b));
    }
  }
}

// r[i] lane j becomes r[j] lane i, for 16 rows of 16 32-bit words: the prompt kernels' panels
// are their weights transposed, 16 rows and 16 columns at a time (64 shuffles, where a word
// at a time took about as long as a fifth of the products that read the panel).
__attribute__((target("avx512f"), always_inline)) inline void Transpose16x16(__m512i (&r)[16]) {
  __m512i t[16];
  // Within each 128-bit lane L (columns 4L..4L+3): pairs of rows interleaved by word, then
  // fours by double word, so that s[4i + c] lane L is column 4L + c of rows 4i..4i+3.
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // Then the 4 x 4 lanes of s[c], s[4 + c], s[8 + c], s[12 + c] transposed: column 4L + c's
  // lane G is s[4G + c]'s lane L.
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44);
    const __m512i x1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xEE);
    const __m512i x2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
    const __m512i x3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xEE);
    t[c] = _mm512_shuffle_i32x4(x0, x2, 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(x0, x2, 0xDD);
    t[8 + c] = _mm512_shuffle_i32x4(x1, x3, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(x1, x3, 0xDD);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

}  // namespace tophat::kernels
#endif
