#include "kernels/gemv_w8a8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/gemm_int8.h"
#include "kernels/gemv.h"
#include "kernels/prefetch.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace tophat::kernels {
namespace {

// Rows of x as the kernels read them: row i's int8 values at q + i * k and its block scales
// at block_scale + i * blocks.
struct RoundedRows {
  const int8_t* q = nullptr;
  const float* block_scale = nullptr;
  int64_t blocks = 0;
};

using W8A8RowsFn = void (*)(const int8_t* w, int64_t ldw, const float* scale,
                            const RoundedRows& x, int64_t m, float* y, int64_t ldy, int64_t k,
                            int64_t r0, int64_t r1);

// One block of x: scale s = max|x| / 127 and q = round(x / s), through one function so that
// the kernels and RoundActivationsInt8 round alike.
inline float RoundBlock(const float* x, int64_t n, int8_t* q) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t j = 0; j < n; ++j) {
    finite = finite && std::isfinite(x[j]);
    amax = std::max(amax, std::fabs(x[j]));
  }
  if (!finite || !(amax > 0.0f)) {
    // Zeros stay zeros. A block with an infinity or NaN gets a NaN scale, so that what it
    // touches is NaN, as in the float kernels, rather than a number.
    std::fill(q, q + n, int8_t{0});
    return finite ? 0.0f : std::nanf("");
  }
  const float scale = amax / 127.0f;
  const float inverse = 127.0f / amax;
  for (int64_t j = 0; j < n; ++j) {
    const float v = std::nearbyint(x[j] * inverse);
    q[j] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
  }
  return scale;
}

int64_t BlocksOf(int64_t k) { return (k + kActivationBlock - 1) / kActivationBlock; }

// A whole block of kActivationBlock values, finite with a nonzero maximum, in vectors: the
// same multiply by 127 / max, the same rounding to nearest even (nearbyint's, in the default
// mode) and clamp as RoundBlock, so the same bytes and scale. Any other block returns false,
// having written nothing, for RoundBlock. Rounding a prompt's rows one value at a time took a
// third as long as the integer products themselves (perf, bench-110m w8a8, 512 tokens).
using FullBlockFn = bool (*)(const float* x, int8_t* q, float* scale);
static_assert(kActivationBlock == 32, "the vector block rounding is written for 32 values");

#if defined(__x86_64__)
__attribute__((target("avx512f"))) bool RoundFullBlockAvx512(const float* x, int8_t* q,
                                                             float* scale) {
  const __m512 v[2] = {_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)};
  const __m512 magnitude[2] = {_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])};
  const __m512 largest = _mm512_set1_ps(std::numeric_limits<float>::max());
  // Ordered comparisons: false for a NaN as for an infinity.
  const __mmask16 finite = _mm512_cmp_ps_mask(magnitude[0], largest, _CMP_LE_OQ) &
                           _mm512_cmp_ps_mask(magnitude[1], largest, _CMP_LE_OQ);
  if (finite != 0xFFFF) return false;
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(magnitude[0], magnitude[1]));
  if (!(amax > 0.0f)) return false;
  *scale = amax / 127.0f;
  const __m512 inverse = _mm512_set1_ps(127.0f / amax);
  for (int h = 0; h < 2; ++h) {
    __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v[h], inverse),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * h),
                     _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
  }
  return true;
}

