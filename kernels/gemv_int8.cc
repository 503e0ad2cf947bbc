#include "kernels/gemv_int8.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/gemm_f32.h"
#include "kernels/prefetch.h"
#include "kernels/vector_types.h"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace tophat::kernels {
namespace {

// y[i, r] = scale[r] * sum_j x[i, j] w[r, j] for x rows i < m and weight rows r in [r0, r1).
using Int8RowsFn = void (*)(const int8_t* w, int64_t ldw, const float* scale, const float* x,
                            int64_t ldx, int64_t m, float* y, int64_t ldy, int64_t k, int64_t r0,
                            int64_t r1);

[[gnu::always_inline]] inline float ToFloat(int8_t v) { return static_cast<float>(v); }
[[gnu::always_inline]] inline float ToFloat(uint16_t bf16) {
  const uint32_t bits = static_cast<uint32_t>(bf16) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

// Loaders: Load2(p, a, b) reads two float vectors' worth of stored values from p (2 kLanes),
// widened to float: the first kLanes in a and the next in b, or for kEvenOdd loaders the
// even- and odd-indexed values. Intrinsics, not __builtin_convertvector: GCC 12 turns an
// int8-to-float conversion into one scalar instruction per lane. They carry their
// instruction set, so they cannot be always_inline into the kernel template (which has none):
// the per-set functions below are `flatten`, which inlines them there, where the instruction
// set is the function's. They write through references rather than return vectors: Clang
// refuses a vector return from a function with an instruction set into one without it.
#if defined(__x86_64__)
struct Avx512Int8 {
  using V = Vec16;
  using Element = int8_t;
  static constexpr bool kEvenOdd = false;
  __attribute__((target("avx512f"))) static inline void Load2(const int8_t* p, V& a, V& b) {
    const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i second = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
    a = reinterpret_cast<V>(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(first)));
    b = reinterpret_cast<V>(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(second)));
  }
};
struct Avx2Int8 {
  using V = Vec8;
  using Element = int8_t;
  static constexpr bool kEvenOdd = false;
  __attribute__((target("avx2"))) static inline void Load2(const int8_t* p, V& a, V& b) {
    const __m128i first = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i second = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8));
    a = reinterpret_cast<V>(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(first)));
    b = reinterpret_cast<V>(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(second)));
  }
};
// bfloat16 is float32's upper half. Two vectors' worth are loaded at once and split in place,
// without a widening shuffle (which Zen 4 runs at half rate on 512 bits, and which held the
// first version at ~18 G weights/s on two cores): each 32-bit lane holds an even-indexed
// value in its low half (shifted up, it is that float) and an odd-indexed one in its high
// half (masked, it is that float). The kernel then multiplies them with x's even and odd
// elements, which it lays out so (kEvenOdd).
struct Avx512Bf16 {
  using V = Vec16;
  using Element = uint16_t;
  static constexpr bool kEvenOdd = true;
  __attribute__((target("avx512f"))) static inline void Load2(const uint16_t* p, V& even,
                                                              V& odd) {
    const __m512i pairs = _mm512_loadu_si512(p);
    even = reinterpret_cast<V>(_mm512_slli_epi32(pairs, 16));
    odd = reinterpret_cast<V>(_mm512_and_si512(pairs, _mm512_set1_epi32(int32_t(0xFFFF0000u))));
  }
};
struct Avx2Bf16 {
  using V = Vec8;
  using Element = uint16_t;
  static constexpr bool kEvenOdd = true;
  __attribute__((target("avx2"))) static inline void Load2(const uint16_t* p, V& even, V& odd) {
    const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = reinterpret_cast<V>(_mm256_slli_epi32(pairs, 16));
    odd = reinterpret_cast<V>(_mm256_and_si256(pairs, _mm256_set1_epi32(int32_t(0xFFFF0000u))));
  }
};
#endif
#if defined(__aarch64__)
struct NeonInt8 {
  using V = Vec4;
  using Element = int8_t;
  static constexpr bool kEvenOdd = false;
  [[gnu::always_inline]] static inline void Load2(const int8_t* p, V& a, V& b) {
    // Eight int8 values widened to int16, then each half to int32 and float.
    const int16x8_t wide = vmovl_s8(vld1_s8(p));
    a = reinterpret_cast<V>(vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide))));
    b = reinterpret_cast<V>(vcvtq_f32_s32(vmovl_s16(vget_high_s16(wide))));
  }
};
struct NeonBf16 {
  using V = Vec4;
  using Element = uint16_t;
  static constexpr bool kEvenOdd = false;
  [[gnu::always_inline]] static inline void Load2(const uint16_t* p, V& a, V& b) {
    a = reinterpret_cast<V>(vshll_n_u16(vld1_u16(p), 16));
    b = reinterpret_cast<V>(vshll_n_u16(vld1_u16(p + 4), 16));
  }
};
#endif

