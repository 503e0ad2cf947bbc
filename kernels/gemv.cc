#include "kernels/gemv.h"

#include <sched.h>

#include <omp.h>
#include <sys/mman.h>
#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#elif defined(__x86_64__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <cstring>
#include <fstream>
#include <set>
#include <string>

#include "kernels/prefetch.h"
#include "kernels/vector_types.h"

namespace tophat::kernels {
namespace {

using RowsFn = void (*)(const float* w, int64_t ldw, const float* x, float* y, int64_t k,
                        int64_t r0, int64_t r1);

// GCC warns that 32- and 64-byte vectors change the ABI of functions compiled without AVX;
// these vectors never cross a call: every helper below is always inlined into the functions
// compiled for their instruction set.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

// Four rows at a time: each x chunk is loaded once for four rows, and four independent
// streams (two accumulators each: eight FMA chains) keep more loads in flight than one row
// would. Written once with GCC vector types; each instruction set is this body inlined into a
// function compiled for it, where V becomes zmm (AVX-512), ymm (AVX2) or NEON registers.
template <typename V>
[[gnu::always_inline]] inline void GemvRowsVector(const float* w, int64_t ldw, const float* x,
                                                  float* y, int64_t k, int64_t r0, int64_t r1) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  constexpr int64_t kStep = 2 * kLanes;
  constexpr int64_t kLine = 64 / sizeof(float);
  const int64_t kv = k / kStep * kStep;
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const float* p0 = w + r * ldw;
    const float* p1 = p0 + ldw;
    const float* p2 = p1 + ldw;
    const float* p3 = p2 + ldw;
    V a00{}, a01{}, a10{}, a11{}, a20{}, a21{}, a30{}, a31{};
    for (int64_t j = 0; j < kv; j += kStep) {
      // The next block of rows streams in as this one is read (kernels/prefetch.h): once
      // per 64 bytes of a row.
      if constexpr (kStep >= kLine) {
        for (int64_t off = 0; off < kStep; off += kLine) {
          PrefetchNextBlock(p0, ldw * 4, (j + off) * 4);
        }
      } else if (j % kLine == 0) {
        PrefetchNextBlock(p0, ldw * 4, j * 4);
      }
      const V xa = LoadVector<V>(x + j);
      const V xb = LoadVector<V>(x + j + kLanes);
      a00 += LoadVector<V>(p0 + j) * xa;
      a01 += LoadVector<V>(p0 + j + kLanes) * xb;
      a10 += LoadVector<V>(p1 + j) * xa;
      a11 += LoadVector<V>(p1 + j + kLanes) * xb;
      a20 += LoadVector<V>(p2 + j) * xa;
      a21 += LoadVector<V>(p2 + j + kLanes) * xb;
      a30 += LoadVector<V>(p3 + j) * xa;
      a31 += LoadVector<V>(p3 + j + kLanes) * xb;
    }
    float s0 = SumLanes<V>(a00 + a01);
    float s1 = SumLanes<V>(a10 + a11);
    float s2 = SumLanes<V>(a20 + a21);
    float s3 = SumLanes<V>(a30 + a31);
    for (int64_t j = kv; j < k; ++j) {
      s0 += p0[j] * x[j];
      s1 += p1[j] * x[j];
      s2 += p2[j] * x[j];
      s3 += p3[j] * x[j];
    }
    y[r] = s0;
    y[r + 1] = s1;
    y[r + 2] = s2;
    y[r + 3] = s3;
  }
  for (; r < r1; ++r) {  // the last rows of this thread's share, one at a time
    const float* p = w + r * ldw;
    V a0{}, a1{};
    for (int64_t j = 0; j < kv; j += kStep) {
      a0 += LoadVector<V>(p + j) * LoadVector<V>(x + j);
      a1 += LoadVector<V>(p + j + kLanes) * LoadVector<V>(x + j + kLanes);
    }
    float s = SumLanes<V>(a0 + a1);
    for (int64_t j = kv; j < k; ++j) s += p[j] * x[j];
    y[r] = s;
  }
}

// Plain C++ with no vector types: correct on any architecture, and what the compiler makes of
// it (it may vectorize for the baseline instruction set).
void GemvRowsScalar(const float* w, int64_t ldw, const float* x, float* y, int64_t k,
                    int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* p = w + r * ldw;
    float s = 0.0f;
    for (int64_t j = 0; j < k; ++j) s += p[j] * x[j];
    y[r] = s;
  }
}

#if defined(__x86_64__)
__attribute__((target("avx512f,fma"))) void GemvRowsAvx512(const float* w, int64_t ldw,
                                                          const float* x, float* y, int64_t k,
                                                          int64_t r0, int64_t r1) {
  GemvRowsVector<Vec16>(w, ldw, x, y, k, r0, r1);
}

__attribute__((target("avx2,fma"))) void GemvRowsAvx2(const float* w, int64_t ldw,
                                                     const float* x, float* y, int64_t k,
                                                     int64_t r0, int64_t r1) {
  GemvRowsVector<Vec8>(w, ldw, x, y, k, r0, r1);
}
#endif

