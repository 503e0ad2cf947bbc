#include "kernels/cuda_device.h"

#ifdef TOPHAT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace tophat::kernels {

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