// Four weight rows at a time, as the float32 kernel: each block of x is loaded once for four
// rows, and eight independent multiply-add chains keep loads in flight. Every x row runs
// against the four rows while they are in L1/L2, so a few x rows read the weights from memory
// once. L: one of the loads above, L::V its float vector, L::Element the stored type.
// `scale`: one per row (int8), or null (bfloat16: the values are the weights).
template <typename L>
[[gnu::always_inline]] inline void CompactRowsVector(const typename L::Element* w, int64_t ldw,
                                                     const float* scale, const float* x,
                                                     int64_t ldx, int64_t m, float* y,
                                                     int64_t ldy, int64_t k, int64_t r0,
                                                     int64_t r1) {
  using V = typename L::V;
  using E = typename L::Element;
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  constexpr int64_t kStep = 2 * kLanes;
  constexpr int64_t kLineMask = 64 / static_cast<int64_t>(sizeof(E)) - 1;
  const int64_t kv = k / kStep * kStep;
  if constexpr (L::kEvenOdd) {
    // x laid out for the even/odd weight vectors: in each block of kStep values, the even
    // ones, then the odd ones; the tail past kv as it is. Per thread and call, m * k floats
    // (the rows of x), in a buffer that grows once.
    thread_local std::vector<float> laid_out;
    if (static_cast<int64_t>(laid_out.size()) < m * k) laid_out.resize(m * k);
    for (int64_t i = 0; i < m; ++i) {
      const float* from = x + i * ldx;
      float* to = laid_out.data() + i * k;
      for (int64_t j = 0; j < kv; j += kStep) {
        for (int64_t l = 0; l < kLanes; ++l) {
          to[j + l] = from[j + 2 * l];
          to[j + kLanes + l] = from[j + 2 * l + 1];
        }
      }
      for (int64_t j = kv; j < k; ++j) to[j] = from[j];
    }
    x = laid_out.data();
    ldx = k;
  }
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const E* p0 = w + r * ldw;
    const E* p1 = p0 + ldw;
    const E* p2 = p1 + ldw;
    const E* p3 = p2 + ldw;
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * ldx;
      V a00{}, a01{}, a10{}, a11{}, a20{}, a21{}, a30{}, a31{};
      for (int64_t j = 0; j < kv; j += kStep) {
        // The next block of rows streams in as this one is read (kernels/prefetch.h): once
        // per 64 bytes of a row, for the first x row only.
        if (i == 0 && (j & kLineMask) == 0) {
          PrefetchNextBlock(p0, ldw * static_cast<int64_t>(sizeof(E)),
                            j * static_cast<int64_t>(sizeof(E)));
        }
        const V xa = LoadVector<V>(xi + j);
        const V xb = LoadVector<V>(xi + j + kLanes);
        V w0a, w0b, w1a, w1b, w2a, w2b, w3a, w3b;
        L::Load2(p0 + j, w0a, w0b);
        L::Load2(p1 + j, w1a, w1b);
        L::Load2(p2 + j, w2a, w2b);
        L::Load2(p3 + j, w3a, w3b);
        a00 += w0a * xa;
        a01 += w0b * xb;
        a10 += w1a * xa;
        a11 += w1b * xb;
        a20 += w2a * xa;
        a21 += w2b * xb;
        a30 += w3a * xa;
        a31 += w3b * xb;
      }
      float s0 = SumLanes<V>(a00 + a01);
      float s1 = SumLanes<V>(a10 + a11);
      float s2 = SumLanes<V>(a20 + a21);
      float s3 = SumLanes<V>(a30 + a31);
      for (int64_t j = kv; j < k; ++j) {
        s0 += ToFloat(p0[j]) * xi[j];
        s1 += ToFloat(p1[j]) * xi[j];
        s2 += ToFloat(p2[j]) * xi[j];
        s3 += ToFloat(p3[j]) * xi[j];
      }
      float* yi = y + i * ldy;
      if (scale != nullptr) {
        s0 *= scale[r];
        s1 *= scale[r + 1];
        s2 *= scale[r + 2];
        s3 *= scale[r + 3];
      }
      yi[r] = s0;
      yi[r + 1] = s1;
      yi[r + 2] = s2;
      yi[r + 3] = s3;
    }
  }
  for (; r < r1; ++r) {  // the last rows of this thread's share, one at a time
    const E* p = w + r * ldw;
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * ldx;
      V a0{}, a1{};
      for (int64_t j = 0; j < kv; j += kStep) {
        V wa, wb;
        L::Load2(p + j, wa, wb);
        a0 += wa * LoadVector<V>(xi + j);
        a1 += wb * LoadVector<V>(xi + j + kLanes);
      }
      float s = SumLanes<V>(a0 + a1);
      for (int64_t j = kv; j < k; ++j) s += ToFloat(p[j]) * xi[j];
      y[i * ldy + r] = scale != nullptr ? s * scale[r] : s;
    }
  }
}

