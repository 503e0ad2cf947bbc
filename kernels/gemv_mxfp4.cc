#include "kernels/gemv_mxfp4.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/gemm_int8.h"
#include "kernels/prefetch.h"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace tophat::kernels {
namespace {

// kMxfp4DoubledCodes in each of a 512-bit vector's four lanes.
alignas(64) constexpr std::array<int8_t, 64> kDoubledCodesFourTimes = {
    0,  1,  2,  3,   4,  6,  8,  12, 0,  -1,  -2, -3, -4, -6, -8, -12, 0,  1,  2,  3,  4,  6,
    8,  12, 0,  -1,  -2, -3, -4, -6, -8, -12, 0,  1,  2,  3,  4,  6,   8,  12, 0,  -1, -2, -3,
    -4, -6, -8, -12, 0,  1,  2,  3,  4,  6,   8,  12, 0,  -1, -2, -3,  -4, -6, -8, -12};

// Out of cache the four-row kernels below read 9-13 GB/s on this VM's two cores, a fifth of the
// memory's rate: four interleaved streams that restart every block are what the hardware
// prefetchers follow worst (kernels/prefetch.h). So each block of four rows asks for the next
// block's codes in step with its own reads (PrefetchNextBlock, for every 64 bytes of a row:
// four blocks of 32 values), and for the next block's exponents as it starts.
[[gnu::always_inline]] inline void PrefetchNextScales(const uint8_t* scales, int64_t groups,
                                                      int64_t r) {
  const uint8_t* next = scales + (r + 4) * groups;
  for (int64_t offset = 0; offset < 4 * groups; offset += 64)
    __builtin_prefetch(next + offset, 0, 3);
}

// y[i, r] = sum over blocks g of 2^(s[r, g] - 128) * sum_j codes2[r, g, j] x[i, 32 g + j], for
// x rows i < m and weight rows r in [r0, r1); groups blocks a row.
using Mxfp4RowsFn = void (*)(const uint8_t* blocks, const uint8_t* scales, int64_t groups,
                             const float* x, int64_t ldx, int64_t m, float* y, int64_t ldy,
                             int64_t r0, int64_t r1);

void Mxfp4RowsScalar(const uint8_t* blocks, const uint8_t* scales, int64_t groups, const float* x,
                     int64_t ldx, int64_t m, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const std::array<float, 256>& halved = Mxfp4HalvedScales();
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * ldx;
      float sum = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* packed = blocks + (r * groups + g) * 16;
        const float* xg = xi + g * 32;
        float block = 0.0f;
        for (int j = 0; j < 16; ++j) {
          block += static_cast<float>(kMxfp4DoubledCodes[packed[j] & 0x0F]) * xg[2 * j];
          block += static_cast<float>(kMxfp4DoubledCodes[packed[j] >> 4]) * xg[2 * j + 1];
        }
        sum += block * halved[scales[r * groups + g]];
      }
      y[i * ldy + r] = sum;
    }
  }
}

#if defined(__x86_64__)
// One block's 32 codes as four float vectors in the values' order: the low and high nibbles
// looked up in the doubled table (pshufb), interleaved back (low first), widened to float.
__attribute__((target("avx2"))) inline void DecodeBlockAvx2(const uint8_t* packed, __m256& w0,
                                                            __m256& w1, __m256& w2, __m256& w3) {
  const __m128i table =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4DoubledCodes.data()));
  const __m128i nibble = _mm_set1_epi8(0x0F);
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
  const __m128i low = _mm_shuffle_epi8(table, _mm_and_si128(bytes, nibble));
  const __m128i high = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble));
  const __m128i first = _mm_unpacklo_epi8(low, high);   // values 0..15
  const __m128i second = _mm_unpackhi_epi8(low, high);  // values 16..31
  w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(first));
  w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(first, 8)));
  w2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(second));
  w3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(second, 8)));
}

__attribute__((target("avx2,fma"))) inline float SumAvx2(__m256 v) {
  const __m128 quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
  return _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)));
}

