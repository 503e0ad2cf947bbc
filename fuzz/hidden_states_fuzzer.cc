// Hidden-state payloads as the cloud and the agent receive them: any bytes parsed as a
// HiddenStates message, validated against what this end expects, and unpacked when valid.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "proto/hidden_states.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // The first byte chooses what this end expects, so that every dtype's path is reached
  // (0: any wire dtype, as the cloud accepts; 5: one this build does not know).
  const auto expected = static_cast<tophat::v1::DType>(data[0] % 6);
  tophat::v1::HiddenStates states;
  if (!states.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  const int64_t hidden = 64;
  const int64_t max_positions = 256;
  if (!tophat::ValidateHiddenStates(states, expected, hidden, max_positions).ok()) return 0;
  auto unpacked = tophat::UnpackHiddenStates(states);
  TOPHAT_FUZZ_CHECK(unpacked.ok());
  TOPHAT_FUZZ_CHECK(unpacked->dim() == 2);
  TOPHAT_FUZZ_CHECK(unpacked->size(0) == states.num_positions());
  TOPHAT_FUZZ_CHECK(unpacked->size(1) == hidden);
  TOPHAT_FUZZ_CHECK(unpacked->size(0) <= max_positions);
  // Validated scales keep every dequantized int8 value finite.
  if (states.dtype() == tophat::v1::DTYPE_INT8_PER_POSITION) {
    TOPHAT_FUZZ_CHECK(unpacked->isfinite().all().item<bool>());
  }
  return 0;
}
