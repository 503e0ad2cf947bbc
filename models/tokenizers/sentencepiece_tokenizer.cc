#include "models/tokenizers/sentencepiece_tokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "models/tokenizers/tokenizer_utf8.h"

namespace tophat {

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(
    const std::filesystem::path& model_path) {
  auto model = SpmModel::Load(model_path);  // Its errors name the file.
  if (!model.ok()) return model.status();
  return std::unique_ptr<SentencePieceTokenizer>(
      new SentencePieceTokenizer(*std::move(model), model_path.string()));
}

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<SpmModel> model,
                                               std::string source)
    : model_(std::move(model)), source_(std::move(source)) {
  vocab_size_ = model_->piece_size();
  const auto valid = [&](int id) -> std::optional<int32_t> {
    if (id < 0 || id >= vocab_size_) return std::nullopt;
    return id;
  };
  bos_id_ = valid(model_->bos_id());
  eos_id_ = valid(model_->eos_id());

  // "<unk>" is not a control piece but Hugging Face treats it as special all the same.
  for (int32_t id = 0; id < vocab_size_; ++id) {
    if (model_->IsControl(id)) {
      const std::string_view piece = model_->IdToPiece(id);
      if (!piece.empty()) special_pieces_.emplace_back(std::string(piece), id);
    }
  }
  if (const auto unk = model_->PieceToId("<unk>"); unk && !model_->IsControl(*unk)) {
    special_pieces_.emplace_back("<unk>", *unk);
  }
  std::stable_sort(special_pieces_.begin(), special_pieces_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

absl::Status SentencePieceTokenizer::EncodePlain(std::string_view text,
                                                 std::vector<int32_t>& ids) const {
  if (text.empty()) return absl::OkStatus();
  auto encoded = model_->Encode(text);
  if (!encoded.ok()) {
    return absl::Status(encoded.status().code(),
                        absl::StrCat(source_, ": ", encoded.status().message()));
  }
  ids.insert(ids.end(), encoded->begin(), encoded->end());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> SentencePieceTokenizer::Encode(std::string_view text,
                                                                    bool parse_special) const {
  if (!utf8::IsValid(text)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SentencePiece model ", source_, ": text to encode is not valid UTF-8"));
  }
  std::vector<int32_t> ids;
  if (!parse_special) {
    if (absl::Status status = EncodePlain(text, ids); !status.ok()) return status;
    return ids;
  }
  size_t plain_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const auto match =
        std::find_if(special_pieces_.begin(), special_pieces_.end(),
                     [&](const auto& piece) { return text.substr(pos).starts_with(piece.first); });
    if (match == special_pieces_.end()) {
      ++pos;
      continue;
    }
    if (absl::Status status = EncodePlain(text.substr(plain_start, pos - plain_start), ids);
        !status.ok()) {
      return status;
    }
    ids.push_back(match->second);
    pos += match->first.size();
    plain_start = pos;
  }
  if (absl::Status status = EncodePlain(text.substr(plain_start), ids); !status.ok()) {
    return status;
  }
  return ids;
}

absl::StatusOr<std::string> SentencePieceTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::vector<int> plain;
  plain.reserve(ids.size());
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) {
      return absl::InvalidArgumentError(absl::StrCat("SentencePiece model ", source_, ": token id ",
                                                     id, " is outside [0, ", vocab_size_, ")"));
    }
    plain.push_back(id);
  }
  // SentencePieceProcessor renders control pieces as nothing, <unk> as " ⁇ " and each invalid
  // byte of byte-fallback pieces as U+FFFD.
  auto text = model_->Decode(plain);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("SentencePiece model ", source_, ": ", text.status().message()));
  }
  return *std::move(text);
}

int32_t SentencePieceTokenizer::vocab_size() const { return vocab_size_; }

std::optional<int32_t> SentencePieceTokenizer::bos_id() const { return bos_id_; }
std::optional<int32_t> SentencePieceTokenizer::eos_id() const { return eos_id_; }

std::optional<std::string> SentencePieceTokenizer::SpecialText(int32_t id) const {
  if (!model_->IsControl(id)) return std::nullopt;
  return std::string(model_->IdToPiece(id));
}

std::optional<std::string> SentencePieceTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size_ || model_->IsControl(id)) return std::nullopt;
  const std::string_view piece = model_->IdToPiece(id);
  // <unk> decodes to " ⁇ ", which no text the model read contained.
  if (piece == "<unk>") return std::nullopt;
  // A byte-fallback piece, "<0x0A>": that one byte.
  if (piece.size() == 6 && piece.starts_with("<0x") && piece.ends_with(">")) {
    int value = 0;
    bool hex = true;
    for (const char c : piece.substr(3, 2)) {
      const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      hex = hex && digit >= 0;
      value = value * 16 + digit;
    }
    if (hex) return std::string(1, static_cast<char>(value));
  }
  // "▁" (U+2581) stands for a space.
  constexpr std::string_view kSpace = "\xE2\x96\x81";
  std::string bytes;
  for (size_t at = 0; at < piece.size();) {
    if (piece.substr(at).starts_with(kSpace)) {
      bytes += ' ';
      at += kSpace.size();
    } else {
      bytes += piece[at++];
    }
  }
  return bytes;
}

std::optional<int32_t> SentencePieceTokenizer::PieceToId(std::string_view piece) const {
  const auto id = model_->PieceToId(piece);
  if (!id) return std::nullopt;
  return *id;
}

}  // namespace tophat
