// What the host side of every CUDA kernel here shares: the storage dtypes the kernels are
// instantiated for and the outcome of a launch. Includable from .cc files (no CUDA types).
#pragma once

#include <optional>

#include <c10/core/ScalarType.h>

namespace tophat::kernels {

enum class CudaDtype { kFloat32, kFloat16, kBFloat16 };

// kUnsupported: nothing launched, the caller takes its composite path; kCudaError: the
// launch itself failed (the launcher fills its error string).
enum class LaunchResult { kLaunched, kUnsupported, kCudaError };

inline std::optional<CudaDtype> ToCudaDtype(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return CudaDtype::kFloat32;
    case c10::ScalarType::Half:
      return CudaDtype::kFloat16;
    case c10::ScalarType::BFloat16:
      return CudaDtype::kBFloat16;
    default:
      return std::nullopt;
  }
}

}  // namespace tophat::kernels
