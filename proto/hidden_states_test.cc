#include "proto/hidden_states.h"

#include <catch2/catch.hpp>

namespace tophat {
namespace {

TEST_CASE("Hidden states round-trip through the wire format in every dtype") {
  for (at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    at::Tensor hidden = at::randn({5, 12}).to(dtype);
    v1::HiddenStates states;
    REQUIRE(PackHiddenStates(hidden, &states).ok());
    CHECK(states.num_positions() == 5);
    CHECK(states.hidden_size() == 12);
    auto wire = ToProtoDType(dtype);
    REQUIRE(wire.ok());
    CHECK(ValidateHiddenStates(states, *wire, 12, 16).ok());
    auto back = UnpackHiddenStates(states);
    REQUIRE(back.ok());
    CHECK(back->scalar_type() == dtype);
    CHECK(at::equal(*back, hidden));
  }
}

TEST_CASE("Validation names the offending field") {
  v1::HiddenStates states;
  REQUIRE(PackHiddenStates(at::zeros({4, 8}), &states).ok());
  const auto message = [&](v1::DType dtype, int64_t hidden, int64_t max_positions) {
    return std::string(ValidateHiddenStates(states, dtype, hidden, max_positions).message());
  };
  CHECK(message(v1::DTYPE_FLOAT16, 8, 16).find("states.dtype") != std::string::npos);
  CHECK(message(v1::DTYPE_FLOAT32, 9, 16).find("states.hidden_size") != std::string::npos);
  CHECK(message(v1::DTYPE_FLOAT32, 8, 3).find("states.num_positions") != std::string::npos);
  states.mutable_data()->pop_back();
  CHECK(message(v1::DTYPE_FLOAT32, 8, 16).find("states.data") != std::string::npos);
  CHECK_FALSE(UnpackHiddenStates(states).ok());
  states.set_dtype(v1::DTYPE_UNSPECIFIED);
  CHECK_FALSE(UnpackHiddenStates(states).ok());
}

}  // namespace
}  // namespace tophat
