// SentencePiece `tokenizer.model` (Llama-2, Vicuna), handled by libsentencepiece itself through
// the dlopen()ed plugin (see models/tokenizers/spm_plugin_loader.h and models/tokenizers/spm_plugin_api.h for why it
// cannot be linked directly). Encode and Decode are SentencePieceProcessor's; this class adds
// Hugging Face style parsing of literally written special pieces and the Tokenizer interface.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/tokenizers/spm_plugin_loader.h"
#include "models/tokenizers/tokenizer.h"

namespace tophat {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Errors name `model_path`. Fails with kUnavailable where the plugin cannot be loaded at
  // all (sanitizer builds) and kNotFound where it is missing.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(
      const std::filesystem::path& model_path);

  // With `parse_special`, control pieces and "<unk>" written literally (e.g. "<s>") become
  // their ids and the text between them is encoded part by part, each part getting the dummy
  // prefix space, as Hugging Face's slow Llama tokenizer does. Fails with kInvalidArgument
  // when `text` is not valid UTF-8.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool parse_special = false) const override;
  // Control tokens (<s>, </s>) decode to nothing; ids outside the vocabulary fail with
  // kInvalidArgument.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override;

  int32_t vocab_size() const override;
  std::optional<int32_t> bos_id() const override;
  std::optional<int32_t> eos_id() const override;
  std::optional<int32_t> PieceToId(std::string_view piece) const override;
  std::optional<std::string> SpecialText(int32_t id) const override;
  std::optional<std::string> TokenBytes(int32_t id) const override;

 private:
  SentencePieceTokenizer(std::unique_ptr<SpmModel> model, std::string source);
  absl::Status EncodePlain(std::string_view text, std::vector<int32_t>& ids) const;

  std::unique_ptr<SpmModel> model_;
  std::string source_;
  int32_t vocab_size_ = 0;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  // Pieces that parse_special recognises, longest first.
  std::vector<std::pair<std::string, int32_t>> special_pieces_;
};

}  // namespace tophat
