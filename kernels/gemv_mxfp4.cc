#include "kernels/gemv_mxfp4.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace tophat::kernels {
namespace {

// The e2m1 codes' values times two (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives): small
// integers, which int8 holds and int8-to-float conversion makes exact floats.
constexpr std::array<int8_t, 16> kDoubledCodes = {0, 1,  2,  3,  4,  6,  8,  12,
                                                  0, -1, -2, -3, -4, -6, -8, -12};

// 2^(s - 128) for each stored exponent s: the block's scale, halved for the doubled codes.
const std::array<float, 256>& HalvedScales() {
  static const std::array<float, 256> scales = [] {
    std::array<float, 256> out{};
    for (int s = 0; s < 256; ++s) out[s] = std::ldexp(1.0f, s - 128);
    return out;
  }();
  return scales;
}

// y[i, r] = sum over blocks g of 2^(s[r, g] - 128) * sum_j codes2[r, g, j] x[i, 32 g + j], for
// x rows i < m and weight rows r in [r0, r1); groups blocks a row.
using Mxfp4RowsFn = void (*)(const uint8_t* blocks, const uint8_t* scales, int64_t groups,
                             const float* x, int64_t ldx, int64_t m, float* y, int64_t ldy,
                             int64_t r0, int64_t r1);

void Mxfp4RowsScalar(const uint8_t* blocks, const uint8_t* scales, int64_t groups, const float* x,
                     int64_t ldx, int64_t m, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const std::array<float, 256>& halved = HalvedScales();
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * ldx;
      float sum = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* packed = blocks + (r * groups + g) * 16;
        const float* xg = xi + g * 32;
        float block = 0.0f;
        for (int j = 0; j < 16; ++j) {
          block += static_cast<float>(kDoubledCodes[packed[j] & 0x0F]) * xg[2 * j];
          block += static_cast<float>(kDoubledCodes[packed[j] >> 4]) * xg[2 * j + 1];
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
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kDoubledCodes.data()));
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
  const std::array<float, 256>& halved = HalvedScales();
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * ldx;
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
      for (int64_t g = 0; g < groups; ++g) {
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
  const std::array<float, 256>& halved = HalvedScales();
  const int8x16_t table = vld1q_s8(kDoubledCodes.data());
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

}  // namespace

void DequantizeMxfp4Blocks(const uint8_t* blocks, const uint8_t* scales, int64_t groups,
                           float* out) {
  // A 20B gpt-oss holds 19 billion expert values: blocks in parallel, each through its own
  // table of the 16 codes' values.
  const std::array<float, 256>& halved = HalvedScales();
  at::parallel_for(0, groups, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      std::array<float, 16> table;
      for (int c = 0; c < 16; ++c) table[c] = kDoubledCodes[c] * halved[scales[g]];
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
  const std::vector<CpuIsa>& isas = SupportedCpuIsas();
  TORCH_CHECK(std::find(isas.begin(), isas.end(), isa) != isas.end(), "this CPU cannot run ",
              CpuIsaName(isa));
  at::Tensor out = at::empty({x.size(0), weight.rows()}, x.options());
  TORCH_CHECK(Mxfp4KernelTakes(x, weight, bias, out),
              "LinearMxfp4WithIsa: inputs the kernel takes");
  RunKernel(RowsFor(isa), x, weight, bias, out);
  return out;
}

}  // namespace tophat::kernels