__attribute__((target("avx2"))) bool RoundFullBlockAvx2(const float* x, int8_t* q, float* scale) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 largest = _mm256_set1_ps(std::numeric_limits<float>::max());
  __m256 v[4];
  __m256 amax8 = _mm256_setzero_ps();
  int finite = 0xFF;
  for (int h = 0; h < 4; ++h) {
    v[h] = _mm256_loadu_ps(x + 8 * h);
    const __m256 magnitude = _mm256_andnot_ps(sign, v[h]);
    finite &= _mm256_movemask_ps(_mm256_cmp_ps(magnitude, largest, _CMP_LE_OQ));
    amax8 = _mm256_max_ps(amax8, magnitude);
  }
  if (finite != 0xFF) return false;
  __m128 amax4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
  amax4 = _mm_max_ps(amax4, _mm_movehl_ps(amax4, amax4));
  amax4 = _mm_max_ss(amax4, _mm_shuffle_ps(amax4, amax4, 1));
  const float amax = _mm_cvtss_f32(amax4);
  if (!(amax > 0.0f)) return false;
  *scale = amax / 127.0f;
  const __m256 inverse = _mm256_set1_ps(127.0f / amax);
  __m256i integers[4];
  for (int h = 0; h < 4; ++h) {
    __m256 r = _mm256_round_ps(_mm256_mul_ps(v[h], inverse),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    integers[h] = _mm256_cvtps_epi32(r);
  }
  // The packs work within 128-bit lanes: dword d of the result holds four values of vector
  // d % 4, from its low half in lane 0 and its high half in lane 1; the permute puts them
  // back in order.
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(integers[0], integers[1]),
                                            _mm256_packs_epi32(integers[2], integers[3]));
  _mm256_storeu_si256(
      reinterpret_cast<__m256i*>(q),
      _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  return true;
}
#endif

#if defined(__aarch64__)
bool RoundFullBlockNeon(const float* x, int8_t* q, float* scale) {
  const float32x4_t largest = vdupq_n_f32(std::numeric_limits<float>::max());
  float32x4_t v[8];
  float32x4_t amax4 = vdupq_n_f32(0.0f);
  uint32x4_t finite = vdupq_n_u32(~0u);
  for (int h = 0; h < 8; ++h) {
    v[h] = vld1q_f32(x + 4 * h);
    const float32x4_t magnitude = vabsq_f32(v[h]);
    finite = vandq_u32(finite, vcleq_f32(magnitude, largest));
    amax4 = vmaxq_f32(amax4, magnitude);
  }
  if (vminvq_u32(finite) != ~0u) return false;
  const float amax = vmaxvq_f32(amax4);
  if (!(amax > 0.0f)) return false;
  *scale = amax / 127.0f;
  const float32x4_t inverse = vdupq_n_f32(127.0f / amax);
  for (int h = 0; h < 8; h += 2) {
    int16x4_t halves[2];
    for (int i = 0; i < 2; ++i) {
      float32x4_t r = vrndnq_f32(vmulq_f32(v[h + i], inverse));
      r = vminq_f32(vmaxq_f32(r, vdupq_n_f32(-127.0f)), vdupq_n_f32(127.0f));
      halves[i] = vmovn_s32(vcvtq_s32_f32(r));
    }
    vst1_s8(q + 4 * h, vmovn_s16(vcombine_s16(halves[0], halves[1])));
  }
  return true;
}
#endif

FullBlockFn FullBlockFor(W8A8Isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case W8A8Isa::kAvx512Vnni:
      return RoundFullBlockAvx512;
    case W8A8Isa::kAvx2:
    case W8A8Isa::kAvxVnni:
      return RoundFullBlockAvx2;
#endif
#if defined(__aarch64__)
    case W8A8Isa::kNeon:
    case W8A8Isa::kNeonDot:
      return RoundFullBlockNeon;
#endif
    default:
      return nullptr;
  }
}

// One row of k values, block by block: q[0, k) and block_scale[0, BlocksOf(k)), whole blocks
// by `full` where it takes them (null: value by value throughout).
void RoundRowWith(FullBlockFn full, const float* x, int64_t k, int8_t* q, float* block_scale) {
  for (int64_t b = 0; b * kActivationBlock < k; ++b) {
    const int64_t begin = b * kActivationBlock;
    const int64_t n = std::min(kActivationBlock, k - begin);
    if (full != nullptr && n == kActivationBlock && full(x + begin, q + begin, block_scale + b)) {
      continue;
    }
    block_scale[b] = RoundBlock(x + begin, n, q + begin);
  }
}

void RoundRow(const float* x, int64_t k, int8_t* q, float* block_scale) {
  static const FullBlockFn full = FullBlockFor(SupportedW8A8Isas().back());
  RoundRowWith(full, x, k, q, block_scale);
}

