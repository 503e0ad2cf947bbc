#include "bench/machine_bounds.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <barrier>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

namespace tophat {
namespace {

using Clock = std::chrono::steady_clock;

// Written with every pass's sum so that the compiler cannot drop the loads.
volatile float g_bandwidth_sink = 0.0f;

// GCC vector types; each kernel uses the widest one its target attribute allows. Eight
// independent accumulators keep eight vector adds in flight, so the loop is limited by
// the loads, not by the add latency.
typedef float Vec4 __attribute__((vector_size(16)));
#if defined(__x86_64__) || defined(__i386__)
typedef float Vec8 __attribute__((vector_size(32)));
typedef float Vec16 __attribute__((vector_size(64)));
#endif

// `p` is aligned to the vector size (slices start on page boundaries).
#define TOPHAT_SUM_KERNEL_BODY(VEC)                                              \
  constexpr size_t kLanes = sizeof(VEC) / sizeof(float);                         \
  const VEC* v = reinterpret_cast<const VEC*>(__builtin_assume_aligned(p, 64));  \
  const size_t vectors = n / kLanes;                                             \
  VEC a0 = {}, a1 = {}, a2 = {}, a3 = {}, a4 = {}, a5 = {}, a6 = {}, a7 = {};    \
  size_t i = 0;                                                                  \
  for (; i + 8 <= vectors; i += 8) {                                             \
    a0 += v[i];                                                                  \
    a1 += v[i + 1];                                                              \
    a2 += v[i + 2];                                                              \
    a3 += v[i + 3];                                                              \
    a4 += v[i + 4];                                                              \
    a5 += v[i + 5];                                                              \
    a6 += v[i + 6];                                                              \
    a7 += v[i + 7];                                                              \
  }                                                                              \
  for (; i < vectors; ++i) a0 += v[i];                                           \
  a0 += a1;                                                                      \
  a2 += a3;                                                                      \
  a4 += a5;                                                                      \
  a6 += a7;                                                                      \
  a0 += a2;                                                                      \
  a4 += a6;                                                                      \
  a0 += a4;                                                                      \
  float sum = 0.0f;                                                              \
  for (size_t lane = 0; lane < kLanes; ++lane) sum += a0[lane];                  \
  for (size_t j = vectors * kLanes; j < n; ++j) sum += p[j];                     \
  return sum;

float SumBaseline(const float* p, size_t n) { TOPHAT_SUM_KERNEL_BODY(Vec4) }

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) float SumAvx2(const float* p, size_t n) {
  TOPHAT_SUM_KERNEL_BODY(Vec8)
}

__attribute__((target("avx512f"))) float SumAvx512(const float* p, size_t n) {
  TOPHAT_SUM_KERNEL_BODY(Vec16)
}
#endif

#undef TOPHAT_SUM_KERNEL_BODY

using SumKernel = float (*)(const float*, size_t);

SumKernel SelectSumKernel() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return SumAvx512;
  if (__builtin_cpu_supports("avx2")) return SumAvx2;
#endif
  return SumBaseline;
}

std::vector<int> UsableCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  return cpus;
}

void PinCurrentThread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  // Best effort: an unpinned reader still measures, only less steadily.
  (void)sched_setaffinity(0, sizeof(set), &set);
}

// Parses sysfs cache sizes such as "32768K".
int64_t ParseCacheSize(const std::string& text) {
  size_t i = 0;
  int64_t value = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    value = value * 10 + (text[i] - '0');
    ++i;
  }
  if (i == 0) return 0;
  if (i < text.size()) {
    switch (std::toupper(static_cast<unsigned char>(text[i]))) {
      case 'K': value <<= 10; break;
      case 'M': value <<= 20; break;
      case 'G': value <<= 30; break;
      default: break;
    }
  }
  return value;
}

}  // namespace

int64_t LastLevelCacheBytes() {
  std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string text;
  if (!(in >> text)) return 0;
  return ParseCacheSize(text);
}

int64_t DefaultBandwidthBytes() {
  return std::max<int64_t>(int64_t{1} << 30, 8 * LastLevelCacheBytes());
}

int UsableCpuCount() {
  const size_t affinity = UsableCpus().size();
  if (affinity > 0) return static_cast<int>(affinity);
  return std::max(1u, std::thread::hardware_concurrency());
}

