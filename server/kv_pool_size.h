// How many bytes the cloud's paged KV pool gets. The pool is allocated once at start-up (no
// allocation in the step), so its size is decided here, from the config and, on a GPU, from
// the memory the device has left once the weights are loaded.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"

namespace tophat {

struct KvPoolSizeInputs {
  int64_t memory_bytes = 0;      // kv_cache.memory_bytes
  double memory_fraction = 0;    // kv_cache.memory_fraction; 0: use memory_bytes
  bool on_gpu = false;           // the middle submodel runs on a CUDA device
  std::optional<int64_t> device_free_bytes;  // that device's free memory, when known
};

// memory_fraction > 0 (GPU only): that fraction of the device's free memory. Otherwise
// memory_bytes, which on a GPU must fit in its free memory. Errors name the config key.
absl::StatusOr<int64_t> KvPoolBytes(const KvPoolSizeInputs& inputs);

}  // namespace tophat
