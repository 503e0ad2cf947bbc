// The key/value cache of one sequence over the layers of one submodel.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "models/config.h"

namespace tophat {

// Storage is allocated once, for `capacity` positions, so appending never allocates.
// length() is the number of positions whose K/V are stored: the position of the next token.
class KvCache {
 public:
  KvCache(const ModelConfig& config, int64_t num_layers, int64_t capacity, at::ScalarType dtype,
          at::Device device);

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  int64_t num_layers() const { return num_layers_; }

  // Rolls back to `length` positions (speculative rejection, cloud restart replay).
  absl::Status Truncate(int64_t length);
  void Clear() { length_ = 0; }

  // [capacity, kv_heads, head_dim] views of one layer's storage.
  at::Tensor keys(int64_t layer) const { return keys_[layer]; }
  at::Tensor values(int64_t layer) const { return values_[layer]; }

  // Called by the forward pass after every layer has written `count` new positions.
  void Advance(int64_t count) { length_ += count; }

 private:
  int64_t num_layers_;
  int64_t capacity_;
  int64_t length_ = 0;
  at::Tensor keys_;    // [num_layers, capacity, kv_heads, head_dim]
  at::Tensor values_;  // same
};

}  // namespace tophat
