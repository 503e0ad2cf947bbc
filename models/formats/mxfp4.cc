#include "models/formats/mxfp4.h"

#include <ATen/Parallel.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "models/formats/safetensors.h"

namespace tophat {

namespace {

constexpr std::array<float, 16> kE2m1 = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace

absl::StatusOr<at::Tensor> DequantizeMxfp4(const at::Tensor& blocks, const at::Tensor& scales,
                                           at::ScalarType dtype, const std::string& where) {
  if (blocks.scalar_type() != at::kByte || scales.scalar_type() != at::kByte) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": MXFP4 blocks and scales must be U8, got ", c10::toString(blocks.scalar_type()),
        " and ", c10::toString(scales.scalar_type())));
  }
  if (blocks.dim() < 2 || blocks.size(-1) != 16 || scales.dim() != blocks.dim() - 1 ||
      scales.sizes() != blocks.sizes().slice(0, blocks.dim() - 1)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": MXFP4 blocks ", ShapeString(blocks.sizes()),
                                                   " and scales ", ShapeString(scales.sizes()),
                                                   " do not match ([..., G, 16] and [..., G])"));
  }
  const at::Tensor b = blocks.contiguous();
  const at::Tensor s = scales.contiguous();
  const int64_t groups = s.numel();
  std::vector<int64_t> shape(blocks.sizes().begin(), blocks.sizes().end() - 1);
  shape.back() *= 32;
  at::Tensor out = at::empty(shape, at::kFloat);
  const uint8_t* bp = b.data_ptr<uint8_t>();
  const uint8_t* sp = s.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  // A 20B gpt-oss holds 19 billion expert values: blocks in parallel, each through its own
  // table of the 16 codes' values.
  at::parallel_for(0, groups, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      // 2^(s - 127) as transformers' ldexp computes it (0 and 255 included, as it reads them).
      const int exponent = static_cast<int>(sp[g]) - 127;
      std::array<float, 16> table;
      for (int c = 0; c < 16; ++c) table[c] = std::ldexp(kE2m1[c], exponent);
      const uint8_t* packed = bp + g * 16;
      float* values = op + g * 32;
      for (int i = 0; i < 16; ++i) {
        values[2 * i] = table[packed[i] & 0x0F];
        values[2 * i + 1] = table[packed[i] >> 4];
      }
    }
  });
  return dtype == at::kFloat ? out : out.to(dtype);
}

}  // namespace tophat
