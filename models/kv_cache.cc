#include "models/kv_cache.h"

#include "absl/strings/str_cat.h"

namespace tophat {

KvCache::KvCache(const ModelConfig& config, int64_t num_layers, int64_t capacity,
                 at::ScalarType dtype, at::Device device)
    : num_layers_(num_layers), capacity_(capacity) {
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  // A submodel with no layers (input with m = 0) still gets a valid, empty cache.
  keys_ = at::zeros({num_layers, capacity, config.num_key_value_heads, config.head_dim}, options);
  values_ = at::zeros_like(keys_);
}

absl::Status KvCache::Truncate(int64_t length) {
  if (length < 0 || length > length_) {
    return absl::OutOfRangeError(absl::StrCat("cannot truncate a KV cache of length ", length_,
                                              " to ", length));
  }
  length_ = length;
  return absl::OkStatus();
}

}  // namespace tophat