#if defined(__aarch64__)
// Advanced SIMD is part of the aarch64 baseline: 16-byte vectors are NEON registers and the
// multiply-adds fuse into fmla (the kernels are compiled with -ffp-contract=fast).
void GemvRowsNeon(const float* w, int64_t ldw, const float* x, float* y, int64_t k, int64_t r0,
                  int64_t r1) {
  GemvRowsVector<Vec4>(w, ldw, x, y, k, r0, r1);
}
#endif
#pragma GCC diagnostic pop

RowsFn RowsFor(CpuIsa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:
      return GemvRowsAvx512;
    case CpuIsa::kAvx2:
      return GemvRowsAvx2;
#endif
#if defined(__aarch64__)
    case CpuIsa::kNeon:
      return GemvRowsNeon;
#endif
    default:
      return GemvRowsScalar;
  }
}

std::vector<CpuIsa> DetectIsas() {
  std::vector<CpuIsa> isas = {CpuIsa::kScalar};
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool fma = __builtin_cpu_supports("fma");
  if (fma && __builtin_cpu_supports("avx2")) isas.push_back(CpuIsa::kAvx2);
  if (fma && __builtin_cpu_supports("avx512f")) isas.push_back(CpuIsa::kAvx512);
#elif defined(__aarch64__)
  isas.push_back(CpuIsa::kNeon);
#endif
  return isas;
}

}  // namespace

bool CpuHasBf16Arithmetic() {
#if defined(__x86_64__)
  // CPUID directly: GCC and Clang 14 name these features differently (or not at all) in
  // __builtin_cpu_supports. Leaf 7 subleaf 1 EAX bit 5: AVX512_BF16; subleaf 0 EDX bit 22:
  // AMX-BF16.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5)) != 0) return true;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx & (1u << 22)) != 0;
#elif defined(__aarch64__)
  return (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0;
#else
  return false;
#endif
}

namespace {

CpuIsa ChooseIsa() {
  const std::vector<CpuIsa>& isas = SupportedCpuIsas();
  const char* wanted = std::getenv("TOPHAT_CPU_ISA");
  if (wanted == nullptr || *wanted == '\0') return isas.back();
  for (CpuIsa isa : isas) {
    if (CpuIsaName(isa) == wanted) return isa;
  }
  std::string names;
  for (CpuIsa isa : isas) names += std::string(names.empty() ? "" : ", ") + CpuIsaName(isa).data();
  std::fprintf(stderr, "TOPHAT_CPU_ISA=%s: this CPU runs %s; using %s\n", wanted, names.c_str(),
               CpuIsaName(isas.back()).data());
  return isas.back();
}

int CountCores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return 1;
  std::set<std::string> cores;  // one entry per core: the list of its SMT siblings
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::string siblings;
    // core_cpus_list since Linux 5.4; thread_siblings_list before (the same content).
    for (const char* name : {"core_cpus_list", "thread_siblings_list"}) {
      std::ifstream file(dir + name);
      if (file && std::getline(file, siblings) && !siblings.empty()) break;
      siblings.clear();
    }
    if (siblings.empty()) return std::max(1, CPU_COUNT(&mask));
    cores.insert(siblings);
  }
  return std::max<int>(1, static_cast<int>(cores.size()));
}

std::atomic<int> single_row_threads{0};  // 0: CoresForCompute()

bool SingleRowFits(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return x.is_cpu() && weight.is_cpu() && x.scalar_type() == at::kFloat &&
         weight.scalar_type() == at::kFloat && x.dim() == 2 && x.size(0) == 1 &&
         weight.dim() == 2 && x.size(1) == weight.size(1) &&
         (weight.stride(1) == 1 || weight.size(1) == 1) &&
         weight.stride(0) >= weight.size(1) &&
         (!bias.defined() || (bias.scalar_type() == at::kFloat && bias.is_cpu() &&
                              bias.numel() == weight.size(0)));
}

// The kernel where the inputs fit it (and `y` is a contiguous float32 [1, N]), at::linear
// otherwise.
void RunSingleRow(RowsFn rows_fn, const at::Tensor& x, const at::Tensor& weight,
                  const at::Tensor& bias, at::Tensor& y) {
  const int64_t n = weight.size(0);
  if (!SingleRowFits(x, weight, bias) || !y.is_cpu() || y.scalar_type() != at::kFloat ||
      !y.is_contiguous() || y.numel() != n) {
    y.copy_(bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight));
    return;
  }
  const at::Tensor xc = x.contiguous();
  const int64_t k = weight.size(1);
  const int64_t ldw = weight.stride(0);
  const float* w = weight.data_ptr<float>();
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Static contiguous row blocks, a multiple of four rows each: each thread streams one
  // slice of the matrix through the four-row loop.
  ParallelRowBlocks(n, n * k < (1 << 16) ? 1 : SingleRowThreads(),
                    [&](int64_t begin, int64_t end) { rows_fn(w, ldw, xp, yp, k, begin, end); });
  if (bias.defined()) y.add_(bias.view({1, n}));
}

}  // namespace

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kNeon:
      return "neon";
  }
  return "unknown";
}