// Four weight rows at a time: four independent chains of multiply-adds per x row (one chain
// per row is latency-bound at a block per ~20 cycles), each x block loaded once for the four.
__attribute__((target("avx2,fma"))) void Mxfp4RowsAvx2(const uint8_t* blocks, const uint8_t* scales,
                                                       int64_t groups, const float* x, int64_t ldx,
                                                       int64_t m, float* y, int64_t ldy, int64_t r0,
                                                       int64_t r1) {
  const std::array<float, 256>& halved = Mxfp4HalvedScales();
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    PrefetchNextScales(scales, groups, r);
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * ldx;
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
      for (int64_t g = 0; g < groups; ++g) {
        if (i == 0 && (g & 3) == 0)
          PrefetchNextBlock(blocks + r * groups * 16, groups * 16, g * 16);
        const float* xg = xi + g * 32;
        const __m256 x0 = _mm256_loadu_ps(xg);
        const __m256 x1 = _mm256_loadu_ps(xg + 8);
        const __m256 x2 = _mm256_loadu_ps(xg + 16);
        const __m256 x3 = _mm256_loadu_ps(xg + 24);
        for (int q = 0; q < 4; ++q) {
          const int64_t at = (r + q) * groups + g;
          __m256 w0, w1, w2, w3;
          DecodeBlockAvx2(blocks + at * 16, w0, w1, w2, w3);
          const __m256 front = _mm256_fmadd_ps(w1, x1, _mm256_mul_ps(w0, x0));
          const __m256 back = _mm256_fmadd_ps(w3, x3, _mm256_mul_ps(w2, x2));
          acc[q] = _mm256_fmadd_ps(_mm256_add_ps(front, back), _mm256_set1_ps(halved[scales[at]]),
                                   acc[q]);
        }
      }
      float* yi = y + i * ldy;
      for (int q = 0; q < 4; ++q) yi[r + q] = SumAvx2(acc[q]);
    }
  }
  if (r < r1) Mxfp4RowsScalar(blocks, scales, groups, x, ldx, m, y, ldy, r, r1);
}
#endif

#if defined(__aarch64__)
// NEON: the same table lookup (tbl), widened to float four values at a time.
void Mxfp4RowsNeon(const uint8_t* blocks, const uint8_t* scales, int64_t groups, const float* x,
                   int64_t ldx, int64_t m, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const std::array<float, 256>& halved = Mxfp4HalvedScales();
  const int8x16_t table = vld1q_s8(kMxfp4DoubledCodes.data());
  const uint8x16_t nibble = vdupq_n_u8(0x0F);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * ldx;
      float32x4_t acc0 = vdupq_n_f32(0.0f);
      float32x4_t acc1 = vdupq_n_f32(0.0f);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t at = r * groups + g;
        const uint8x16_t bytes = vld1q_u8(blocks + at * 16);
        const int8x16_t low = vqtbl1q_s8(table, vandq_u8(bytes, nibble));
        const int8x16_t high = vqtbl1q_s8(table, vshrq_n_u8(bytes, 4));
        const int8x16x2_t ordered = vzipq_s8(low, high);  // values 0..15, 16..31
        const float* xg = xi + g * 32;
        float32x4_t block0 = vdupq_n_f32(0.0f);
        float32x4_t block1 = vdupq_n_f32(0.0f);
        for (int half = 0; half < 2; ++half) {
          const int16x8_t lo16 = vmovl_s8(vget_low_s8(ordered.val[half]));
          const int16x8_t hi16 = vmovl_s8(vget_high_s8(ordered.val[half]));
          const float* xh = xg + half * 16;
          block0 = vfmaq_f32(block0, vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo16))), vld1q_f32(xh));
          block1 =
              vfmaq_f32(block1, vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo16))), vld1q_f32(xh + 4));
          block0 =
              vfmaq_f32(block0, vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi16))), vld1q_f32(xh + 8));
          block1 =
              vfmaq_f32(block1, vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi16))), vld1q_f32(xh + 12));
        }
        const float32x4_t scale = vdupq_n_f32(halved[scales[at]]);
        acc0 = vfmaq_f32(acc0, block0, scale);
        acc1 = vfmaq_f32(acc1, block1, scale);
      }
      y[i * ldy + r] = vaddvq_f32(vaddq_f32(acc0, acc1));
    }
  }
}
#endif

