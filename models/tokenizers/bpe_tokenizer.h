// Hugging Face `tokenizer.json` byte-level BPE (GPT-2, Llama-3, Qwen2).
//
// Supported pipeline: normalizer null or NFC (NFC is applied as the identity, which is exact
// for ASCII and for text that is already NFC, i.e. nearly all real input); pre_tokenizer
// ByteLevel, or a Sequence of Split steps followed by ByteLevel; model BPE; decoder ByteLevel.
// The post_processor is ignored because Encode never adds BOS/EOS. Files using another
// pipeline (e.g. the Metaspace BPE of Llama-2's tokenizer.json) fail with kUnimplemented, so
// Tokenizer::Load can fall back to tokenizer.model; malformed files fail with
// kInvalidArgument naming the file and the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/tokenizers/tokenizer.h"

namespace tophat {

class BpeTokenizer : public Tokenizer {
 public:
  // Spellings of the BOS/EOS tokens (e.g. from tokenizer_config.json) that take precedence
  // over the names BpeTokenizer recognises among the added tokens.
  struct SpecialTokenNames {
    std::optional<std::string> bos;
    std::optional<std::string> eos;
  };

  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Load(const std::filesystem::path& json_path,
                                                            const SpecialTokenNames& names = {});
  // As Load, from the file's contents; `source` names it in errors.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromJson(
      std::string_view json_text, std::string_view source, const SpecialTokenNames& names = {});
  ~BpeTokenizer() override;

  // Fails with kInvalidArgument when `text` is not valid UTF-8.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool parse_special = false) const override;
  // Ill-formed UTF-8 (e.g. a character cut between tokens) becomes U+FFFD.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override;

  int32_t vocab_size() const override;
  std::optional<int32_t> bos_id() const override;
  std::optional<int32_t> eos_id() const override;
  std::optional<int32_t> PieceToId(std::string_view piece) const override;
  std::optional<std::string> SpecialText(int32_t id) const override;
  std::optional<std::string> TokenBytes(int32_t id) const override;

 private:
  struct Model;

  explicit BpeTokenizer(std::unique_ptr<const Model> model);
  absl::Status EncodeText(std::string_view text, std::vector<int32_t>& ids) const;
  absl::Status EncodeWord(std::string_view word, std::vector<int32_t>& ids) const;

  std::unique_ptr<const Model> model_;

  // BPE results per pre-token. Encode is const and called from several threads.
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// The tokenizer.json of a byte-level BPE tokenizer for random benchmark checkpoints, which
// have no tokenizer of their own but must be served: ids 0-255 are the bytes, every other id
// below `vocab_size` a placeholder piece "<id>" (reached by no merge, so text encodes to
// bytes and any id decodes), and `bos` / `eos` special tokens with those ids (each in
// [256, vocab_size)).
std::string PlaceholderByteLevelTokenizerJson(int32_t vocab_size, int32_t bos, int32_t eos);

}  // namespace tophat
