// What a CUDA device has to give, asked of the CUDA runtime directly: LibTorch's own query
// (c10::cuda) exists only in CUDA builds of LibTorch, and this must compile against
// Debian's CPU one too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tophat::kernels {

struct CudaMemoryInfo {
  int64_t free_bytes = 0;   // not held by any context or allocator, this process's included
  int64_t total_bytes = 0;
};

// The cudaStream_t LibTorch launches on in this thread (c10::cuda::getCurrentCUDAStream):
// every kernel here launches on it, so that ordering with LibTorch's own ops holds on any
// stream and a CUDA graph capture (which runs on a side stream) records them. nullptr (the
// legacy default stream) in a build without CUDA kernels.
void* CurrentCudaStream();

// Whether the kernels here launch overlapped with the kernel before them in the stream
// (programmatic dependent launch, kernels/cuda_overlap.cuh says how they stay exact): the
// process-wide setting (on unless set off) and a current CUDA device of compute capability
// 9.0 or later. Off in a build without CUDA kernels. The setting is for operators and
// benchmarks (config key `overlap_kernel_launches`, `tophat-bench-engine
// --overlap-launches`); set it before the first step, not while kernels are being queued.
bool OverlapKernelLaunches();
void SetOverlapKernelLaunches(bool enabled);

// A point in the current stream's work that the host can wait for: Record() marks it (a
// CUDA event recorded on CurrentCudaStream()), Wait() blocks until the GPU has passed it.
// What it guards is host memory the GPU reads asynchronously (pinned staging) and must not
// be overwritten before then. Without CUDA kernels, or before the first Record(), Wait()
// returns at once. Move-only; not thread-safe.
class CudaFence {
 public:
  CudaFence() = default;
  ~CudaFence();
  CudaFence(CudaFence&& other) noexcept : event_(other.event_) { other.event_ = nullptr; }
  CudaFence& operator=(CudaFence&& other) noexcept;
  CudaFence(const CudaFence&) = delete;
  CudaFence& operator=(const CudaFence&) = delete;

  void Record();  // throws c10::Error when the runtime refuses
  void Wait();    // throws c10::Error when the runtime reports an error

 private:
  void* event_ = nullptr;  // cudaEvent_t, created on the first Record
};

// Whether CUDA device `index` (-1: this thread's current one) has lost its context: after
// an error that no later call recovers from (a device-side assert, an illegal address, an
// uncorrectable ECC error, the GPU gone from the bus), every call on it fails, and only a
// new process gets a working one. Returns that error's name and text, or nullopt when the
// device still computes (or this build has no CUDA kernels). Waits for the device's queued
// work: ask after a failure, not on the hot path. An error a first synchronize reports but
// a second does not (one a launch returned, not the context's) is cleared, not reported.
std::optional<std::string> CudaContextFault(int index);

// Memory of CUDA device `index`, or nullopt when this build has no CUDA kernels or the
// runtime cannot reach that device.
std::optional<CudaMemoryInfo> QueryCudaMemory(int index);

}  // namespace tophat::kernels
