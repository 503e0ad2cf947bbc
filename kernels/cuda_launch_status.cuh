// What a launcher here returns once its kernels are queued: kLaunched, or kCudaError with
// the runtime's message in *error (when error is non-null). For .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda_launch.h"

namespace tophat::kernels {

inline LaunchResult LaunchStatus(std::string* error) {
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return LaunchResult::kLaunched;
  if (error != nullptr) *error = cudaGetErrorString(status);
  return LaunchResult::kCudaError;
}

}  // namespace tophat::kernels
