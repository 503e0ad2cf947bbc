#include "kernels/gemv_int8.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

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

// How far ahead each weight row is prefetched, in bytes: the same 2 KiB as the float32
// kernel's (gemv.cc), a few hundred nanoseconds of one core's share of the bandwidth.
constexpr int64_t kPrefetchAheadBytes = 2048;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

// Loads of as many int8 values as the float vector has lanes, sign-extended and converted to
// float. Intrinsics, not __builtin_convertvector: GCC 12 turns that conversion into one scalar
// instruction per lane. They carry their instruction set, so they cannot be always_inline
// into the kernel template (which has none): the per-set functions below are `flatten`, which
// inlines them there, where the instruction set is the function's.
#if defined(__x86_64__)
struct Avx512Int8 {
  using V = Vec16;
  __attribute__((target("avx512f"))) static inline V Load(const int8_t* p) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return reinterpret_cast<V>(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)));
  }
};
struct Avx2Int8 {
  using V = Vec8;
  __attribute__((target("avx2"))) static inline V Load(const int8_t* p) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return reinterpret_cast<V>(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)));
  }
};
#endif
#if defined(__aarch64__)
struct NeonInt8 {
  using V = Vec4;
  [[gnu::always_inline]] static inline V Load(const int8_t* p) {
    int32_t word;
    std::memcpy(&word, p, sizeof word);
    const int16x8_t wide = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(word)));
    return reinterpret_cast<V>(vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide))));
  }
};
#endif

// Four weight rows at a time, as the float32 kernel: each block of x is loaded once for four
// rows, and eight independent multiply-add chains keep loads in flight. Every x row runs
// against the four rows while they are in L1/L2, so a few x rows read the weights from memory
// once. L: one of the loads above, L::V its float vector.
template <typename L>
[[gnu::always_inline]] inline void Int8RowsVector(const int8_t* w, int64_t ldw,
                                                  const float* scale, const float* x,
                                                  int64_t ldx, int64_t m, float* y, int64_t ldy,
                                                  int64_t k, int64_t r0, int64_t r1) {
  using V = typename L::V;
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  constexpr int64_t kStep = 2 * kLanes;
  const int64_t kv = k / kStep * kStep;
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const int8_t* p0 = w + r * ldw;
    const int8_t* p1 = p0 + ldw;
    const int8_t* p2 = p1 + ldw;
    const int8_t* p3 = p2 + ldw;
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * ldx;
      V a00{}, a01{}, a10{}, a11{}, a20{}, a21{}, a30{}, a31{};
      for (int64_t j = 0; j < kv; j += kStep) {
        // One 64-byte line of each row per 64 int8 values: prefetch at line boundaries.
        if (i == 0 && (j & 63) == 0 && j + kPrefetchAheadBytes < k) {
          __builtin_prefetch(p0 + j + kPrefetchAheadBytes, 0, 0);
          __builtin_prefetch(p1 + j + kPrefetchAheadBytes, 0, 0);
          __builtin_prefetch(p2 + j + kPrefetchAheadBytes, 0, 0);
          __builtin_prefetch(p3 + j + kPrefetchAheadBytes, 0, 0);
        }
        const V xa = LoadVector<V>(xi + j);
        const V xb = LoadVector<V>(xi + j + kLanes);
        a00 += L::Load(p0 + j) * xa;
        a01 += L::Load(p0 + j + kLanes) * xb;
        a10 += L::Load(p1 + j) * xa;
        a11 += L::Load(p1 + j + kLanes) * xb;
        a20 += L::Load(p2 + j) * xa;
        a21 += L::Load(p2 + j + kLanes) * xb;
        a30 += L::Load(p3 + j) * xa;
        a31 += L::Load(p3 + j + kLanes) * xb;
      }
      float s0 = SumLanes<V>(a00 + a01);
      float s1 = SumLanes<V>(a10 + a11);
      float s2 = SumLanes<V>(a20 + a21);
      float s3 = SumLanes<V>(a30 + a31);
      for (int64_t j = kv; j < k; ++j) {
        s0 += static_cast<float>(p0[j]) * xi[j];
        s1 += static_cast<float>(p1[j]) * xi[j];
        s2 += static_cast<float>(p2[j]) * xi[j];
        s3 += static_cast<float>(p3[j]) * xi[j];
      }
      float* yi = y + i * ldy;
      yi[r] = s0 * scale[r];
      yi[r + 1] = s1 * scale[r + 1];
      yi[r + 2] = s2 * scale[r + 2];
      yi[r + 3] = s3 * scale[r + 3];
    }
  }
  for (; r < r1; ++r) {  // the last rows of this thread's share, one at a time
    const int8_t* p = w + r * ldw;
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * ldx;
      V a0{}, a1{};
      for (int64_t j = 0; j < kv; j += kStep) {
        a0 += L::Load(p + j) * LoadVector<V>(xi + j);
        a1 += L::Load(p + j + kLanes) * LoadVector<V>(xi + j + kLanes);
      }
      float s = SumLanes<V>(a0 + a1);
      for (int64_t j = kv; j < k; ++j) s += static_cast<float>(p[j]) * xi[j];
      y[i * ldy + r] = s * scale[r];
    }
  }
}

