#include "kernels/cuda_device.h"

#include <c10/util/Exception.h>

#include <atomic>

#ifdef TOPHAT_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "kernels/cuda_device_attribute.cuh"
#endif

namespace tophat::kernels {

void* CurrentCudaStream() {
#ifdef TOPHAT_HAVE_CUDA
  return c10::cuda::getCurrentCUDAStream().stream();
#else
  return nullptr;
#endif
}

namespace {
std::atomic<bool> overlap_setting{true};
}  // namespace

void SetOverlapKernelLaunches(bool enabled) {
  overlap_setting.store(enabled, std::memory_order_relaxed);
}

bool OverlapKernelLaunches() {
#ifdef TOPHAT_HAVE_CUDA
  if (!overlap_setting.load(std::memory_order_relaxed)) return false;
  const std::optional<int> major =
      CurrentDeviceAttribute<cudaDevAttrComputeCapabilityMajor>();
  return major.has_value() && *major >= 9;
#else
  return false;
#endif
}

CudaFence::~CudaFence() {
#ifdef TOPHAT_HAVE_CUDA
  if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
#endif
}

CudaFence& CudaFence::operator=(CudaFence&& other) noexcept {
  if (this != &other) {
#ifdef TOPHAT_HAVE_CUDA
    if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
#endif
    event_ = other.event_;
    other.event_ = nullptr;
  }
  return *this;
}

void CudaFence::Record() {
#ifdef TOPHAT_HAVE_CUDA
  if (event_ == nullptr) {
    cudaEvent_t event = nullptr;
    const cudaError_t created = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    TORCH_CHECK(created == cudaSuccess, "cudaEventCreate: ", cudaGetErrorString(created));
    event_ = event;
  }
  const cudaError_t recorded = cudaEventRecord(static_cast<cudaEvent_t>(event_),
                                               static_cast<cudaStream_t>(CurrentCudaStream()));
  TORCH_CHECK(recorded == cudaSuccess, "cudaEventRecord: ", cudaGetErrorString(recorded));
#endif
}

void CudaFence::Wait() {
#ifdef TOPHAT_HAVE_CUDA
  if (event_ == nullptr) return;
  const cudaError_t done = cudaEventSynchronize(static_cast<cudaEvent_t>(event_));
  TORCH_CHECK(done == cudaSuccess, "cudaEventSynchronize: ", cudaGetErrorString(done));
#endif
}

std::optional<std::string> CudaContextFault(int index) {
#ifdef TOPHAT_HAVE_CUDA
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  if (index >= 0 && index != previous) {
    if (const cudaError_t set = cudaSetDevice(index); set != cudaSuccess) {
      return std::string(cudaGetErrorName(set)) + ": " + cudaGetErrorString(set);
    }
  }
  cudaError_t synced = cudaDeviceSynchronize();
  if (synced != cudaSuccess) {
    // A sticky error stays; anything else the first synchronize (or an earlier launch) left
    // is cleared here and does not come back.
    cudaGetLastError();
    synced = cudaDeviceSynchronize();
  }
  if (index >= 0 && previous >= 0 && index != previous) cudaSetDevice(previous);
  if (synced == cudaSuccess) return std::nullopt;
  return std::string(cudaGetErrorName(synced)) + ": " + cudaGetErrorString(synced);
#else
  (void)index;
  return std::nullopt;
#endif
}

std::optional<CudaMemoryInfo> QueryCudaMemory(int index) {
#ifdef TOPHAT_HAVE_CUDA
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(index) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later launches do not report it
    return std::nullopt;
  }
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  const cudaError_t status = cudaMemGetInfo(&free_bytes, &total_bytes);
  cudaSetDevice(previous);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  return CudaMemoryInfo{.free_bytes = static_cast<int64_t>(free_bytes),
                        .total_bytes = static_cast<int64_t>(total_bytes)};
#else
  (void)index;
  return std::nullopt;
#endif
}

}  // namespace tophat::kernels
