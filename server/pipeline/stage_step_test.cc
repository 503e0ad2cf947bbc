#include "server/pipeline/stage_step.h"

#include <catch2/catch.hpp>

namespace tophat::pipeline {
namespace {

TEST_CASE("Step headers and chunk addresses round-trip and are checked", "[pipeline]") {
  const StepHeader header{.op = StageOp::kForward, .step = 7, .total_tokens = 5,
                          .address_length = 11};
  auto decoded = DecodeHeader(EncodeHeader(header));
  REQUIRE(decoded.ok());
  CHECK(decoded->step == 7);
  CHECK(decoded->total_tokens == 5);
  CHECK(decoded->address_length == 11);
  at::Tensor bad = EncodeHeader(header);
  bad.data_ptr<int64_t>()[0] = 9;
  CHECK_FALSE(DecodeHeader(bad).ok());

  const std::vector<int32_t> a = {4, 1};
  const std::vector<int32_t> b = {0};
  const ChunkAddress chunks[] = {{.past = 17, .num_tokens = 1, .blocks = a},
                                 {.past = 0, .num_tokens = 4, .blocks = b}};
  const BlockCopy copies[] = {{.from = 3, .to = 6}, {.from = 2, .to = 7}};
  std::vector<int64_t> encoded;
  EncodeAddresses(chunks, copies, encoded);
  auto back = DecodeAddresses(encoded, 5, /*num_blocks=*/8, /*block_size=*/16);
  REQUIRE(back.ok());
  REQUIRE(back->chunks.size() == 2);
  CHECK(back->chunks[0].past == 17);
  CHECK(back->chunks[0].blocks == a);
  CHECK(back->chunks[1].num_tokens == 4);
  CHECK(back->copy_from == std::vector<int32_t>{3, 2});
  CHECK(back->copy_to == std::vector<int32_t>{6, 7});

  CHECK_FALSE(DecodeAddresses(encoded, 6, 8, 16).ok());  // token count disagrees
  CHECK_FALSE(DecodeAddresses(encoded, 5, 7, 16).ok());  // copy to 7 outside a pool of 7
  CHECK_FALSE(DecodeAddresses(encoded, 5, 4, 16).ok());  // id 4 outside a pool of 4
  CHECK_FALSE(DecodeAddresses(encoded, 5, 8, 8).ok());   // 2 blocks of 8 cannot hold 18
  encoded.pop_back();
  CHECK_FALSE(DecodeAddresses(encoded, 5, 8, 16).ok());  // cut short
  encoded.push_back(7);
  encoded.push_back(0);
  CHECK_FALSE(DecodeAddresses(encoded, 5, 8, 16).ok());  // trailing values

  // No copies: the count alone.
  EncodeAddresses(chunks, {}, encoded);
  auto plain = DecodeAddresses(encoded, 5, 8, 16);
  REQUIRE(plain.ok());
  CHECK(plain->copy_from.empty());
}

}  // namespace
}  // namespace tophat::pipeline
