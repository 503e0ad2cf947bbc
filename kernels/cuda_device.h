// What a CUDA device has to give, asked of the CUDA runtime directly: LibTorch's own query
// (c10::cuda) exists only in CUDA builds of LibTorch, and this must compile against
// Debian's CPU one too.
#pragma once

#include <cstdint>
#include <optional>

namespace tophat::kernels {

struct CudaMemoryInfo {
  int64_t free_bytes = 0;   // not held by any context or allocator, this process's included
  int64_t total_bytes = 0;
};

// Memory of CUDA device `index`, or nullopt when this build has no CUDA kernels or the
// runtime cannot reach that device.
std::optional<CudaMemoryInfo> QueryCudaMemory(int index);

}  // namespace tophat::kernels
