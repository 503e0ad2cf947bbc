#include "models/formats/mxfp4.h"

#include <catch2/catch.hpp>
#include <string>

namespace tophat {
namespace {

TEST_CASE("MXFP4 values unpack low nibble first, each block scaled by 2^(s - 127)", "[mxfp4]") {
  // Two rows of one block each. Row 0: byte i holds codes (i, 15 - i), scale 2^0; row 1: all
  // bytes 0x97 (codes 7 = +6 and 9 = -0.5), scale 2^-3.
  at::Tensor blocks = at::empty({2, 1, 16}, at::kByte);
  for (int i = 0; i < 16; ++i) {
    blocks[0][0][i] = static_cast<uint8_t>(i | ((15 - i) << 4));
    blocks[1][0][i] = static_cast<uint8_t>(0x97);
  }
  at::Tensor scales = at::tensor({127, 124}, at::kByte).view({2, 1});
  auto values = DequantizeMxfp4(blocks, scales, at::kFloat, "test");
  REQUIRE(values.ok());
  REQUIRE(values->sizes() == at::IntArrayRef({2, 32}));
  const float e2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int i = 0; i < 16; ++i) {
    CHECK((*values)[0][2 * i].item<float>() == e2m1[i]);
    CHECK((*values)[0][2 * i + 1].item<float>() == e2m1[15 - i]);
    CHECK((*values)[1][2 * i].item<float>() == 6.0f / 8);
    CHECK((*values)[1][2 * i + 1].item<float>() == -0.5f / 8);
  }
  // bfloat16 holds them exactly.
  auto bf16 = DequantizeMxfp4(blocks, scales, at::kBFloat16, "test");
  REQUIRE(bf16.ok());
  CHECK(bf16->to(at::kFloat).equal(*values));
}

TEST_CASE("MXFP4 blocks and scales that do not match are refused, naming the tensors", "[mxfp4]") {
  const at::Tensor blocks = at::zeros({4, 2, 16}, at::kByte);
  auto wrong_scales = DequantizeMxfp4(blocks, at::zeros({4, 3}, at::kByte), at::kFloat, "w");
  REQUIRE_FALSE(wrong_scales.ok());
  CHECK(std::string(wrong_scales.status().message()) ==
        "w: MXFP4 blocks [4, 2, 16] and scales [4, 3] do not match ([..., G, 16] and [..., G])");
  auto wrong_dtype =
      DequantizeMxfp4(blocks.to(at::kChar), at::zeros({4, 2}, at::kByte), at::kFloat, "w");
  REQUIRE_FALSE(wrong_dtype.ok());
  CHECK(std::string(wrong_dtype.status().message()).find("must be U8") != std::string::npos);
}

}  // namespace
}  // namespace tophat