Mxfp4RowsFn RowsFor(CpuIsa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:  // the AVX2 kernel: 256-bit table lookups are what it needs
    case CpuIsa::kAvx2:
      return Mxfp4RowsAvx2;
#endif
#if defined(__aarch64__)
    case CpuIsa::kNeon:
      return Mxfp4RowsNeon;
#endif
    default:
      return Mxfp4RowsScalar;
  }
}

void RunKernel(Mxfp4RowsFn rows_fn, const at::Tensor& x, const Mxfp4Matrix& weight,
               const at::Tensor& bias, at::Tensor& out) {
  const int64_t n = weight.rows();
  const int64_t groups = weight.blocks.size(1);
  const int64_t m = x.size(0);
  const uint8_t* blocks = weight.blocks.data_ptr<uint8_t>();
  const uint8_t* scales = weight.scales.data_ptr<uint8_t>();
  const float* xp = x.data_ptr<float>();
  const int64_t ldx = x.stride(0);
  float* yp = out.data_ptr<float>();
  // As the other kernels: static blocks of a multiple of four rows per thread.
  ParallelRowBlocks(n, n * groups < (1 << 13) ? 1 : SingleRowThreads(),
                    [&](int64_t begin, int64_t end) {
                      rows_fn(blocks, scales, groups, xp, ldx, m, yp, n, begin, end);
                    });
  if (bias.defined()) out.add_(bias.view({1, n}));
}

// x's rows as the integer kernels read them: rounded by RoundActivationRow, then each block's
// 32 values in nibble order (its 16 even-indexed values, then its 16 odd ones), so that the
// low and the high nibbles of a weight block's 16 bytes meet the values they multiply without
// being interleaved. Row i's values at q + i * groups * 32, its block scales at
// block_scale + i * groups.
struct NibbleOrderedRows {
  const int8_t* q = nullptr;
  const float* block_scale = nullptr;
};

using Mxfp4A8RowsFn = void (*)(const uint8_t* blocks, const uint8_t* scales, int64_t groups,
                               const NibbleOrderedRows& x, int64_t m, float* y, int64_t ldy,
                               int64_t r0, int64_t r1);

// One block's integer dot product: 16 packed bytes against 32 values in nibble order.
inline int32_t DotBlockA8(const uint8_t* packed, const int8_t* q) {
  int32_t dot = 0;
  for (int j = 0; j < 16; ++j) {
    dot += int32_t{kMxfp4DoubledCodes[packed[j] & 0x0F]} * q[j];
    dot += int32_t{kMxfp4DoubledCodes[packed[j] >> 4]} * q[16 + j];
  }
  return dot;
}

// Blocks [g0, groups) of weight row r against x row i: the vector kernels' tails.
inline float DotBlocksA8(const uint8_t* blocks, const uint8_t* scales, int64_t groups,
                         const NibbleOrderedRows& x, int64_t i, int64_t r, int64_t g0) {
  const std::array<float, 256>& halved = Mxfp4HalvedScales();
  const int8_t* q = x.q + i * groups * 32;
  const float* block_scale = x.block_scale + i * groups;
  float sum = 0.0f;
  for (int64_t g = g0; g < groups; ++g) {
    const int64_t at = r * groups + g;
    sum += static_cast<float>(DotBlockA8(blocks + at * 16, q + g * 32)) *
           (halved[scales[at]] * block_scale[g]);
  }
  return sum;
}

void Mxfp4A8RowsScalar(const uint8_t* blocks, const uint8_t* scales, int64_t groups,
                       const NibbleOrderedRows& x, int64_t m, float* y, int64_t ldy, int64_t r0,
                       int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t i = 0; i < m; ++i)
      y[i * ldy + r] = DotBlocksA8(blocks, scales, groups, x, i, r, 0);
  }
}