// Plain C++: correct on any architecture, and what the compiler makes of it.
template <typename E>
void CompactRowsScalar(const E* w, int64_t ldw, const float* scale, const float* x,
                       int64_t ldx, int64_t m, float* y, int64_t ldy, int64_t k, int64_t r0,
                       int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const E* p = w + r * ldw;
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * ldx;
      float s = 0.0f;
      for (int64_t j = 0; j < k; ++j) s += ToFloat(p[j]) * xi[j];
      y[i * ldy + r] = scale != nullptr ? s * scale[r] : s;
    }
  }
}

// One function per instruction set and stored type, each the template above inlined where
// the instruction set is its own.
#define TOPHAT_COMPACT_ROWS(NAME, TARGET, LOAD)                                              \
  TARGET void NAME(const LOAD::Element* w, int64_t ldw, const float* scale, const float* x,   \
                   int64_t ldx, int64_t m, float* y, int64_t ldy, int64_t k, int64_t r0,      \
                   int64_t r1) {                                                              \
    CompactRowsVector<LOAD>(w, ldw, scale, x, ldx, m, y, ldy, k, r0, r1);                     \
  }
#if defined(__x86_64__)
TOPHAT_COMPACT_ROWS(Int8RowsAvx512, __attribute__((target("avx512f,avx512bw,fma"), flatten)),
                    Avx512Int8)
TOPHAT_COMPACT_ROWS(Int8RowsAvx2, __attribute__((target("avx2,fma"), flatten)), Avx2Int8)
TOPHAT_COMPACT_ROWS(Bf16RowsAvx512, __attribute__((target("avx512f,avx512bw,fma"), flatten)),
                    Avx512Bf16)
TOPHAT_COMPACT_ROWS(Bf16RowsAvx2, __attribute__((target("avx2,fma"), flatten)), Avx2Bf16)
#endif
#if defined(__aarch64__)
TOPHAT_COMPACT_ROWS(Int8RowsNeon, , NeonInt8)
TOPHAT_COMPACT_ROWS(Bf16RowsNeon, , NeonBf16)
#endif
#undef TOPHAT_COMPACT_ROWS
#pragma GCC diagnostic pop

template <typename E>
using RowsFn = void (*)(const E* w, int64_t ldw, const float* scale, const float* x,
                        int64_t ldx, int64_t m, float* y, int64_t ldy, int64_t k, int64_t r0,
                        int64_t r1);

RowsFn<int8_t> RowsFor(CpuIsa isa, int8_t /*stored type*/) {
  switch (isa) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:
      return Int8RowsAvx512;
    case CpuIsa::kAvx2:
      return Int8RowsAvx2;
#endif
#if defined(__aarch64__)
    case CpuIsa::kNeon:
      return Int8RowsNeon;
#endif
    default:
      return CompactRowsScalar<int8_t>;
  }
}

RowsFn<uint16_t> RowsFor(CpuIsa isa, uint16_t /*stored type*/) {
  switch (isa) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:
      return Bf16RowsAvx512;
    case CpuIsa::kAvx2:
      return Bf16RowsAvx2;
#endif
#if defined(__aarch64__)
    case CpuIsa::kNeon:
      return Bf16RowsNeon;
#endif
    default:
      return CompactRowsScalar<uint16_t>;
  }
}

// `values`: int8 (with `scale`, one float32 per row) or bfloat16 (no scale).
bool KernelFits(const at::Tensor& x, const at::Tensor& values, const at::Tensor& scale,
                const at::Tensor& bias, const at::Tensor& out) {
  const bool int8 = values.scalar_type() == at::kChar;
  return x.is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 &&
         x.size(0) <= kInt8KernelMaxRows && values.dim() == 2 && x.size(1) == values.size(1) &&
         x.stride(1) == 1 && values.is_cpu() &&
         (int8 || values.scalar_type() == at::kBFloat16) && values.stride(1) == 1 &&
         (!int8 || (scale.scalar_type() == at::kFloat && scale.is_contiguous() &&
                    scale.numel() == values.size(0))) &&
         out.is_cpu() && out.scalar_type() == at::kFloat && out.is_contiguous() &&
         out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == values.size(0) &&
         (!bias.defined() || (bias.is_cpu() && bias.scalar_type() == at::kFloat &&
                              bias.numel() == values.size(0)));
}