// Plain C++: correct on any architecture, and what the compiler makes of it.
void Int8RowsScalar(const int8_t* w, int64_t ldw, const float* scale, const float* x,
                    int64_t ldx, int64_t m, float* y, int64_t ldy, int64_t k, int64_t r0,
                    int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const int8_t* p = w + r * ldw;
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * ldx;
      float s = 0.0f;
      for (int64_t j = 0; j < k; ++j) s += static_cast<float>(p[j]) * xi[j];
      y[i * ldy + r] = s * scale[r];
    }
  }
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,fma"), flatten)) void Int8RowsAvx512(
    const int8_t* w, int64_t ldw, const float* scale, const float* x, int64_t ldx, int64_t m,
    float* y, int64_t ldy, int64_t k, int64_t r0, int64_t r1) {
  Int8RowsVector<Avx512Int8>(w, ldw, scale, x, ldx, m, y, ldy, k, r0, r1);
}

__attribute__((target("avx2,fma"), flatten)) void Int8RowsAvx2(const int8_t* w, int64_t ldw,
                                                     const float* scale, const float* x,
                                                     int64_t ldx, int64_t m, float* y,
                                                     int64_t ldy, int64_t k, int64_t r0,
                                                     int64_t r1) {
  Int8RowsVector<Avx2Int8>(w, ldw, scale, x, ldx, m, y, ldy, k, r0, r1);
}
#endif

#if defined(__aarch64__)
void Int8RowsNeon(const int8_t* w, int64_t ldw, const float* scale, const float* x,
                  int64_t ldx, int64_t m, float* y, int64_t ldy, int64_t k, int64_t r0,
                  int64_t r1) {
  Int8RowsVector<NeonInt8>(w, ldw, scale, x, ldx, m, y, ldy, k, r0, r1);
}
#endif
#pragma GCC diagnostic pop

Int8RowsFn Int8RowsFor(CpuIsa isa) {
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
      return Int8RowsScalar;
  }
}

bool KernelFits(const at::Tensor& x, const Int8Matrix& weight, const at::Tensor& bias,
                const at::Tensor& out) {
  const at::Tensor& w = weight.values;
  return x.is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 &&
         x.size(0) <= kInt8KernelMaxRows && x.size(1) == w.size(1) && x.stride(1) == 1 &&
         w.is_cpu() && w.scalar_type() == at::kChar && w.dim() == 2 && w.stride(1) == 1 &&
         weight.scale.scalar_type() == at::kFloat && weight.scale.is_contiguous() &&
         weight.scale.numel() == w.size(0) && out.is_cpu() &&
         out.scalar_type() == at::kFloat && out.is_contiguous() && out.dim() == 2 &&
         out.size(0) == x.size(0) && out.size(1) == w.size(0) &&
         (!bias.defined() || (bias.is_cpu() && bias.scalar_type() == at::kFloat &&
                              bias.numel() == w.size(0)));
}