int CoresForCompute() {
  static const int cores = CountCores();
  return cores;
}

void ParallelRowBlocks(int64_t n, int threads, absl::FunctionRef<void(int64_t, int64_t)> rows) {
  if (threads <= 1) {
    rows(0, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const auto [begin, end] = RowBlockShare(n, omp_get_thread_num(), omp_get_num_threads());
    rows(begin, end);
  }
}

std::pair<int64_t, int64_t> RowBlockShare(int64_t n, int t, int count) {
  const int64_t quads = (n + 3) / 4;
  return {std::min(n, quads * t / count * 4), std::min(n, quads * (t + 1) / count * 4)};
}

int SingleRowThreads() {
  const int threads = single_row_threads.load(std::memory_order_relaxed);
  return threads > 0 ? threads : CoresForCompute();
}

void SetSingleRowThreads(int threads) {
  single_row_threads.store(std::max(0, threads), std::memory_order_relaxed);
}

const std::vector<CpuIsa>& SupportedCpuIsas() {
  static const std::vector<CpuIsa> isas = DetectIsas();
  return isas;
}

CpuIsa SelectedCpuIsa() {
  static const CpuIsa isa = ChooseIsa();
  return isa;
}

at::Tensor LinearSingleRow(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!SingleRowFits(x, weight, bias)) {
    return bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
  }
  at::Tensor y = at::empty({1, weight.size(0)}, x.options());
  LinearSingleRowOut(x, weight, bias, y);
  return y;
}

void LinearSingleRowOut(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        at::Tensor& out) {
  static const RowsFn rows_fn = RowsFor(SelectedCpuIsa());
  RunSingleRow(rows_fn, x, weight, bias, out);
}

bool LinearFewRowsOut(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      at::Tensor& out) {
  if (x.dim() != 2 || x.size(0) < 2 || x.size(0) > kFewRowsMax || !x.is_contiguous() ||
      !SingleRowFits(x.narrow(0, 0, 1), weight, bias) || !out.is_cpu() ||
      out.scalar_type() != at::kFloat || !out.is_contiguous() || out.dim() != 2 ||
      out.size(0) != x.size(0) || out.size(1) != weight.size(0)) {
    return false;
  }
  // TOPHAT_FEW_ROWS=off leaves every few-row product to BLAS: for measuring what the kernel
  // saves (docs/benchmarks.md).
  static const bool enabled = [] {
    const char* setting = std::getenv("TOPHAT_FEW_ROWS");
    return setting == nullptr || std::string_view(setting) != "off";
  }();
  if (!enabled) return false;
  static const RowsFn rows_fn = RowsFor(SelectedCpuIsa());
  const int64_t rows = x.size(0);
  const int64_t n = weight.size(0);
  const int64_t k = weight.size(1);
  const int64_t ldw = weight.stride(0);
  const float* w = weight.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  // Weight rows a block: about 16 KiB of them (at least four, a multiple of four), so that a
  // block read from memory for the first x row is still in the core's L1 for the others.
  // Measured on the 2-vCPU EPYC VM (tophat-bench-engine, bench-110m's middle, K = 768): 4 to
  // 32 KiB blocks ran B=2..8 steps alike, 64 KiB 5-15% and 192 KiB 10-50% slower.
  const int64_t block = std::max<int64_t>(4, (int64_t{16} << 10) / (4 * k) / 4 * 4);
  ParallelRowBlocks(n, n * k < (1 << 16) ? 1 : SingleRowThreads(), [&](int64_t begin, int64_t end) {
    for (int64_t b0 = begin; b0 < end; b0 += block) {
      const int64_t b1 = std::min(end, b0 + block);
      for (int64_t r = 0; r < rows; ++r) {
        rows_fn(w, ldw, xp + r * k, yp + r * n, k, b0, b1);
      }
    }
  });
  if (bias.defined()) out.add_(bias.view({1, n}));
  return true;
}

void LinearRowsFloat32(const float* w, int64_t ldw, const float* x, float* y, int64_t k,
                       int64_t r0, int64_t r1) {
  static const RowsFn rows_fn = RowsFor(SelectedCpuIsa());
  rows_fn(w, ldw, x, y, k, r0, r1);
}

at::Tensor LinearSingleRowWithIsa(CpuIsa isa, const at::Tensor& x, const at::Tensor& weight,
                                  const at::Tensor& bias) {
  CheckIsaSupported(isa, SupportedCpuIsas(), CpuIsaName(isa));
  if (!SingleRowFits(x, weight, bias)) {
    return bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
  }
  at::Tensor y = at::empty({1, weight.size(0)}, x.options());
  RunSingleRow(RowsFor(isa), x, weight, bias, y);
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
