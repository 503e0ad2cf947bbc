// Packing hidden states into and out of tophat.v1.HiddenStates, with the validation both
// ends apply to anything that arrives over the network.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tophat/v1/cloud.pb.h"

namespace tophat {

absl::StatusOr<v1::DType> ToProtoDType(at::ScalarType dtype);
absl::StatusOr<at::ScalarType> FromProtoDType(v1::DType dtype);
// 0 for DTYPE_UNSPECIFIED or an unknown value.
int64_t ElementBytes(v1::DType dtype);

// Copies a [T, D] tensor (any device) into `out`, reusing out's buffer capacity.
absl::Status PackHiddenStates(const at::Tensor& hidden, v1::HiddenStates* out);

// Checks a received payload against what this end expects, naming the offending field:
// dtype, hidden_size, num_positions against max_positions, and the byte length.
absl::Status ValidateHiddenStates(const v1::HiddenStates& states, v1::DType expected_dtype,
                                  int64_t expected_hidden_size, int64_t max_positions);

// Keeps hidden-state-sized buffers (hundreds of KiB to MiB) on the heap instead of fresh
// mmap()s: glibc's default threshold makes every such payload an mmap + page faults + munmap,
// which costs ~30% of loopback transfer throughput. Call once at process start.
void ConfigureAllocatorForPayloads();

// A CPU tensor [num_positions, hidden_size] copied out of a validated payload.
absl::StatusOr<at::Tensor> UnpackHiddenStates(const v1::HiddenStates& states);

}  // namespace tophat