double MeasureReadBandwidth(const BandwidthOptions& options) {
  std::vector<int> cpus = UsableCpus();
  const int threads = options.threads > 0 ? options.threads : UsableCpuCount();
  const int repetitions = std::max(1, options.repetitions);
  const int64_t requested = options.bytes > 0 ? options.bytes : DefaultBandwidthBytes();

  // Each thread's slice is a whole number of pages, so every slice is vector-aligned.
  constexpr size_t kPageFloats = 4096 / sizeof(float);
  size_t slice = static_cast<size_t>(requested) / sizeof(float) / static_cast<size_t>(threads);
  slice = std::max(kPageFloats, slice / kPageFloats * kPageFloats);
  const size_t total_bytes = slice * static_cast<size_t>(threads) * sizeof(float);

  void* memory = mmap(nullptr, total_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
  if (memory == MAP_FAILED) return 0.0;
#ifdef MADV_HUGEPAGE
  // Fewer TLB misses; the kernel may ignore it.
  if (options.huge_pages) (void)madvise(memory, total_bytes, MADV_HUGEPAGE);
#endif
  float* base = static_cast<float*>(memory);
  const SumKernel sum_kernel = SelectSumKernel();

  // The barrier's completion step stamps the time when the last thread arrives, before any
  // is released: phase 2r starts repetition r, phase 2r+1 ends it.
  std::vector<Clock::time_point> stamps(2 * static_cast<size_t>(repetitions));
  size_t phase = 0;
  auto on_phase = [&stamps, &phase]() noexcept { stamps[phase++] = Clock::now(); };
  std::barrier sync(threads, on_phase);
  std::vector<float> sums(static_cast<size_t>(threads), 0.0f);

  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      if (!cpus.empty()) PinCurrentThread(cpus[static_cast<size_t>(t) % cpus.size()]);
      float* mine = base + static_cast<size_t>(t) * slice;
      // First touch from the reading thread faults the pages in (and places them on its
      // NUMA node) outside the timed passes.
      std::fill(mine, mine + slice, 1.0f);
      float total = 0.0f;
      for (int r = 0; r < repetitions; ++r) {
        sync.arrive_and_wait();
        total += sum_kernel(mine, slice);
        sync.arrive_and_wait();
      }
      sums[static_cast<size_t>(t)] = total;
    });
  }
  for (std::thread& thread : pool) thread.join();
  munmap(memory, total_bytes);

  float sink = 0.0f;
  for (float s : sums) sink += s;
  g_bandwidth_sink = sink;

  double best_seconds = 0.0;
  for (int r = 0; r < repetitions; ++r) {
    const double seconds = std::chrono::duration<double>(stamps[2 * r + 1] - stamps[2 * r]).count();
    if (seconds > 0.0 && (best_seconds == 0.0 || seconds < best_seconds)) best_seconds = seconds;
  }
  if (best_seconds <= 0.0) return 0.0;
  return static_cast<double>(total_bytes) / best_seconds;
}

double MeasureGemmFlops(int64_t m, int64_t n, int64_t k, int reps, bool b_transposed) {
  const at::TensorOptions options = at::TensorOptions().dtype(at::kFloat);
  at::Tensor a = at::randn({m, k}, options);
  at::Tensor b = b_transposed ? at::randn({n, k}, options).t() : at::randn({k, n}, options);
  at::Tensor c = at::empty({m, n}, options);
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);

  // Warm up (thread pool start, BLAS buffers), and size a timed run to at least ~2 ms so
  // that small products are not dominated by the clock.
  at::mm_out(c, a, b);
  auto start = Clock::now();
  at::mm_out(c, a, b);
  const double once = std::chrono::duration<double>(Clock::now() - start).count();
  const int64_t inner = std::clamp<int64_t>(static_cast<int64_t>(2e-3 / std::max(once, 1e-9)), 1, 1000);

  double best = 0.0;
  for (int r = 0; r < std::max(1, reps); ++r) {
    start = Clock::now();
    for (int64_t i = 0; i < inner; ++i) at::mm_out(c, a, b);
    const double seconds =
        std::chrono::duration<double>(Clock::now() - start).count() / static_cast<double>(inner);
    if (seconds > 0.0 && (best == 0.0 || seconds < best)) best = seconds;
  }
  return best > 0.0 ? flops / best : 0.0;
}

void SynchronizeDevice(at::Device device) {
  if (device.is_cpu()) return;
  c10::impl::VirtualGuardImpl impl(device.type());
  impl.getStream(device).synchronize();
}

double MeasureDeviceGemmFlops(at::Device device, at::ScalarType dtype, int64_t m, int64_t n,
                              int64_t k, int reps) {
  try {
    const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(device);
    at::Tensor a = at::randn({m, k}, options);
    at::Tensor b = at::randn({n, k}, options).t();  // as at::linear(x, weight) multiplies
    at::Tensor c = at::empty({m, n}, options);
    const double flops =
        2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    for (int i = 0; i < 3; ++i) at::mm_out(c, a, b);  // handles, kernels, clocks up
    SynchronizeDevice(device);
    double best = 0.0;
    for (int r = 0; r < std::max(1, reps); ++r) {
      constexpr int kInner = 10;
      const auto start = Clock::now();
      for (int i = 0; i < kInner; ++i) at::mm_out(c, a, b);
      SynchronizeDevice(device);
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / kInner;
      if (seconds > 0.0 && (best == 0.0 || seconds < best)) best = seconds;
    }
    return best > 0.0 ? flops / best : 0.0;
  } catch (const std::exception&) {
    return 0.0;
  }
}

double MeasureDeviceCopyBandwidth(at::Device device, int64_t bytes, int reps) {
  try {
    const at::TensorOptions options = at::TensorOptions().dtype(at::kByte).device(device);
    at::Tensor src = at::randint(0, 255, {bytes}, options);
    at::Tensor dst = at::empty({bytes}, options);
    dst.copy_(src);
    SynchronizeDevice(device);
    double best = 0.0;
    for (int r = 0; r < std::max(1, reps); ++r) {
      const auto start = Clock::now();
      dst.copy_(src);
      SynchronizeDevice(device);
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (seconds > 0.0 && (best == 0.0 || seconds < best)) best = seconds;
    }
    return best > 0.0 ? 2.0 * static_cast<double>(bytes) / best : 0.0;
  } catch (const std::exception&) {
    return 0.0;
  }
}

}  // namespace tophat
