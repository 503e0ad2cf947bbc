#include "kernels/gemv.h"

#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>

namespace tophat::kernels {
namespace {

using RowsFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t);

// Four independent accumulators keep the FMA latency off the critical path; one row at a
// time keeps the weight reads one sequential stream per thread.
__attribute__((target("avx512f,fma"))) void GemvRowsAvx512(const float* w, const float* x,
                                                          float* y, int64_t k, int64_t r0,
                                                          int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* p = w + r * k;
    __m512 a0 = _mm512_setzero_ps();
    __m512 a1 = a0;
    __m512 a2 = a0;
    __m512 a3 = a0;
    int64_t j = 0;
    for (; j + 64 <= k; j += 64) {
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(p + j), _mm512_loadu_ps(x + j), a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(p + j + 16), _mm512_loadu_ps(x + j + 16), a1);
      a2 = _mm512_fmadd_ps(_mm512_loadu_ps(p + j + 32), _mm512_loadu_ps(x + j + 32), a2);
      a3 = _mm512_fmadd_ps(_mm512_loadu_ps(p + j + 48), _mm512_loadu_ps(x + j + 48), a3);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    for (; j < k; ++j) s += p[j] * x[j];
    y[r] = s;
  }
}

__attribute__((target("avx2,fma"))) void GemvRowsAvx2(const float* w, const float* x, float* y,
                                                     int64_t k, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* p = w + r * k;
    __m256 a0 = _mm256_setzero_ps();
    __m256 a1 = a0;
    __m256 a2 = a0;
    __m256 a3 = a0;
    int64_t j = 0;
    for (; j + 32 <= k; j += 32) {
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(p + j), _mm256_loadu_ps(x + j), a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(p + j + 8), _mm256_loadu_ps(x + j + 8), a1);
      a2 = _mm256_fmadd_ps(_mm256_loadu_ps(p + j + 16), _mm256_loadu_ps(x + j + 16), a2);
      a3 = _mm256_fmadd_ps(_mm256_loadu_ps(p + j + 24), _mm256_loadu_ps(x + j + 24), a3);
    }
    __m256 sum = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    float s = _mm_cvtss_f32(lo);
    for (; j < k; ++j) s += p[j] * x[j];
    y[r] = s;
  }
}

void GemvRowsScalar(const float* w, const float* x, float* y, int64_t k, int64_t r0,
                    int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* p = w + r * k;
    float s = 0.0f;
    for (int64_t j = 0; j < k; ++j) s += p[j] * x[j];
    y[r] = s;
  }
}

RowsFn PickRows() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) return GemvRowsAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return GemvRowsAvx2;
  return GemvRowsScalar;
}

}  // namespace

at::Tensor LinearSingleRow(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const bool fast = x.is_cpu() && weight.is_cpu() && x.scalar_type() == at::kFloat &&
                    weight.scalar_type() == at::kFloat && x.dim() == 2 && x.size(0) == 1 &&
                    weight.dim() == 2 && weight.is_contiguous() && x.size(1) == weight.size(1) &&
                    (!bias.defined() || (bias.scalar_type() == at::kFloat && bias.is_cpu()));
  if (!fast) return bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
  static const RowsFn rows_fn = PickRows();
  const at::Tensor xc = x.contiguous();
  const int64_t n = weight.size(0);
  const int64_t k = weight.size(1);
  at::Tensor y = at::empty({1, n}, x.options());
  const float* w = weight.data_ptr<float>();
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Static contiguous row blocks: each thread streams one slice of the matrix.
  const int threads = n * k < (1 << 16) ? 1 : omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num();
    const int64_t count = omp_get_num_threads();
    const int64_t begin = n * t / count;
    const int64_t end = n * (t + 1) / count;
    rows_fn(w, xp, yp, k, begin, end);
  }
  if (bias.defined()) y.add_(bias.view({1, n}));
  return y;
}

at::Tensor CopyToHugePages(const at::Tensor& t) {
  if (!t.is_cpu() || t.nbytes() == 0) return t;
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = (t.nbytes() + kHuge - 1) / kHuge * kHuge;
  // Over-allocate by one huge page so the start can be aligned to 2 MiB.
  const size_t mapped = bytes + kHuge;
  void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return t.contiguous();
  auto* aligned = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(base) + kHuge - 1) & ~static_cast<uintptr_t>(kHuge - 1));
  ::madvise(aligned, bytes, MADV_HUGEPAGE);  // advisory: without THP it is plain memory
  at::Tensor out = at::from_blob(
      aligned, t.sizes(), [base, mapped](void*) { ::munmap(base, mapped); }, t.options());
  out.copy_(t);
  return out;
}

}  // namespace tophat::kernels
