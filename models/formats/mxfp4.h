// MXFP4 (the OCP microscaling format with 4-bit floats), as gpt-oss's checkpoints store their
// experts: a matrix's rows in blocks of 32 values, each value an e2m1 float (one sign bit,
// two exponent bits, one mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives) packed
// two to a byte, low nibble first, and each block scaled by a power of two whose exponent is
// stored biased by 127 (e8m0).
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "absl/status/statusor.h"

namespace tophat {

// blocks: [..., G, 16] uint8; scales: [..., G] uint8 (the same leading shape). Returns
// [..., G * 32] in `dtype` (every MXFP4 value is exact in float32 and bfloat16, scales
// permitting). `where` names the tensors in errors (a mismatched shape, a wrong dtype).
absl::StatusOr<at::Tensor> DequantizeMxfp4(const at::Tensor& blocks, const at::Tensor& scales,
                                           at::ScalarType dtype, const std::string& where);

}  // namespace tophat