#if defined(__x86_64__)
// The sum of v's 16 lanes, 128-bit lanes folded by shuffles. Here and in the kernel below the
// instructions are in their zero-masked forms (all lanes kept): their unmasked forms, and
// _mm512_reduce_add_ps, pass GCC 12's builtins an undefined placeholder that it warns of.
__attribute__((target("avx512f"), always_inline)) inline float Sum512(__m512 v) {
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(0xFFFF, v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(0xFFFF, v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m128 quad = _mm512_maskz_extractf32x4_ps(0xF, v, 0);
  const __m128 pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
  return _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)));
}

// Two blocks (64 values) per vector, four weight rows at a time. A block's 16 bytes and the
// same shifted right by four go into adjacent 128-bit lanes, so that one table lookup gives
// its 32 doubled codes in nibble order. vpdpbusd multiplies unsigned bytes by signed ones, so
// x goes in as |x| and each code takes x's sign (one masked subtract); the int32 lanes of each
// block are scaled by its power of two times x's block scale.
__attribute__((target("avx512f,avx512bw,avx512vnni,fma"))) void Mxfp4A8RowsAvx512Vnni(
    const uint8_t* blocks, const uint8_t* scales, int64_t groups, const NibbleOrderedRows& x,
    int64_t m, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const std::array<float, 256>& halved = Mxfp4HalvedScales();
  const __m512i table = _mm512_load_si512(kDoubledCodesFourTimes.data());
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i zero = _mm512_setzero_si512();
  const __m512i spread = _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0);
  const int64_t paired = groups / 2 * 2;
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    PrefetchNextScales(scales, groups, r);
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* q = x.q + i * groups * 32;
      const float* block_scale = x.block_scale + i * groups;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t g = 0; g < paired; g += 2) {
        if (i == 0 && (g & 3) == 0)
          PrefetchNextBlock(blocks + r * groups * 16, groups * 16, g * 16);
        const __m512i xv = _mm512_loadu_si512(q + g * 32);
        const __m512i magnitude = _mm512_abs_epi8(xv);
        const __mmask64 negative = _mm512_movepi8_mask(xv);
// One weight row's two blocks against x's (a macro: a lambda would not have this function's
// instruction set). Blocks g and g + 1 go into 128-bit lanes 0 and 2 and again into 1 and 3,
// which are then shifted right by four: [g, g >> 4, g + 1, g + 1 >> 4].
#define TOPHAT_MXFP4_A8_STEP(row, acc)                                                     \
  do {                                                                                     \
    const int64_t at = (row)*groups + g;                                                   \
    __m512i codes = _mm512_maskz_permutexvar_epi64(                                        \
        0xFF, spread, _mm512_maskz_loadu_epi8(0xFFFFFFFF, blocks + at * 16));              \
    codes = _mm512_mask_srli_epi16(codes, 0xFF00FF00, codes, 4);                           \
    codes = _mm512_shuffle_epi8(table, _mm512_and_si512(codes, nibble));                   \
    codes = _mm512_mask_sub_epi8(codes, negative, zero, codes);                            \
    const __m512i dot = _mm512_dpbusd_epi32(zero, magnitude, codes);                       \
    const __m512 scale =                                                                   \
        _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(halved[scales[at]] * block_scale[g]),  \
                             _mm512_set1_ps(halved[scales[at + 1]] * block_scale[g + 1])); \
    (acc) = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, dot), scale, (acc));          \
  } while (false)
        TOPHAT_MXFP4_A8_STEP(r, a0);
        TOPHAT_MXFP4_A8_STEP(r + 1, a1);
        TOPHAT_MXFP4_A8_STEP(r + 2, a2);
        TOPHAT_MXFP4_A8_STEP(r + 3, a3);
#undef TOPHAT_MXFP4_A8_STEP
      }
      const float sums[4] = {Sum512(a0), Sum512(a1), Sum512(a2), Sum512(a3)};
      float* yi = y + i * ldy;
      for (int t = 0; t < 4; ++t) {
        yi[r + t] = sums[t] + DotBlocksA8(blocks, scales, groups, x, i, r + t, paired);
      }
    }
  }
  if (r < r1) Mxfp4A8RowsScalar(blocks, scales, groups, x, m, y, ldy, r, r1);
}