template <typename E>
void RunKernel(RowsFn<E> rows_fn, const at::Tensor& x, const at::Tensor& values,
               const at::Tensor& scale, const at::Tensor& bias, at::Tensor& out) {
  const int64_t n = values.size(0);
  const int64_t k = values.size(1);
  const int64_t m = x.size(0);
  const E* w = static_cast<const E*>(values.data_ptr());
  const int64_t ldw = values.stride(0);
  const float* scales = scale.defined() ? scale.data_ptr<float>() : nullptr;
  const float* xp = x.data_ptr<float>();
  const int64_t ldx = x.stride(0);
  float* yp = out.data_ptr<float>();
  // As the float32 kernel: static blocks of a multiple of four rows per thread.
  ParallelRowBlocks(n, n * k < (1 << 18) ? 1 : SingleRowThreads(), [&](int64_t begin, int64_t end) {
    rows_fn(w, ldw, scales, xp, ldx, m, yp, n, k, begin, end);
  });
  if (bias.defined()) out.add_(bias.view({1, n}));
}

// Rows [r0, r0 + rows) of the matrix as float32.
at::Tensor DenseRows(const at::Tensor& values, const at::Tensor& scale, int64_t r0, int64_t rows,
                     at::Device device) {
  at::Tensor dense = values.narrow(0, r0, rows).to(device, at::kFloat);
  if (scale.defined()) dense.mul_(scale.narrow(0, r0, rows).to(device).view({-1, 1}));
  return dense;
}

template <typename E>
void Run(RowsFn<E> rows_fn, const at::Tensor& x, const at::Tensor& values,
         const at::Tensor& scale, const at::Tensor& bias, at::Tensor& out) {
  if (KernelFits(x, values, scale, bias, out)) {
    RunKernel<E>(rows_fn, x, values, scale, bias, out);
    return;
  }
  // A prompt's many rows (or inputs the kernel does not take): BLAS, on the matrix in float32
  // a block of rows at a time, so that a large matrix (a 128k-row LM head) never needs a
  // float32 copy of itself. This allocates; decode never comes here.
  const at::Tensor xf = x.to(at::kFloat);
  const int64_t n = values.size(0);
  const int64_t k = values.size(1);
  const int64_t block = std::max<int64_t>(64, (int64_t{4} << 20) / std::max<int64_t>(1, 4 * k));
  at::Tensor result = at::empty({x.size(0), n}, xf.options());
  for (int64_t r0 = 0; r0 < n; r0 += block) {
    const int64_t rows = std::min(block, n - r0);
    result.narrow(1, r0, rows).copy_(at::mm(xf, DenseRows(values, scale, r0, rows, xf.device()).t()));
  }
  if (bias.defined()) result.add_(bias.to(result.device(), at::kFloat).view({1, n}));
  out.copy_(result);
}

}  // namespace

bool Int8KernelTakes(const at::Tensor& x, const Int8Matrix& weight, const at::Tensor& bias,
                     const at::Tensor& out) {
  return weight.values.scalar_type() == at::kChar &&
         KernelFits(x, weight.values, weight.scale, bias, out);
}

at::Tensor Int8Matrix::Dequantize() const {
  return values.to(at::kFloat) * scale.to(values.device()).view({-1, 1});
}

Int8Matrix QuantizeInt8PerRow(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.is_floating_point(),
              "QuantizeInt8PerRow: a floating [N, K] matrix, got ", weight.sizes(), " of ",
              weight.scalar_type());
  const at::Tensor w = weight.to(at::kCPU, at::kFloat).contiguous();
  const at::Tensor scale = std::get<0>(w.abs().max(1)) / 127.0f;
  // A zero row divides by 1: its values are 0 whatever the divisor.
  const at::Tensor divisor = at::where(scale > 0, scale, at::ones_like(scale));
  const at::Tensor values =
      at::round(w / divisor.view({-1, 1})).clamp(-127, 127).to(at::kChar).contiguous();
  return {.values = values, .scale = scale.contiguous()};
}

Int8Matrix ConcatRows(const std::vector<Int8Matrix>& parts) {
  std::vector<at::Tensor> values;
  std::vector<at::Tensor> scales;
  for (const Int8Matrix& part : parts) {
    values.push_back(part.values);
    scales.push_back(part.scale);
  }
  return {.values = at::cat(values).contiguous(), .scale = at::cat(scales).contiguous()};
}

