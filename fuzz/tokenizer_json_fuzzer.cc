// A checkpoint's tokenizer.json (Hugging Face BPE), loaded, then used on a short text and
// its own output: what loads must encode and decode without crashing.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "models/tokenizers/bpe_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto tokenizer = tophat::BpeTokenizer::FromJson(text, "fuzz/tokenizer.json");
  if (!tokenizer.ok()) return 0;
  auto ids = (*tokenizer)->Encode("Hello, world! 12345 <|eot_id|> \xc3\xa9t\xc3\xa9\n\n  x");
  if (!ids.ok()) return 0;
  for (int32_t id : *ids) {
    TOPHAT_FUZZ_CHECK(id >= 0 && id < (*tokenizer)->vocab_size());
  }
  (void)(*tokenizer)->Decode(*ids);
  return 0;
}