// The integer dot product of blocks [b0, blocks) of one weight row with one row of x.
inline float DotBlocksScalar(const int8_t* w, const int8_t* q, const float* block_scale,
                             int64_t k, int64_t b0) {
  float sum = 0.0f;
  for (int64_t b = b0; b * kActivationBlock < k; ++b) {
    const int64_t begin = b * kActivationBlock;
    const int64_t end = std::min(k, begin + kActivationBlock);
    int32_t dot = 0;
    for (int64_t j = begin; j < end; ++j) dot += int32_t{w[j]} * int32_t{q[j]};
    sum += static_cast<float>(dot) * block_scale[b];
  }
  return sum;
}

void W8A8RowsScalar(const int8_t* w, int64_t ldw, const float* scale, const RoundedRows& x,
                    int64_t m, float* y, int64_t ldy, int64_t k, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t i = 0; i < m; ++i) {
      y[i * ldy + r] = scale[r] * DotBlocksScalar(w + r * ldw, x.q + i * k,
                                                  x.block_scale + i * x.blocks, k, 0);
    }
  }
}

// The four rows r.. of one x row, from the vector kernels' sums of blocks [0, tail_block):
// each plus its tail blocks, times its row's scale, into yi.
inline void FinishFourRows(const float (&sums)[4], const int8_t* const (&p)[4], const int8_t* q,
                           const float* block_scale, int64_t k, int64_t tail_block,
                           const float* scale, int64_t r, float* yi) {
  for (int row = 0; row < 4; ++row) {
    yi[r + row] =
        scale[r + row] * (sums[row] + DotBlocksScalar(p[row], q, block_scale, k, tail_block));
  }
}

#if defined(__x86_64__)
// 64 values of x per vector, four weight rows at a time. vpdpbusd multiplies unsigned bytes
// by signed ones, so x goes in as |x| and each weight takes x's sign (negated where x < 0,
// one masked subtract). Each int32 lane holds four products of one block; the lanes are
// scaled by their block's scale into float accumulators.
__attribute__((target("avx512f,avx512bw,avx512vnni,fma"))) void W8A8RowsAvx512Vnni(
    const int8_t* w, int64_t ldw, const float* scale, const RoundedRows& x, int64_t m,
    float* y, int64_t ldy, int64_t k, int64_t r0, int64_t r1) {
  constexpr int64_t kStep = 64;
  const int64_t kv = k / kStep * kStep;
  const int64_t tail_block = kv / kActivationBlock;
  const __m512i zero = _mm512_setzero_si512();
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const int8_t* const p[4] = {w + r * ldw, w + (r + 1) * ldw, w + (r + 2) * ldw,
                                w + (r + 3) * ldw};
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* q = x.q + i * k;
      const float* block_scales = x.block_scale + i * x.blocks;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t j = 0; j < kv; j += kStep) {
        if (i == 0) PrefetchNextBlock(p[0], ldw, j);  // kernels/prefetch.h
        const __m512i xv = _mm512_loadu_si512(q + j);
        const __m512i magnitude = _mm512_abs_epi8(xv);
        const __mmask64 negative = _mm512_movepi8_mask(xv);
        // The vector's two blocks: eight int32 lanes each.
        const int64_t b = j / kActivationBlock;
        const __m512 block_scale = _mm512_mask_blend_ps(
            0xFF00, _mm512_set1_ps(block_scales[b]), _mm512_set1_ps(block_scales[b + 1]));
// One weight row's 64 values against x's (a macro: a lambda would not have this function's
// instruction set).
#define TOPHAT_W8A8_STEP(p, acc)                                                          \
  do {                                                                                    \
    __m512i wv = _mm512_loadu_si512((p) + j);                                             \
    wv = _mm512_mask_sub_epi8(wv, negative, zero, wv);                                    \
    const __m512i dot = _mm512_dpbusd_epi32(zero, magnitude, wv);                         \
    (acc) = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), block_scale, (acc));                 \
  } while (false)
        TOPHAT_W8A8_STEP(p[0], a0);
        TOPHAT_W8A8_STEP(p[1], a1);
        TOPHAT_W8A8_STEP(p[2], a2);
        TOPHAT_W8A8_STEP(p[3], a3);
