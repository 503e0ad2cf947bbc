#include "server/kv_pool_size.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tophat {
namespace {

std::string MiB(int64_t bytes) { return absl::StrFormat("%.0f MiB", bytes / 1048576.0); }

}  // namespace

absl::StatusOr<int64_t> KvPoolBytes(const KvPoolSizeInputs& inputs) {
  if (inputs.memory_fraction > 0) {
    if (!inputs.on_gpu) {
      return absl::InvalidArgumentError(
          "kv_cache.memory_fraction sizes the pool from free GPU memory, but the device is the "
          "CPU; set kv_cache.memory_bytes instead");
    }
    if (!inputs.device_free_bytes) {
      return absl::FailedPreconditionError(
          "kv_cache.memory_fraction: the CUDA runtime did not report the device's free memory "
          "(a build without CUDA kernels?); set kv_cache.memory_bytes instead");
    }
    const auto bytes = static_cast<int64_t>(
        std::floor(inputs.memory_fraction * static_cast<double>(*inputs.device_free_bytes)));
    if (bytes <= 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "kv_cache.memory_fraction: ", inputs.memory_fraction, " of the device's free ",
          MiB(*inputs.device_free_bytes), " leaves nothing for the KV pool"));
    }
    return bytes;
  }
  if (inputs.on_gpu && inputs.device_free_bytes &&
      inputs.memory_bytes > *inputs.device_free_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "kv_cache.memory_bytes: ", MiB(inputs.memory_bytes), " does not fit the ",
        MiB(*inputs.device_free_bytes),
        " the GPU has free after loading the weights; lower it or use kv_cache.memory_fraction"));
  }
  return inputs.memory_bytes;
}

}  // namespace tophat
