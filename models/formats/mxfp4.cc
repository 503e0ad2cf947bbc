#include "models/formats/mxfp4.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gemv_mxfp4.h"
#include "models/formats/safetensors.h"

namespace tophat {

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
  std::vector<int64_t> shape(blocks.sizes().begin(), blocks.sizes().end() - 1);
  shape.back() *= 32;
  at::Tensor out = at::empty(shape, at::kFloat);
  kernels::DequantizeMxfp4Blocks(b.data_ptr<uint8_t>(), s.data_ptr<uint8_t>(), s.numel(),
                                 out.data_ptr<float>());
  return dtype == at::kFloat ? out : out.to(dtype);
}

}  // namespace tophat
