// An attribute of the current CUDA device (SM count, compute capability), asked of the
// runtime once per device and then read from a cache: launchers consult these on every
// launch, and cudaDeviceGetAttribute is a driver call. Header-only, for .cu files and for the
// .cc files compiled with the CUDA runtime's headers (kernels/cuda_device.cc).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <optional>

namespace tophat::kernels {

// The attribute's value on the current device, or nullopt when the runtime cannot say (no
// current device, a device index past 63, a refused query); a refusal's error is cleared so
// that the next launch does not report it, and is asked again next time. For attributes whose
// values are not negative (the cache keeps value + 1, 0 meaning not asked yet).
template <cudaDeviceAttr kAttribute>
std::optional<int> CurrentDeviceAttribute() {
  static std::array<std::atomic<int>, 64> cached{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 ||
      device >= static_cast<int>(cached.size())) {
    cudaGetLastError();
    return std::nullopt;
  }
  const int known = cached[device].load(std::memory_order_relaxed);
  if (known > 0) return known - 1;
  int value = 0;
  if (cudaDeviceGetAttribute(&value, kAttribute, device) != cudaSuccess || value < 0) {
    cudaGetLastError();
    return std::nullopt;
  }
  cached[device].store(value + 1, std::memory_order_relaxed);
  return value;
}

}  // namespace tophat::kernels
