#include "proto/hidden_states.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <limits>

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

TEST_CASE("A dtype with no element size is refused even where it is the one expected") {
  // Found by fuzz/hidden_states_fuzzer (fuzz/regressions/hidden_states/): with no dtype and
  // no data, 0 bytes matched 2 x 64 x 0 and validation passed what unpacking then refused.
  v1::HiddenStates states;
  states.set_num_positions(2);
  states.set_hidden_size(64);
  const absl::Status status = ValidateHiddenStates(states, v1::DTYPE_UNSPECIFIED, 64, 16);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("not a hidden-state dtype") != std::string::npos);
}

TEST_CASE("A dtype this build does not know is named by its number") {
  v1::HiddenStates states;
  states.set_dtype(static_cast<v1::DType>(77));
  states.set_num_positions(1);
  states.set_hidden_size(4);
  const absl::Status status = ValidateHiddenStates(states, v1::DTYPE_FLOAT32, 4, 16);
  CHECK(std::string(status.message()) ==
        "states.dtype (unknown value 77) is not a hidden-state dtype");
}

TEST_CASE("Hidden states convert to every wire dtype and back within its precision") {
  // Rows of very different magnitudes: int8's scale is per position, so a small row keeps
  // its precision next to a large one.
  at::Tensor hidden = at::randn({6, 40});
  hidden[1] *= 1000;
  hidden[2] *= 1e-3;
  hidden[3].zero_();
  for (at::ScalarType source : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const at::Tensor input = hidden.to(source);
    for (v1::DType wire : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16,
                           v1::DTYPE_INT8_PER_POSITION}) {
      INFO(c10::toString(source) << " as " << WireDtypeName(wire));
      v1::HiddenStates states;
      REQUIRE(PackHiddenStates(input, wire, &states).ok());
      CHECK(states.dtype() == wire);
      CHECK(static_cast<int64_t>(states.data().size() + states.scales().size()) ==
            6 * WireBytesPerPosition(wire, 40));
      REQUIRE(ValidateHiddenStates(states, wire, 40, 6).ok());
      REQUIRE(ValidateHiddenStates(states, v1::DTYPE_UNSPECIFIED, 40, 6).ok());
      auto back = UnpackHiddenStates(states, at::kFloat);
      REQUIRE(back.ok());
      const at::Tensor reference = input.to(at::kFloat);
      // Per position: the wire's relative step times the position's largest magnitude.
      const double step = wire == v1::DTYPE_FLOAT32    ? 0
                          : wire == v1::DTYPE_FLOAT16  ? 1.0 / 1024
                          : wire == v1::DTYPE_BFLOAT16 ? 1.0 / 128
                                                       : 1.0 / 127;
      for (int64_t row = 0; row < 6; ++row) {
        const double largest = reference[row].abs().max().item<double>();
        const double error = (*back)[row].sub(reference[row]).abs().max().item<double>();
        CHECK(error <= step * largest * (0.5 + 1e-5) + 1e-30);  // + float rounding
      }
      CHECK((*back)[3].abs().max().item<float>() == 0);
    }
  }
}

TEST_CASE("An int8 wire refuses non-finite hidden states and malformed scales") {
  at::Tensor hidden = at::randn({3, 8});
  hidden[1][2] = std::numeric_limits<float>::infinity();
  v1::HiddenStates states;
  const absl::Status refused = PackHiddenStates(hidden, v1::DTYPE_INT8_PER_POSITION, &states);
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(refused.message()).find("position 1") != std::string::npos);
  // A NaN too, wherever it sits in its row (a running std::max steps over it).
  for (int64_t column : {0, 2, 7}) {
    hidden = at::randn({3, 8});
    hidden[1][column] = std::numeric_limits<float>::quiet_NaN();
    CHECK(PackHiddenStates(hidden, v1::DTYPE_INT8_PER_POSITION, &states).code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(PackHiddenStates(hidden, v1::DTYPE_FLOAT16, &states).code() ==
          absl::StatusCode::kOutOfRange);
  }

  REQUIRE(PackHiddenStates(at::randn({3, 8}), v1::DTYPE_INT8_PER_POSITION, &states).ok());
  const auto message = [&] {
    return std::string(ValidateHiddenStates(states, v1::DTYPE_INT8_PER_POSITION, 8, 16).message());
  };
  CHECK(message().empty());
  const std::string good = states.scales();
  states.mutable_scales()->pop_back();
  CHECK(message().find("states.scales holds 11 bytes") != std::string::npos);
  CHECK_FALSE(UnpackHiddenStates(states).ok());
  *states.mutable_scales() = good;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(states.mutable_scales()->data() + 4, &nan, sizeof(nan));
  CHECK(message().find("states.scales[1]") != std::string::npos);
  const float negative = -1;
  std::memcpy(states.mutable_scales()->data() + 4, &negative, sizeof(negative));
  CHECK(message().find("states.scales[1]") != std::string::npos);

  // A float payload carries no scales.
  REQUIRE(PackHiddenStates(at::randn({3, 8}), &states).ok());
  states.set_scales("abcd");
  CHECK(std::string(ValidateHiddenStates(states, v1::DTYPE_FLOAT32, 8, 16).message())
            .find("states.scales") != std::string::npos);
}

TEST_CASE("A float16 wire refuses values beyond its range, which bfloat16 and int8 carry") {
  at::Tensor hidden = at::randn({3, 8});
  hidden[2][5] = 70000.0f;
  v1::HiddenStates states;
  const absl::Status refused = PackHiddenStates(hidden, v1::DTYPE_FLOAT16, &states);
  CHECK(refused.code() == absl::StatusCode::kOutOfRange);
  CHECK(std::string(refused.message()).find("position 2") != std::string::npos);
  CHECK(PackHiddenStates(hidden.to(at::kBFloat16), v1::DTYPE_FLOAT16, &states).code() ==
        absl::StatusCode::kOutOfRange);
  hidden[2][5] = 65504.0f;  // float16's largest finite value passes
  CHECK(PackHiddenStates(hidden, v1::DTYPE_FLOAT16, &states).ok());
  hidden[2][5] = 70000.0f;
  for (v1::DType wire : {v1::DTYPE_BFLOAT16, v1::DTYPE_INT8_PER_POSITION}) {
    REQUIRE(PackHiddenStates(hidden, wire, &states).ok());
    auto back = UnpackHiddenStates(states, at::kFloat);
    REQUIRE(back.ok());
    CHECK(std::abs((*back)[2][5].item<float>() - 70000.0f) < 70000.0f / 100);
  }
}

TEST_CASE("Wire dtype names parse and print") {
  for (const char* name : {"float32", "float16", "bfloat16", "int8"}) {
    auto dtype = ParseWireDtypeName(name);
    REQUIRE(dtype.ok());
    CHECK(WireDtypeName(*dtype) == name);
  }
  CHECK(std::string(ParseWireDtypeName("fp8").status().message()).find("\"fp8\"") !=
        std::string::npos);
  CHECK(WireBytesPerPosition(v1::DTYPE_INT8_PER_POSITION, 768) == 772);
  CHECK(WireBytesPerPosition(v1::DTYPE_FLOAT16, 768) == 1536);
}

}  // namespace
}  // namespace tophat