#undef TOPHAT_W8A8_STEP
      }
      const float sums[4] = {_mm512_reduce_add_ps(a0), _mm512_reduce_add_ps(a1),
                             _mm512_reduce_add_ps(a2), _mm512_reduce_add_ps(a3)};
      FinishFourRows(sums, p, q, block_scales, k, tail_block, scale, r, y + i * ldy);
    }
  }
  W8A8RowsScalar(w, ldw, scale, x, m, y, ldy, k, r, r1);  // the last rows of this share
}

__attribute__((target("avx2"), always_inline)) inline float Sum256(__m256 v) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

// 32 values (one block) per vector: vpmaddubsw multiplies |x| by the signed weights in
// pairs into int16 (at most 2 * 127 * 127, no saturation), vpmaddwd sums pairs into int32.
__attribute__((target("avx2,fma"))) void W8A8RowsAvx2(const int8_t* w, int64_t ldw,
                                                     const float* scale, const RoundedRows& x,
                                                     int64_t m, float* y, int64_t ldy,
                                                     int64_t k, int64_t r0, int64_t r1) {
  constexpr int64_t kStep = kActivationBlock;
  const int64_t kv = k / kStep * kStep;
  const int64_t tail_block = kv / kActivationBlock;
  const __m256i ones = _mm256_set1_epi16(1);
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const int8_t* const p[4] = {w + r * ldw, w + (r + 1) * ldw, w + (r + 2) * ldw,
                                w + (r + 3) * ldw};
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* q = x.q + i * k;
      const float* block_scales = x.block_scale + i * x.blocks;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t j = 0; j < kv; j += kStep) {
        if (i == 0 && (j & 63) == 0) PrefetchNextBlock(p[0], ldw, j);  // kernels/prefetch.h
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + j));
        const __m256i magnitude = _mm256_sign_epi8(xv, xv);
        const __m256 block_scale = _mm256_set1_ps(block_scales[j / kActivationBlock]);
#define TOPHAT_W8A8_STEP(p, acc)                                                          \
  do {                                                                                    \
    const __m256i wv = _mm256_sign_epi8(                                                  \
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>((p) + j)), xv);               \
    const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, wv), ones);     \
    (acc) = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), block_scale, (acc));                 \
  } while (false)
        TOPHAT_W8A8_STEP(p[0], a0);
        TOPHAT_W8A8_STEP(p[1], a1);
        TOPHAT_W8A8_STEP(p[2], a2);
        TOPHAT_W8A8_STEP(p[3], a3);
#undef TOPHAT_W8A8_STEP
      }
      const float sums[4] = {Sum256(a0), Sum256(a1), Sum256(a2), Sum256(a3)};
      FinishFourRows(sums, p, q, block_scales, k, tail_block, scale, r, y + i * ldy);
    }
  }
  W8A8RowsScalar(w, ldw, scale, x, m, y, ldy, k, r, r1);
}
#endif

#if defined(__aarch64__)
// One block (32 values) per step: widening multiplies into int16 (two products per lane, at
// most 2 * 127 * 127), pairwise sums into int32, scaled by the block's scale. Baseline
// Armv8 NEON: no dot-product extension needed.
void W8A8RowsNeon(const int8_t* w, int64_t ldw, const float* scale, const RoundedRows& x,
                  int64_t m, float* y, int64_t ldy, int64_t k, int64_t r0, int64_t r1) {
  constexpr int64_t kStep = kActivationBlock;
  const int64_t kv = k / kStep * kStep;
  const int64_t tail_block = kv / kActivationBlock;
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const int8_t* const p[4] = {w + r * ldw, w + (r + 1) * ldw, w + (r + 2) * ldw,
                                w + (r + 3) * ldw};
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* q = x.q + i * k;
      const float* block_scales = x.block_scale + i * x.blocks;
      float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
      for (int64_t j = 0; j < kv; j += kStep) {
        if (i == 0 && (j & 63) == 0) PrefetchNextBlock(p[0], ldw, j);  // kernels/prefetch.h
        const int8x16_t x0 = vld1q_s8(q + j);
        const int8x16_t x1 = vld1q_s8(q + j + 16);
        const float block_scale = block_scales[j / kActivationBlock];
        for (int row = 0; row < 4; ++row) {
          const int8x16_t w0 = vld1q_s8(p[row] + j);
          const int8x16_t w1 = vld1q_s8(p[row] + j + 16);
          int16x8_t low = vmull_s8(vget_low_s8(x0), vget_low_s8(w0));
          low = vmlal_s8(low, vget_high_s8(x0), vget_high_s8(w0));
          int16x8_t high = vmull_s8(vget_low_s8(x1), vget_low_s8(w1));
          high = vmlal_s8(high, vget_high_s8(x1), vget_high_s8(w1));
          const int32x4_t dot = vpadalq_s16(vpaddlq_s16(low), high);
          acc[row] = vfmaq_n_f32(acc[row], vcvtq_f32_s32(dot), block_scale);
        }
      }
      const float sums[4] = {vaddvq_f32(acc[0]), vaddvq_f32(acc[1]), vaddvq_f32(acc[2]),
                             vaddvq_f32(acc[3])};
      FinishFourRows(sums, p, q, block_scales, k, tail_block, scale, r, y + i * ldy);
    }
  }
  W8A8RowsScalar(w, ldw, scale, x, m, y, ldy, k, r, r1);
}

