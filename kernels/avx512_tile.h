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

}  // namespace tophat::kernels
#endif
