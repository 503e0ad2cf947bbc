// A checkpoint's config.json, read as every tophat program reads one.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "models/formats/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = tophat::fuzz::WriteInput("config.json", data, size);
  auto config = tophat::ModelConfig::Load(path);
  if (!config.ok()) return 0;
  // What it accepted is a usable shape, and reads back to itself.
  TOPHAT_FUZZ_CHECK(config->hidden_size > 0 && config->num_hidden_layers > 0);
  TOPHAT_FUZZ_CHECK(config->head_dim > 0 && config->num_key_value_heads > 0);
  auto again = tophat::ModelConfig::FromJson(config->ToJson(), "round trip");
  TOPHAT_FUZZ_CHECK(again.ok());
  TOPHAT_FUZZ_CHECK(again->hidden_size == config->hidden_size);
  return 0;
}