// The same with Armv8.2's dot products: each sdot sums four products into every int32 lane,
// so a block of 32 is two instructions into four lanes.
__attribute__((target("arch=armv8.2-a+dotprod"))) void W8A8RowsNeonDot(
    const int8_t* w, int64_t ldw, const float* scale, const RoundedRows& x, int64_t m, float* y,
    int64_t ldy, int64_t k, int64_t r0, int64_t r1) {
  constexpr int64_t kStep = kActivationBlock;
  const int64_t kv = k / kStep * kStep;
  const int64_t tail_block = kv / kActivationBlock;
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const int8_t* const p[4] = {w + r * ldw, w + (r + 1) * ldw, w + (r + 2) * ldw,
                                w + (r + 3) * ldw};
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* q = x.q + i * k;
      const float* block_scales = x.block_scale + i * x.blocks;
      float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
      for (int64_t j = 0; j < kv; j += kStep) {
        if (i == 0 && (j & 63) == 0) PrefetchNextBlock(p[0], ldw, j);  // kernels/prefetch.h
        const int8x16_t x0 = vld1q_s8(q + j);
        const int8x16_t x1 = vld1q_s8(q + j + 16);
        const float block_scale = block_scales[j / kActivationBlock];
        for (int row = 0; row < 4; ++row) {
          const int32x4_t dot = vdotq_s32(vdotq_s32(vdupq_n_s32(0), x0, vld1q_s8(p[row] + j)), x1,
                                          vld1q_s8(p[row] + j + 16));
          acc[row] = vfmaq_n_f32(acc[row], vcvtq_f32_s32(dot), block_scale);
        }
      }
      const float sums[4] = {vaddvq_f32(acc[0]), vaddvq_f32(acc[1]), vaddvq_f32(acc[2]),
                             vaddvq_f32(acc[3])};
      FinishFourRows(sums, p, q, block_scales, k, tail_block, scale, r, y + i * ldy);
    }
  }
  W8A8RowsScalar(w, ldw, scale, x, m, y, ldy, k, r, r1);
}
#endif

std::vector<W8A8Isa> DetectW8A8Isas() {
  std::vector<W8A8Isa> isas = {W8A8Isa::kScalar};
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool fma = __builtin_cpu_supports("fma");
  if (fma && __builtin_cpu_supports("avx2")) isas.push_back(W8A8Isa::kAvx2);
  // AVX512_VNNI by CPUID (leaf 7, subleaf 0, ECX bit 11): GCC 12 and Clang 14 spell it
  // differently in __builtin_cpu_supports.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool vnni = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 11)) != 0;
  // AVX-VNNI (the VEX form, 256-bit) by CPUID leaf 7, subleaf 1, EAX bit 4.
  const bool avx_vnni = __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4)) != 0;
  if (fma && avx_vnni && __builtin_cpu_supports("avx2")) isas.push_back(W8A8Isa::kAvxVnni);
  if (fma && vnni && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
    isas.push_back(W8A8Isa::kAvx512Vnni);
  }