// One block (32 values) per vector, four weight rows at a time: the low nibbles in the low
// lane and the high ones in the high lane, one table lookup; vpmaddubsw multiplies |x| by the
// codes signed as x (pairs into int16, at most 2 * 12 * 127), vpmaddwd sums pairs into int32.
__attribute__((target("avx2,fma"))) void Mxfp4A8RowsAvx2(const uint8_t* blocks,
                                                         const uint8_t* scales, int64_t groups,
                                                         const NibbleOrderedRows& x, int64_t m,
                                                         float* y, int64_t ldy, int64_t r0,
                                                         int64_t r1) {
  const std::array<float, 256>& halved = Mxfp4HalvedScales();
  const __m256i table = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4DoubledCodes.data())));
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    PrefetchNextScales(scales, groups, r);
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* q = x.q + i * groups * 32;
      const float* block_scale = x.block_scale + i * groups;
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
      for (int64_t g = 0; g < groups; ++g) {
        if (i == 0 && (g & 3) == 0)
          PrefetchNextBlock(blocks + r * groups * 16, groups * 16, g * 16);
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + g * 32));
        const __m256i magnitude = _mm256_sign_epi8(xv, xv);
        for (int t = 0; t < 4; ++t) {
          const int64_t at = (r + t) * groups + g;
          const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks + at * 16));
          __m256i codes = _mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes);
          codes = _mm256_shuffle_epi8(table, _mm256_and_si256(codes, nibble));
          codes = _mm256_sign_epi8(codes, xv);
          const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, codes), ones);
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                   _mm256_set1_ps(halved[scales[at]] * block_scale[g]), acc[t]);
        }
      }
      float* yi = y + i * ldy;
      for (int t = 0; t < 4; ++t) yi[r + t] = SumAvx2(acc[t]);
    }
  }
  if (r < r1) Mxfp4A8RowsScalar(blocks, scales, groups, x, m, y, ldy, r, r1);
}
#endif

#if defined(__aarch64__)
// One block per step: the codes looked up (tbl) already in nibble order, widening multiplies
// into int16 (two products a lane, at most 2 * 12 * 127), pairwise sums into int32. Baseline
// Armv8 NEON: no dot-product extension needed.
void Mxfp4A8RowsNeon(const uint8_t* blocks, const uint8_t* scales, int64_t groups,
                     const NibbleOrderedRows& x, int64_t m, float* y, int64_t ldy, int64_t r0,
                     int64_t r1) {
  const std::array<float, 256>& halved = Mxfp4HalvedScales();
  const int8x16_t table = vld1q_s8(kMxfp4DoubledCodes.data());
  const uint8x16_t nibble = vdupq_n_u8(0x0F);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* q = x.q + i * groups * 32;
      const float* block_scale = x.block_scale + i * groups;
      float32x4_t acc = vdupq_n_f32(0.0f);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t at = r * groups + g;
        const uint8x16_t bytes = vld1q_u8(blocks + at * 16);
        const int8x16_t low = vqtbl1q_s8(table, vandq_u8(bytes, nibble));
        const int8x16_t high = vqtbl1q_s8(table, vshrq_n_u8(bytes, 4));
        const int8x16_t q0 = vld1q_s8(q + g * 32);
        const int8x16_t q1 = vld1q_s8(q + g * 32 + 16);
        int16x8_t even = vmull_s8(vget_low_s8(low), vget_low_s8(q0));
        even = vmlal_s8(even, vget_high_s8(low), vget_high_s8(q0));
        int16x8_t odd = vmull_s8(vget_low_s8(high), vget_low_s8(q1));
        odd = vmlal_s8(odd, vget_high_s8(high), vget_high_s8(q1));
        const int32x4_t dot = vpadalq_s16(vpaddlq_s16(even), odd);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(dot), halved[scales[at]] * block_scale[g]);
      }
      y[i * ldy + r] = vaddvq_f32(acc);
    }
  }
}
// The same with Armv8.2's dot products: the block's two halves (low and high nibbles' codes)
// against x's even and odd values, two sdot into four int32 lanes.
__attribute__((target("arch=armv8.2-a+dotprod"))) void Mxfp4A8RowsNeonDot(
    const uint8_t* blocks, const uint8_t* scales, int64_t groups, const NibbleOrderedRows& x,
    int64_t m, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const std::array<float, 256>& halved = Mxfp4HalvedScales();
  const int8x16_t table = vld1q_s8(kMxfp4DoubledCodes.data());
  const uint8x16_t nibble = vdupq_n_u8(0x0F);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* q = x.q + i * groups * 32;
      const float* block_scale = x.block_scale + i * groups;
      float32x4_t acc = vdupq_n_f32(0.0f);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t at = r * groups + g;
        const uint8x16_t bytes = vld1q_u8(blocks + at * 16);
        const int8x16_t low = vqtbl1q_s8(table, vandq_u8(bytes, nibble));
        const int8x16_t high = vqtbl1q_s8(table, vshrq_n_u8(bytes, 4));
        const int32x4_t dot = vdotq_s32(vdotq_s32(vdupq_n_s32(0), low, vld1q_s8(q + g * 32)), high,
                                        vld1q_s8(q + g * 32 + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(dot), halved[scales[at]] * block_scale[g]);
      }
      y[i * ldy + r] = vaddvq_f32(acc);
    }
  }
}
#endif

