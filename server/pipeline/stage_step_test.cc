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
  std::vector<int64_t> encoded;
  EncodeAddresses(chunks, encoded);
  auto back = DecodeAddresses(encoded, 5, /*num_blocks=*/8, /*block_size=*/16);
  REQUIRE(back.ok());
  REQUIRE(back->size() == 2);
  CHECK((*back)[0].past == 17);
  CHECK((*back)[0].blocks == a);
  CHECK((*back)[1].num_tokens == 4);

  CHECK_FALSE(DecodeAddresses(encoded, 6, 8, 16).ok());  // token count disagrees
  CHECK_FALSE(DecodeAddresses(encoded, 5, 4, 16).ok());  // id 4 outside a pool of 4
  CHECK_FALSE(DecodeAddresses(encoded, 5, 8, 8).ok());   // 2 blocks of 8 cannot hold 18
  encoded.pop_back();
  CHECK_FALSE(DecodeAddresses(encoded, 5, 8, 16).ok());  // cut short
}

}  // namespace
}  // namespace tophat::pipeline