void RunInt8(Int8RowsFn rows_fn, const at::Tensor& x, const Int8Matrix& weight,
             const at::Tensor& bias, at::Tensor& out) {
  const int64_t n = weight.rows();
  const int64_t k = weight.cols();
  const int64_t m = x.size(0);
  const int8_t* w = weight.values.data_ptr<int8_t>();
  const int64_t ldw = weight.values.stride(0);
  const float* scale = weight.scale.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  const int64_t ldx = x.stride(0);
  float* yp = out.data_ptr<float>();
  // As the float32 kernel: static blocks of a multiple of four rows per thread.
  const int threads = n * k < (1 << 18) ? 1 : SingleRowThreads();
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num();
    const int64_t count = omp_get_num_threads();
    const int64_t quads = (n + 3) / 4;
    const int64_t begin = std::min(n, quads * t / count * 4);
    const int64_t end = std::min(n, quads * (t + 1) / count * 4);
    rows_fn(w, ldw, scale, xp, ldx, m, yp, n, k, begin, end);
  }
  if (bias.defined()) out.add_(bias.view({1, n}));
}

void Run(Int8RowsFn rows_fn, const at::Tensor& x, const Int8Matrix& weight,
         const at::Tensor& bias, at::Tensor& out) {
  if (KernelFits(x, weight, bias, out)) {
    RunInt8(rows_fn, x, weight, bias, out);
    return;
  }
  // A prompt's many rows (or inputs the kernel does not take): BLAS, on the matrix
  // dequantized a block of rows at a time, so that a large matrix (a 128k-row LM head) never
  // needs a float32 copy of itself. This allocates; decode never comes here.
  const at::Tensor xf = x.to(at::kFloat);
  const int64_t n = weight.rows();
  const int64_t k = weight.cols();
  const int64_t block = std::max<int64_t>(64, (int64_t{4} << 20) / std::max<int64_t>(1, 4 * k));
  at::Tensor result = at::empty({x.size(0), n}, xf.options());
  for (int64_t r0 = 0; r0 < n; r0 += block) {
    const int64_t rows = std::min(block, n - r0);
    const at::Tensor dense = weight.values.narrow(0, r0, rows).to(xf.device(), at::kFloat) *
                             weight.scale.narrow(0, r0, rows).to(xf.device()).view({-1, 1});
    result.narrow(1, r0, rows).copy_(at::mm(xf, dense.t()));
  }
  if (bias.defined()) result.add_(bias.to(result.device(), at::kFloat).view({1, n}));
  out.copy_(result);
}

}  // namespace

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
  static const Int8RowsFn rows_fn = Int8RowsFor(SelectedCpuIsa());
  Run(rows_fn, x, weight, bias, out);
}

at::Tensor LinearInt8(const at::Tensor& x, const Int8Matrix& weight, const at::Tensor& bias) {
  at::Tensor out = at::empty({x.size(0), weight.rows()}, x.options());
  LinearInt8Out(x.stride(-1) == 1 ? x : x.contiguous(), weight, bias, out);
  return out;
}

at::Tensor LinearInt8WithIsa(CpuIsa isa, const at::Tensor& x, const Int8Matrix& weight,
                             const at::Tensor& bias) {
  const std::vector<CpuIsa>& isas = SupportedCpuIsas();
  TORCH_CHECK(std::find(isas.begin(), isas.end(), isa) != isas.end(), "this CPU cannot run ",
              CpuIsaName(isa));
  at::Tensor out = at::empty({x.size(0), weight.rows()}, x.options());
  TORCH_CHECK(KernelFits(x, weight, bias, out), "LinearInt8WithIsa: inputs the kernel takes");
  RunInt8(Int8RowsFor(isa), x, weight, bias, out);
  return out;
}

at::Tensor GatherRowsInt8(const Int8Matrix& table, const at::Tensor& ids) {
  const at::Tensor index = ids.to(table.values.device(), at::kLong).reshape({-1});
  return table.values.index_select(0, index).to(at::kFloat) *
         table.scale.index_select(0, index).view({-1, 1});
}

}  // namespace tophat::kernels