Mxfp4A8RowsFn A8RowsFor(W8A8Isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case W8A8Isa::kAvx512Vnni:
      return Mxfp4A8RowsAvx512Vnni;
    case W8A8Isa::kAvx2:
    case W8A8Isa::kAvxVnni:  // rows: AVX2's kernel (none of its own yet); prompts: gemm_int8
      return Mxfp4A8RowsAvx2;
#endif
#if defined(__aarch64__)
    case W8A8Isa::kNeon:
      return Mxfp4A8RowsNeon;
    case W8A8Isa::kNeonDot:
      return Mxfp4A8RowsNeonDot;
#endif
    default:
      return Mxfp4A8RowsScalar;
  }
}

void RunA8Kernel(Mxfp4A8RowsFn rows_fn, const at::Tensor& x, const Mxfp4Matrix& weight,
                 const at::Tensor& bias, at::Tensor& out) {
  const int64_t n = weight.rows();
  const int64_t groups = weight.blocks.size(1);
  const int64_t k = groups * 32;
  const int64_t m = x.size(0);
  // x rounded once, on this thread, into buffers that grow once per thread (a row at a time
  // through `row`, then reordered into q); every thread of the parallel region below reads q.
  thread_local std::vector<int8_t> row;
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> block_scale;
  if (static_cast<int64_t>(row.size()) < k) row.resize(k);
  if (static_cast<int64_t>(q.size()) < m * k) q.resize(m * k);
  if (static_cast<int64_t>(block_scale.size()) < m * groups) block_scale.resize(m * groups);
  const float* xp = x.data_ptr<float>();
  for (int64_t i = 0; i < m; ++i) {
    RoundActivationRow(xp + i * x.stride(0), k, row.data(), block_scale.data() + i * groups);
    ToNibbleOrder(row.data(), k, q.data() + i * k);
  }
  const NibbleOrderedRows rows{.q = q.data(), .block_scale = block_scale.data()};
  const uint8_t* packed = weight.blocks.data_ptr<uint8_t>();
  const uint8_t* scales = weight.scales.data_ptr<uint8_t>();
  float* yp = out.data_ptr<float>();
  ParallelRowBlocks(n, n * groups < (1 << 13) ? 1 : SingleRowThreads(),
                    [&](int64_t begin, int64_t end) {
                      rows_fn(packed, scales, groups, rows, m, yp, n, begin, end);
                    });
  if (bias.defined()) out.add_(bias.view({1, n}));
}

// Whether the prompt kernel takes these inputs: what the row kernel checks, but for the
// number of rows (so checked on x's and out's first row).
bool PromptKernelTakes(const at::Tensor& x, const Mxfp4Matrix& weight, const at::Tensor& bias,
                       const at::Tensor& out) {
  return x.dim() == 2 && out.dim() == 2 && x.size(0) > 0 && out.size(0) == x.size(0) &&
         Mxfp4KernelTakes(x.narrow(0, 0, 1), weight, bias, out.narrow(0, 0, 1)) &&
         out.is_contiguous();
}