#elif defined(__aarch64__)
  isas.push_back(W8A8Isa::kNeon);
  if ((getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0) isas.push_back(W8A8Isa::kNeonDot);
#endif
  return isas;
}

W8A8RowsFn RowsFor(W8A8Isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case W8A8Isa::kAvx512Vnni:
      return W8A8RowsAvx512Vnni;
    case W8A8Isa::kAvx2:
    case W8A8Isa::kAvxVnni:  // rows: AVX2's kernel (none of its own yet); prompts: gemm_int8
      return W8A8RowsAvx2;
#endif
#if defined(__aarch64__)
    case W8A8Isa::kNeon:
      return W8A8RowsNeon;
    case W8A8Isa::kNeonDot:
      return W8A8RowsNeonDot;
#endif
    default:
      return W8A8RowsScalar;
  }
}

void RunKernel(W8A8RowsFn rows_fn, const at::Tensor& x, const Int8Matrix& weight,
               const at::Tensor& bias, at::Tensor& out) {
  const int64_t m = x.size(0);
  const int64_t k = x.size(1);
  const int64_t n = weight.rows();
  // x rounded once, on this thread, into buffers that grow once per thread; every thread of
  // the parallel region below reads them.
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> block_scale;
  const int64_t blocks = BlocksOf(k);
  if (static_cast<int64_t>(q.size()) < m * k) q.resize(m * k);
  if (static_cast<int64_t>(block_scale.size()) < m * blocks) block_scale.resize(m * blocks);
  const float* xp = x.data_ptr<float>();
  for (int64_t i = 0; i < m; ++i) {
    RoundRow(xp + i * x.stride(0), k, q.data() + i * k, block_scale.data() + i * blocks);
  }
  const RoundedRows rows{.q = q.data(), .block_scale = block_scale.data(), .blocks = blocks};
  const int8_t* w = weight.values.data_ptr<int8_t>();
  const int64_t ldw = weight.values.stride(0);
  const float* scales = weight.scale.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  // As the other GEMV kernels: static blocks of a multiple of four rows per thread.
  ParallelRowBlocks(n, n * k < (1 << 18) ? 1 : SingleRowThreads(), [&](int64_t begin, int64_t end) {
    rows_fn(w, ldw, scales, rows, m, yp, n, k, begin, end);
  });
  if (bias.defined()) out.add_(bias.view({1, n}));
}

// Whether the prompt kernel takes these inputs: what the row kernel checks, but for the
// number of rows (so checked on x's and out's first row).
bool PromptKernelTakes(const at::Tensor& x, const Int8Matrix& weight, const at::Tensor& bias,
                       const at::Tensor& out) {
  return x.dim() == 2 && out.dim() == 2 && x.size(0) > 0 && out.size(0) == x.size(0) &&
         Int8KernelTakes(x.narrow(0, 0, 1), weight, bias, out.narrow(0, 0, 1)) &&
         out.is_contiguous();
}

void RunPromptKernel(W8A8Isa isa, const at::Tensor& x, const Int8Matrix& weight,
                     const at::Tensor& bias, at::Tensor& out) {
  const Int8GemmWeights weights{.rows = weight.rows(),
                                .cols = x.size(1),
                                .int8_values = weight.values.data_ptr<int8_t>(),
                                .int8_stride = weight.values.stride(0),
                                .row_scale = weight.scale.data_ptr<float>()};
  Int8GemmRows(isa, x.data_ptr<float>(), x.stride(0), x.size(0), weights, out.data_ptr<float>(),
               out.stride(0));
  if (bias.defined()) out.add_(bias.view({1, weight.rows()}));
}

}  // namespace

std::string_view W8A8IsaName(W8A8Isa isa) {
  switch (isa) {
    case W8A8Isa::kScalar:
      return "scalar";
    case W8A8Isa::kAvx2:
      return "avx2";
    case W8A8Isa::kAvxVnni:
      return "avx-vnni";
    case W8A8Isa::kAvx512Vnni:
      return "avx512vnni";
    case W8A8Isa::kNeon:
      return "neon";
    case W8A8Isa::kNeonDot:
      return "neon-dotprod";
  }
  return "unknown";
}

