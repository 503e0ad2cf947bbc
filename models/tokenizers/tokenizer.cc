#include "models/tokenizers/tokenizer.h"

#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/tokenizers/bpe_tokenizer.h"
#include "models/tokenizers/sentencepiece_tokenizer.h"
#include "models/tokenizers/tokenizer_utf8.h"
#include "nlohmann/json.hpp"

namespace tophat {
namespace {

// Reads `bos_token`/`eos_token` from tokenizer_config.json, each either a string or an
// object {"content": ...} (AddedToken serialised by transformers).
absl::StatusOr<BpeTokenizer::SpecialTokenNames> ReadSpecialTokenNames(
    const std::filesystem::path& config_path) {
  BpeTokenizer::SpecialTokenNames names;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(config_path, ec)) return names;
  std::ifstream in(config_path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  if (!in) {
    return absl::DataLossError(absl::StrCat("cannot read ", config_path.string()));
  }
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(contents.str());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path.string(), " is not valid JSON: ", e.what()));
  }
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path.string(), " is not an object"));
  }
  const auto read = [&](const char* key) -> std::optional<std::string> {
    const auto it = config.find(key);
    if (it == config.end()) return std::nullopt;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object()) {
      const auto content = it->find("content");
      if (content != it->end() && content->is_string()) return content->get<std::string>();
    }
    return std::nullopt;
  };
  names.bos = read("bos_token");
  names.eos = read("eos_token");
  return names;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::filesystem::path& dir) {
  const std::filesystem::path json_path = dir / "tokenizer.json";
  const std::filesystem::path model_path = dir / "tokenizer.model";
  std::error_code ec;
  const bool has_model = std::filesystem::is_regular_file(model_path, ec);
  if (std::filesystem::is_regular_file(json_path, ec)) {
    auto names = ReadSpecialTokenNames(dir / "tokenizer_config.json");
    if (!names.ok()) return names.status();
    auto bpe = BpeTokenizer::Load(json_path, *names);
    if (bpe.ok()) return std::unique_ptr<Tokenizer>(*std::move(bpe));
    // Llama-2 style checkpoints ship a Metaspace tokenizer.json beside tokenizer.model;
    // the latter is the original and what SentencePieceTokenizer reads.
    if (!(absl::IsUnimplemented(bpe.status()) && has_model)) return bpe.status();
  }
  if (has_model) {
    auto spm = SentencePieceTokenizer::Load(model_path);
    if (!spm.ok()) return spm.status();
    return std::unique_ptr<Tokenizer>(*std::move(spm));
  }
  return absl::NotFoundError(
      absl::StrCat("no tokenizer.json or tokenizer.model in ", dir.string()));
}

absl::StatusOr<std::string> StreamingDetokenizer::Push(int32_t id) {
  window_.push_back(id);
  auto text = tokenizer_.Decode(window_);
  if (!text.ok()) {
    window_.pop_back();
    return text.status();
  }
  // Text that later ids may still change stays back: a character cut between tokens shows as
  // a trailing incomplete sequence (raw bytes) or as trailing U+FFFD (lossy decoders).
  std::string_view stable = *text;
  stable.remove_suffix(utf8::IncompleteSuffixLength(stable));
  while (stable.ends_with(utf8::kReplacement)) stable.remove_suffix(utf8::kReplacement.size());
  std::string fresh;
  if (stable.size() > emitted_bytes_) {
    fresh = stable.substr(emitted_bytes_);
    emitted_bytes_ = stable.size();
  }
  if (stable.size() != text->size()) return fresh;
  // All of the window's text is final and shown: it ends on a whole character. Past the
  // window's size, drop the ids before the last such point; what is kept starts on a whole
  // character too, and its text is all shown (the first piece's leading space, which
  // SentencePiece drops, belongs to an id already shown).
  if (window_.size() > kWindowIds && last_whole_ > 0) {
    window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(last_whole_));
    auto kept = tokenizer_.Decode(window_);
    if (!kept.ok()) return kept.status();  // these ids decoded a moment ago
    emitted_bytes_ = kept->size();
  }
  last_whole_ = window_.size();
  return fresh;
}

absl::StatusOr<std::string> StreamingDetokenizer::Flush() {
  auto text = tokenizer_.Decode(window_);
  if (!text.ok()) return text.status();
  if (text->size() <= emitted_bytes_) return std::string();
  std::string rest = text->substr(emitted_bytes_);
  emitted_bytes_ = text->size();
  return rest;
}

std::string TokenText(const Tokenizer& tokenizer, std::optional<int32_t> previous, int32_t id) {
  if (std::optional<std::string> special = tokenizer.SpecialText(id)) return *std::move(special);
  absl::StatusOr<std::string> alone = tokenizer.Decode({id});
  if (!alone.ok()) return "";
  if (!previous) return *std::move(alone);
  const absl::StatusOr<std::string> before = tokenizer.Decode({*previous});
  absl::StatusOr<std::string> both = tokenizer.Decode({*previous, id});
  // The previous text must be whole: one that ends in U+FFFD may be a character this token
  // completes, and the pair's text then does not start with it.
  if (before.ok() && both.ok() && both->starts_with(*before) &&
      !before->ends_with(utf8::kReplacement)) {
    return both->substr(before->size());
  }
  return *std::move(alone);
}

}  // namespace tophat