void RunPromptKernel(W8A8Isa isa, const at::Tensor& x, const Mxfp4Matrix& weight,
                     const at::Tensor& bias, at::Tensor& out) {
  const Int8GemmWeights weights{.rows = weight.rows(),
                                .cols = weight.cols(),
                                .mxfp4_blocks = weight.blocks.data_ptr<uint8_t>(),
                                .mxfp4_scales = weight.scales.data_ptr<uint8_t>()};
  Int8GemmRows(isa, x.data_ptr<float>(), x.stride(0), x.size(0), weights, out.data_ptr<float>(),
               out.stride(0));
  if (bias.defined()) out.add_(bias.view({1, weight.rows()}));
}

}  // namespace

const std::array<float, 256>& Mxfp4HalvedScales() {
  static const std::array<float, 256> scales = [] {
    std::array<float, 256> out{};
    for (int s = 0; s < 256; ++s) out[s] = std::ldexp(1.0f, s - 128);
    return out;
  }();
  return scales;
}

void DequantizeMxfp4Blocks(const uint8_t* blocks, const uint8_t* scales, int64_t groups,
                           float* out) {
  // A 20B gpt-oss holds 19 billion expert values: blocks in parallel, each through its own
  // table of the 16 codes' values.
  const std::array<float, 256>& halved = Mxfp4HalvedScales();
  at::parallel_for(0, groups, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      std::array<float, 16> table;
      for (int c = 0; c < 16; ++c) table[c] = kMxfp4DoubledCodes[c] * halved[scales[g]];
      // A doubled code of 0 with the sign bit set is -0: kept, as transformers keeps it.
      table[8] = -0.0f;
      const uint8_t* packed = blocks + g * 16;
      float* values = out + g * 32;
      for (int i = 0; i < 16; ++i) {
        values[2 * i] = table[packed[i] & 0x0F];
        values[2 * i + 1] = table[packed[i] >> 4];
      }
    }
  });
}

at::Tensor Mxfp4Matrix::Dequantize() const {
  const at::Tensor b = blocks.contiguous();
  const at::Tensor s = scales.contiguous();
  at::Tensor out = at::empty({rows(), cols()}, at::kFloat);
  DequantizeMxfp4Blocks(b.data_ptr<uint8_t>(), s.data_ptr<uint8_t>(), s.numel(),
                        out.data_ptr<float>());
  return out;
}

bool Mxfp4KernelTakes(const at::Tensor& x, const Mxfp4Matrix& weight, const at::Tensor& bias,
                      const at::Tensor& out) {
  const int64_t n = weight.rows();
  return x.is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 &&
         x.size(0) <= kMxfp4KernelMaxRows && x.size(1) == weight.cols() && x.stride(1) == 1 &&
         weight.blocks.is_cpu() && weight.blocks.scalar_type() == at::kByte &&
         weight.blocks.is_contiguous() && weight.scales.scalar_type() == at::kByte &&
         weight.scales.is_contiguous() && weight.scales.numel() * 16 == weight.blocks.numel() &&
         out.is_cpu() && out.scalar_type() == at::kFloat && out.is_contiguous() && out.dim() == 2 &&
         out.size(0) == x.size(0) && out.size(1) == n &&
         (!bias.defined() ||
          (bias.is_cpu() && bias.scalar_type() == at::kFloat && bias.numel() == n));
}