const std::vector<W8A8Isa>& SupportedW8A8Isas() {
  static const std::vector<W8A8Isa> isas = DetectW8A8Isas();
  return isas;
}

void RoundActivationRowWithIsa(W8A8Isa isa, const float* x, int64_t k, int8_t* q,
                               float* block_scale) {
  CheckIsaSupported(isa, SupportedW8A8Isas(), W8A8IsaName(isa));
  RoundRowWith(FullBlockFor(isa), x, k, q, block_scale);
}

at::Tensor RoundActivationsInt8(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, "RoundActivationsInt8: x must be [M, K], got ", x.sizes());
  const at::Tensor xf = x.to(at::kCPU, at::kFloat).contiguous();
  const int64_t m = xf.size(0);
  const int64_t k = xf.size(1);
  at::Tensor rounded = at::empty({m, k}, xf.options());
  std::vector<int8_t> q(static_cast<size_t>(k));
  std::vector<float> block_scale(static_cast<size_t>(BlocksOf(k)));
  const float* from = xf.data_ptr<float>();
  float* to = rounded.data_ptr<float>();
  for (int64_t i = 0; i < m; ++i) {
    RoundRow(from + i * k, k, q.data(), block_scale.data());
    for (int64_t j = 0; j < k; ++j) {
      to[i * k + j] = static_cast<float>(q[j]) * block_scale[j / kActivationBlock];
    }
  }
  return rounded.to(x.device());
}

void LinearW8A8Out(const at::Tensor& x, const Int8Matrix& weight, const at::Tensor& bias,
                   at::Tensor& out) {
  static const W8A8Isa isa = SupportedW8A8Isas().back();
  static const W8A8RowsFn rows_fn = RowsFor(isa);
  if (Int8KernelTakes(x, weight, bias, out)) {
    RunKernel(rows_fn, x, weight, bias, out);
    return;
  }
  if (HasInt8Gemm(isa) && PromptKernelTakes(x, weight, bias, out)) {
    RunPromptKernel(isa, x, weight, bias, out);
    return;
  }
  // Inputs no kernel takes, or a CPU without a prompt kernel: x as rounded, through the
  // float path over the dequantized weights (BLAS for many rows). This allocates.
  LinearInt8Out(RoundActivationsInt8(x), weight, bias, out);
}

void RoundActivationRow(const float* x, int64_t k, int8_t* q, float* block_scale) {
  RoundRow(x, k, q, block_scale);
}

void LinearRowsW8A8(const int8_t* w, int64_t ldw, const float* scale, const int8_t* q,
                    const float* block_scale, float* y, int64_t k, int64_t r0, int64_t r1) {
  static const W8A8RowsFn rows_fn = RowsFor(SupportedW8A8Isas().back());
  const RoundedRows rows{.q = q, .block_scale = block_scale, .blocks = BlocksOf(k)};
  rows_fn(w, ldw, scale, rows, 1, y, 0, k, r0, r1);
}

at::Tensor LinearW8A8(const at::Tensor& x, const Int8Matrix& weight, const at::Tensor& bias) {
  at::Tensor out = at::empty({x.size(0), weight.rows()}, x.options());
  LinearW8A8Out(x.stride(-1) == 1 ? x : x.contiguous(), weight, bias, out);
  return out;
}

at::Tensor LinearW8A8WithIsa(W8A8Isa isa, const at::Tensor& x, const Int8Matrix& weight,
                             const at::Tensor& bias) {
  CheckIsaSupported(isa, SupportedW8A8Isas(), W8A8IsaName(isa));
  at::Tensor out = at::empty({x.size(0), weight.rows()}, x.options());
  if (x.size(0) > kInt8KernelMaxRows && HasInt8Gemm(isa)) {
    TORCH_CHECK(PromptKernelTakes(x, weight, bias, out),
                "LinearW8A8WithIsa: inputs the prompt kernel takes");
    RunPromptKernel(isa, x, weight, bias, out);
    return out;
  }
  TORCH_CHECK(Int8KernelTakes(x, weight, bias, out), "LinearW8A8WithIsa: inputs the kernel takes");
  RunKernel(RowsFor(isa), x, weight, bias, out);
  return out;
}

}  // namespace tophat::kernels
