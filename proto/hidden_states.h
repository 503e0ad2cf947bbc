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
// The tensor dtype a payload unpacks to: its own, float32 for int8 (dequantized).
absl::StatusOr<at::ScalarType> FromProtoDType(v1::DType dtype);
// Bytes of one element in `data`; 0 for DTYPE_UNSPECIFIED or an unknown value.
int64_t ElementBytes(v1::DType dtype);
// Bytes one position of `hidden_size` takes on the wire: data plus int8's scale.
int64_t WireBytesPerPosition(v1::DType dtype, int64_t hidden_size);
// "float32", "float16", "bfloat16", "int8" (configs and reports use these names).
absl::StatusOr<v1::DType> ParseWireDtypeName(const std::string& name);
std::string WireDtypeName(v1::DType dtype);

// Copies a [T, D] tensor (any device) into `out` in its own dtype, reusing out's buffer
// capacity.
absl::Status PackHiddenStates(const at::Tensor& hidden, v1::HiddenStates* out);
// Same, converted to `wire` (float32, float16, bfloat16 or int8 per position). Fails for an
// int8 wire if a position holds a non-finite value, which no scale can carry, and for a
// float16 wire if one lies beyond float16's range; the caller sends such rows in its own
// dtype instead (every end accepts any wire dtype).
absl::Status PackHiddenStates(const at::Tensor& hidden, v1::DType wire, v1::HiddenStates* out);
// `rows` x `cols` contiguous elements of `src_type` at `src`, encoded as `wire` into `out`
// without temporaries beyond out's own buffers.
absl::Status EncodeHiddenStates(const void* src, at::ScalarType src_type, int64_t rows,
                                int64_t cols, v1::DType wire, v1::HiddenStates* out);

// Checks a received payload against what this end expects, naming the offending field:
// dtype (DTYPE_UNSPECIFIED: any wire dtype), hidden_size, num_positions against
// max_positions, the byte length, and int8's scales (count, finite, >= 0).
absl::Status ValidateHiddenStates(const v1::HiddenStates& states, v1::DType expected_dtype,
                                  int64_t expected_hidden_size, int64_t max_positions);

// Keeps hidden-state-sized buffers (hundreds of KiB to MiB) on the heap instead of fresh
// mmap()s: glibc's default threshold makes every such payload an mmap + page faults + munmap,
// which costs ~30% of loopback transfer throughput; and holds malloc to two arenas, so that
// payloads freed on another thread than made them do not pile up per thread. Call once at
// process start.
void ConfigureAllocatorForPayloads();

// A CPU tensor [num_positions, hidden_size] copied out of a validated payload, in the
// payload's own dtype (FromProtoDType) or converted to `dtype`.
absl::StatusOr<at::Tensor> UnpackHiddenStates(const v1::HiddenStates& states);
absl::StatusOr<at::Tensor> UnpackHiddenStates(const v1::HiddenStates& states,
                                              at::ScalarType dtype);
// Decodes a validated payload into num_positions x hidden_size contiguous elements of
// `dst_type` (float32, float16 or bfloat16) at `dst`.
void DecodeHiddenStates(const v1::HiddenStates& states, at::ScalarType dst_type, void* dst);

}  // namespace tophat
