// Measured hardware limits of the machine the model runs on: the sustained read bandwidth
// of main memory (bounds decode, which streams every weight once per token) and the
// float32 GEMM rate of the BLAS LibTorch uses (bounds prefill).
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

namespace tophat {

struct BandwidthOptions {
  // Bytes to stream; 0 picks max(1 GiB, 8x the last-level cache), far larger than the LLC
  // so that the figure is DRAM bandwidth, not cache bandwidth.
  int64_t bytes = 0;
  // The result is the best of this many full passes over the buffer.
  int repetitions = 5;
  // Reader threads; 0 uses one per CPU this process may run on.
  int threads = 0;
  // Ask for transparent huge pages (MADV_HUGEPAGE) on the buffer. With 4 KiB pages the
  // figure includes TLB-miss cost, which is large under virtualisation (measured on the
  // 2-vCPU KVM dev box: 20 GB/s with 4 KiB pages vs 31 GB/s with huge pages).
  bool huge_pages = true;
};

// Sustained read-only bandwidth in bytes/s: every thread sums its own contiguous slice of
// a page-faulted buffer with the widest vector loads the CPU has (AVX-512, AVX2 or the
// SSE2 baseline, chosen at run time). Returns 0 when the buffer cannot be allocated.
double MeasureReadBandwidth(const BandwidthOptions& options = {});

// Float32 GEMM rate in FLOP/s (2*m*n*k per product) of at::mm on [m, k] x [k, n], best of
// `reps` timed runs after a warm-up. With `b_transposed` the right operand is the
// transpose of a contiguous [n, k] matrix, as in at::linear(x, weight).
double MeasureGemmFlops(int64_t m, int64_t n, int64_t k, int reps, bool b_transposed = false);

// The same on an accelerator (at::Device, e.g. cuda:0) in `dtype` (bfloat16 for a GPU's
// matrix units), timed by synchronising the device. Inputs are random, not zeros, which
// some units multiply faster. Returns 0 when the device cannot be used.
double MeasureDeviceGemmFlops(at::Device device, at::ScalarType dtype, int64_t m, int64_t n,
                              int64_t k, int reps);

// Device-memory bandwidth in bytes/s of one large device-to-device copy, counting bytes read
// plus bytes written (the two together are what HBM moves), best of `reps`.
double MeasureDeviceCopyBandwidth(at::Device device, int64_t bytes, int reps);

// Waits until every kernel queued on `device`'s current stream has finished (no-op on CPU).
// Works against any LibTorch, with or without CUDA headers.
void SynchronizeDevice(at::Device device);

// Size of CPU 0's last-level (L3) cache from sysfs, or 0 when unknown.
int64_t LastLevelCacheBytes();

// The buffer size MeasureReadBandwidth uses when BandwidthOptions::bytes is 0.
int64_t DefaultBandwidthBytes();

// CPUs this process may run on (its affinity mask), at least 1.
int UsableCpuCount();

}  // namespace tophat
