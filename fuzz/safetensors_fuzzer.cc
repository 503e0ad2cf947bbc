// A checkpoint's .safetensors file, opened as tophat split and the daemons open one: the
// whole header validated up front (length, JSON, dtypes, shapes, offsets), then every
// tensor it admitted read.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "models/formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = tophat::fuzz::WriteInput("model.safetensors", data, size);
  auto file = tophat::SafetensorsFile::Open(path);
  if (!file.ok()) return 0;
  for (const auto& [name, info] : (*file)->tensors()) {
    TOPHAT_FUZZ_CHECK(info.data_begin <= info.data_end);
    TOPHAT_FUZZ_CHECK(info.data_end <= size);
    auto tensor = (*file)->Tensor(name);
    if (!tensor.ok()) continue;  // a dtype it lists but does not load (e.g. I64)
    int64_t elements = 1;
    for (int64_t d : info.shape) elements *= d;
    TOPHAT_FUZZ_CHECK(tensor->numel() == elements);
    if (elements > 0) (void)tensor->sum().item<double>();  // touches every element
  }
  return 0;
}