void LinearMxfp4Out(const at::Tensor& x, const Mxfp4Matrix& weight, const at::Tensor& bias,
                    at::Tensor& out) {
  static const Mxfp4RowsFn rows_fn = RowsFor(SelectedCpuIsa());
  if (Mxfp4KernelTakes(x, weight, bias, out)) {
    RunKernel(rows_fn, x, weight, bias, out);
    return;
  }
  // A prompt's many rows (or inputs the kernel does not take): BLAS on the matrix dequantized
  // a block of rows at a time, in x's dtype. This allocates; decode never comes here.
  const int64_t n = weight.rows();
  const int64_t k = weight.cols();
  const int64_t block = std::max<int64_t>(64, (int64_t{4} << 20) / std::max<int64_t>(1, 4 * k));
  for (int64_t r0 = 0; r0 < n; r0 += block) {
    const int64_t rows = std::min(block, n - r0);
    const Mxfp4Matrix part{.blocks = weight.blocks.narrow(0, r0, rows),
                           .scales = weight.scales.narrow(0, r0, rows)};
    at::Tensor columns = out.narrow(1, r0, rows);
    columns.copy_(at::mm(x, part.Dequantize().to(x.scalar_type()).t()));
  }
  if (bias.defined()) out.add_(bias.to(out.scalar_type()).view({1, n}));
}

at::Tensor LinearMxfp4(const at::Tensor& x, const Mxfp4Matrix& weight, const at::Tensor& bias) {
  at::Tensor out = at::empty({x.size(0), weight.rows()}, x.options());
  LinearMxfp4Out(x.stride(-1) == 1 ? x : x.contiguous(), weight, bias, out);
  return out;
}

at::Tensor LinearMxfp4WithIsa(CpuIsa isa, const at::Tensor& x, const Mxfp4Matrix& weight,
                              const at::Tensor& bias) {
  CheckIsaSupported(isa, SupportedCpuIsas(), CpuIsaName(isa));
  at::Tensor out = at::empty({x.size(0), weight.rows()}, x.options());
  TORCH_CHECK(Mxfp4KernelTakes(x, weight, bias, out),
              "LinearMxfp4WithIsa: inputs the kernel takes");
  RunKernel(RowsFor(isa), x, weight, bias, out);
  return out;
}

void LinearMxfp4A8Out(const at::Tensor& x, const Mxfp4Matrix& weight, const at::Tensor& bias,
                      at::Tensor& out) {
  static const W8A8Isa isa = SupportedW8A8Isas().back();
  static const Mxfp4A8RowsFn rows_fn = A8RowsFor(isa);
  if (Mxfp4KernelTakes(x, weight, bias, out)) {
    RunA8Kernel(rows_fn, x, weight, bias, out);
    return;
  }
  if (HasInt8Gemm(isa) && PromptKernelTakes(x, weight, bias, out)) {
    RunPromptKernel(isa, x, weight, bias, out);
    return;
  }
  // Inputs no kernel takes, or a CPU without a prompt kernel: x as rounded, through the
  // float path (BLAS for many rows). This allocates; decode never comes here.
  LinearMxfp4Out(RoundActivationsInt8(x).to(x.scalar_type()), weight, bias, out);
}

at::Tensor LinearMxfp4A8(const at::Tensor& x, const Mxfp4Matrix& weight, const at::Tensor& bias) {
  at::Tensor out = at::empty({x.size(0), weight.rows()}, x.options());
  LinearMxfp4A8Out(x.stride(-1) == 1 ? x : x.contiguous(), weight, bias, out);
  return out;
}

at::Tensor LinearMxfp4A8WithIsa(W8A8Isa isa, const at::Tensor& x, const Mxfp4Matrix& weight,
                                const at::Tensor& bias) {
  CheckIsaSupported(isa, SupportedW8A8Isas(), W8A8IsaName(isa));
  at::Tensor out = at::empty({x.size(0), weight.rows()}, x.options());
  if (x.size(0) > kMxfp4KernelMaxRows && HasInt8Gemm(isa)) {
    TORCH_CHECK(PromptKernelTakes(x, weight, bias, out),
                "LinearMxfp4A8WithIsa: inputs the prompt kernel takes");
    RunPromptKernel(isa, x, weight, bias, out);
    return out;
  }
  TORCH_CHECK(Mxfp4KernelTakes(x, weight, bias, out),
              "LinearMxfp4A8WithIsa: inputs the kernel takes");
  RunA8Kernel(A8RowsFor(isa), x, weight, bias, out);
  return out;
}

}  // namespace tophat::kernels