void LinearInt8Out(const at::Tensor& x, const Int8Matrix& weight, const at::Tensor& bias,
                   at::Tensor& out) {
  static const RowsFn<int8_t> rows_fn = RowsFor(SelectedCpuIsa(), int8_t{});
  // A prompt on a CPU whose BLAS leaves AVX-512 unused: dequantized as the panels are packed
  // (kernels/gemm_f32.h), not a block of rows at a time for BLAS.
  if (LinearF32PromptIfChosenOut(x, weight.values, bias, out, weight.scale)) return;
  Run<int8_t>(rows_fn, x, weight.values, weight.scale, bias, out);
}

at::Tensor LinearInt8(const at::Tensor& x, const Int8Matrix& weight, const at::Tensor& bias) {
  at::Tensor out = at::empty({x.size(0), weight.rows()}, x.options());
  LinearInt8Out(x.stride(-1) == 1 ? x : x.contiguous(), weight, bias, out);
  return out;
}

at::Tensor LinearInt8WithIsa(CpuIsa isa, const at::Tensor& x, const Int8Matrix& weight,
                             const at::Tensor& bias) {
  CheckIsaSupported(isa, SupportedCpuIsas(), CpuIsaName(isa));
  at::Tensor out = at::empty({x.size(0), weight.rows()}, x.options());
  TORCH_CHECK(Int8KernelTakes(x, weight, bias, out),
              "LinearInt8WithIsa: inputs the kernel takes");
  RunKernel<int8_t>(RowsFor(isa, int8_t{}), x, weight.values, weight.scale, bias, out);
  return out;
}

void LinearBf16Out(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                   at::Tensor& out, bool bf16_prompts) {
  static const RowsFn<uint16_t> rows_fn = RowsFor(SelectedCpuIsa(), uint16_t{});
  // A prompt whose rows may be rounded to bfloat16: bfloat16 products, twice float32's rate.
  if (bf16_prompts && x.dim() == 2 && x.size(0) >= kF32GemmMinRows &&
      LinearBf16PromptOut(x, weight, bias, out)) {
    return;
  }
  // A prompt on a CPU whose BLAS leaves AVX-512 unused: widened as the panels are packed
  // (kernels/gemm_f32.h), not a block of rows at a time for BLAS.
  if (LinearF32PromptIfChosenOut(x, weight, bias, out)) return;
  Run<uint16_t>(rows_fn, x, weight, {}, bias, out);
}

void LinearRowsInt8(const int8_t* w, int64_t ldw, const float* scale, const float* x, float* y,
                    int64_t k, int64_t r0, int64_t r1) {
  static const RowsFn<int8_t> rows_fn = RowsFor(SelectedCpuIsa(), int8_t{});
  rows_fn(w, ldw, scale, x, k, 1, y, 0, k, r0, r1);
}

void LinearRowsBf16(const uint16_t* w, int64_t ldw, const float* x, float* y, int64_t k,
                    int64_t r0, int64_t r1) {
  static const RowsFn<uint16_t> rows_fn = RowsFor(SelectedCpuIsa(), uint16_t{});
  rows_fn(w, ldw, nullptr, x, k, 1, y, 0, k, r0, r1);
}

at::Tensor LinearBf16(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      bool bf16_prompts) {
  at::Tensor out = at::empty({x.size(0), weight.size(0)}, x.options());
  LinearBf16Out(x.stride(-1) == 1 ? x : x.contiguous(), weight, bias, out, bf16_prompts);
  return out;
}

at::Tensor LinearBf16WithIsa(CpuIsa isa, const at::Tensor& x, const at::Tensor& weight,
                             const at::Tensor& bias) {
  CheckIsaSupported(isa, SupportedCpuIsas(), CpuIsaName(isa));
  at::Tensor out = at::empty({x.size(0), weight.size(0)}, x.options());
  TORCH_CHECK(KernelFits(x, weight, {}, bias, out), "LinearBf16WithIsa: inputs the kernel takes");
  RunKernel<uint16_t>(RowsFor(isa, uint16_t{}), x, weight, {}, bias, out);
  return out;
}

at::Tensor GatherRowsInt8(const Int8Matrix& table, const at::Tensor& ids) {
  const at::Tensor index = ids.to(table.values.device(), at::kLong).reshape({-1});
  return table.values.index_select(0, index).to(at::kFloat) *
         table.scale.index_select(0, index).view({-1, 1});
}

}  // namespace tophat::kernels
