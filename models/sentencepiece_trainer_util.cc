#include "models/sentencepiece_trainer_util.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/sentencepiece_model_proto.h"
#include "models/tokenizer_utf8.h"

namespace tophat {
namespace {

using Proto = SentencePieceModelProto;

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581
constexpr int kMaxPieceChars = 16;
constexpr int kReservedPieces = 3 + 256;  // <unk>, <s>, </s> and the byte pieces.

// What the identity normaliser of the trained model makes of a sentence.
std::string Normalize(std::string_view sentence) {
  if (sentence.empty()) return "";
  std::string out(kSpaceSymbol);
  for (const char c : sentence) {
    if (c == ' ') {
      out.append(kSpaceSymbol);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// Splits a normalized sentence where SentencePiece's whitespace splitting would: before
// each space symbol that starts a word. In a run of spaces the last one starts the next
// word and the others stay together, so whitespace-only pieces can form (as Llama-2 has).
std::vector<std::string_view> SplitWords(std::string_view text) {
  std::vector<size_t> starts;  // Character starts.
  for (size_t pos = 0; pos < text.size();) {
    size_t length = 0;
    utf8::DecodeAt(text, pos, &length);
    starts.push_back(pos);
    pos += length;
  }
  const auto is_space = [&](size_t i) {
    return i < starts.size() && text.substr(starts[i]).starts_with(kSpaceSymbol);
  };
  std::vector<std::string_view> words;
  size_t word_start = 0;
  for (size_t i = 1; i < starts.size(); ++i) {
    if (is_space(i) && (!is_space(i - 1) || !is_space(i + 1))) {
      words.push_back(text.substr(word_start, starts[i] - word_start));
      word_start = starts[i];
    }
  }
  if (word_start < text.size()) words.push_back(text.substr(word_start));
  return words;
}

bool IsAsciiDigit(std::string_view s) { return s.size() == 1 && s[0] >= '0' && s[0] <= '9'; }

// Byte-pair merging over word types with incremental pair counts, so each merge touches only
// the words containing the merged pair.
class BpeTrainer {
 public:
  explicit BpeTrainer(const std::map<std::string, int64_t>& word_counts) {
    for (const auto& [word, count] : word_counts) {
      Word w{{}, count};
      for (size_t pos = 0; pos < word.size();) {
        size_t length = 0;
        utf8::DecodeAt(word, pos, &length);
        w.symbols.push_back(Intern(word.substr(pos, length), 1));
        pos += length;
      }
      words_.push_back(std::move(w));
    }
    for (size_t w = 0; w < words_.size(); ++w) AddPairs(w);
    for (const auto& [key, count] : pair_counts_) Push(key);
  }

  // Merges the most frequent pair (ties to the smallest spelling) and returns the new
  // piece, or nullopt when no pair is left.
  std::optional<std::string> MergeBest() {
    while (!heap_.empty()) {
      const Candidate top = heap_.top();
      heap_.pop();
      const auto it = pair_counts_.find(top.key);
      if (it == pair_counts_.end() || it->second != top.count || top.count <= 0) continue;
      Merge(top.key);
      return symbols_[Left(top.key)].text + symbols_[Right(top.key)].text;
    }
    return std::nullopt;
  }

 private:
  struct Symbol {
    std::string text;
    int chars;
  };
  struct Word {
    std::vector<int32_t> symbols;
    int64_t count;
  };
  struct Candidate {
    int64_t count;
    uint64_t key;
  };
  struct CandidateOrder {
    const BpeTrainer* trainer;
    // True when `a` ranks below `b`: fewer occurrences, or as many and a later spelling.
    bool operator()(const Candidate& a, const Candidate& b) const {
      if (a.count != b.count) return a.count < b.count;
      const auto& s = trainer->symbols_;
      const auto spelling = [&](uint64_t key) {
        return std::make_pair(std::string_view(s[Left(key)].text),
                              std::string_view(s[Right(key)].text));
      };
      return spelling(a.key) > spelling(b.key);
    }
  };

  static uint64_t Key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
  }
  static int32_t Left(uint64_t key) { return static_cast<int32_t>(key >> 32); }
  static int32_t Right(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFF); }

  int32_t Intern(std::string_view text, int chars) {
    const auto [it, inserted] = symbol_ids_.emplace(std::string(text), symbols_.size());
    if (inserted) symbols_.push_back({std::string(text), chars});
    return it->second;
  }

  bool Mergeable(int32_t left, int32_t right) const {
    return !IsAsciiDigit(symbols_[left].text) && !IsAsciiDigit(symbols_[right].text) &&
           symbols_[left].chars + symbols_[right].chars <= kMaxPieceChars;
  }

  // Adds (sign +1) or removes (-1) the pairs of word `w` to the counts, noting changed keys.
  void CountPairs(size_t w, int sign) {
    const Word& word = words_[w];
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
      if (!Mergeable(word.symbols[i], word.symbols[i + 1])) continue;
      const uint64_t key = Key(word.symbols[i], word.symbols[i + 1]);
      pair_counts_[key] += sign * word.count;
      if (sign > 0) pair_words_[key].push_back(w);
      changed_.insert(key);
    }
  }
  void AddPairs(size_t w) { CountPairs(w, +1); }

  void Push(uint64_t key) {
    const int64_t count = pair_counts_[key];
    if (count > 0) heap_.push({count, key});
  }

  void Merge(uint64_t key) {
    const int32_t left = Left(key);
    const int32_t right = Right(key);
    const int32_t merged = Intern(symbols_[left].text + symbols_[right].text,
                                  symbols_[left].chars + symbols_[right].chars);
    changed_.clear();
    std::vector<size_t> affected = std::move(pair_words_[key]);
    pair_words_.erase(key);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    for (const size_t w : affected) {
      CountPairs(w, -1);
      std::vector<int32_t>& symbols = words_[w].symbols;
      std::vector<int32_t> out;
      out.reserve(symbols.size());
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(symbols[i]);
        }
      }
      symbols = std::move(out);
      AddPairs(w);
    }
    for (const uint64_t changed : changed_) Push(changed);
  }

  std::vector<Symbol> symbols_;
  std::unordered_map<std::string, int32_t> symbol_ids_;
  std::vector<Word> words_;
  std::unordered_map<uint64_t, int64_t> pair_counts_;
  // Words that contain (or once contained) each pair.
  std::unordered_map<uint64_t, std::vector<size_t>> pair_words_;
  std::unordered_set<uint64_t> changed_;
  std::priority_queue<Candidate, std::vector<Candidate>, CandidateOrder> heap_{
      CandidateOrder{this}};
};

}  // namespace

absl::StatusOr<std::string> TrainSentencePieceModel(const std::vector<std::string>& sentences,
                                                    int vocab_size) {
  std::map<std::string, int64_t> word_counts;
  for (size_t i = 0; i < sentences.size(); ++i) {
    if (!utf8::IsValid(sentences[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("TrainSentencePiece: sentence ", i, " is not valid UTF-8"));
    }
    const std::string normalized = Normalize(sentences[i]);
    for (const std::string_view word : SplitWords(normalized)) {
      ++word_counts[std::string(word)];
    }
  }
  if (word_counts.empty()) {
    return absl::InvalidArgumentError("TrainSentencePiece: the corpus is empty");
  }

  // Characters, most frequent first, then by spelling.
  std::map<std::string, int64_t> char_counts;
  for (const auto& [word, count] : word_counts) {
    for (size_t pos = 0; pos < word.size();) {
      size_t length = 0;
      utf8::DecodeAt(word, pos, &length);
      char_counts[word.substr(pos, length)] += count;
      pos += length;
    }
  }
  std::vector<std::pair<std::string, int64_t>> chars(char_counts.begin(), char_counts.end());
  std::stable_sort(chars.begin(), chars.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });

  const int min_size = kReservedPieces + static_cast<int>(chars.size());
  if (vocab_size < min_size) {
    return absl::InvalidArgumentError(absl::StrCat("TrainSentencePiece: vocab_size ", vocab_size,
                                                   " is too small; the 259 control and "
                                                   "byte pieces and the corpus' ",
                                                   chars.size(), " characters need at least ",
                                                   min_size));
  }
  std::unordered_set<std::string> known;
  for (const auto& [c, count] : chars) known.insert(c);
  std::vector<std::string> merged_pieces;
  BpeTrainer trainer(word_counts);
  while (static_cast<int>(merged_pieces.size()) < vocab_size - min_size) {
    std::optional<std::string> piece = trainer.MergeBest();
    if (!piece.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("TrainSentencePiece: vocab_size ", vocab_size,
                                                     " is too large; the corpus supports at "
                                                     "most ",
                                                     min_size + merged_pieces.size()));
    }
    // The same spelling can come from two different merges; a piece is listed once.
    if (known.insert(*piece).second) merged_pieces.push_back(*std::move(piece));
  }

  Proto proto;
  proto.pieces.push_back({"<unk>", 0.0f, Proto::PieceType::kUnknown});
  proto.pieces.push_back({"<s>", 0.0f, Proto::PieceType::kControl});
  proto.pieces.push_back({"</s>", 0.0f, Proto::PieceType::kControl});
  for (int b = 0; b < 256; ++b) {
    proto.pieces.push_back({absl::StrFormat("<0x%02X>", b), 0.0f, Proto::PieceType::kByte});
  }
  // Scores fall with merge order: SentencePiece's BPE encoder applies the best-scored merge
  // first, which replays training. Characters come last, as SentencePiece lists them.
  float score = 0.0f;
  for (std::string& piece : merged_pieces) {
    proto.pieces.push_back({std::move(piece), score, Proto::PieceType::kNormal});
    score -= 1.0f;
  }
  for (auto& [c, count] : chars) {
    proto.pieces.push_back({c, score, Proto::PieceType::kNormal});
    score -= 1.0f;
  }

  Proto::TrainerSpec& spec = proto.trainer_spec;
  spec.model_type = Proto::ModelType::kBpe;
  spec.vocab_size = vocab_size;
  spec.character_coverage = 1.0f;
  spec.num_threads = 1;
  spec.shuffle_input_sentence = false;
  spec.max_sentencepiece_length = kMaxPieceChars;
  spec.split_digits = true;
  spec.allow_whitespace_only_pieces = true;
  spec.byte_fallback = true;
  spec.unk_id = 0;
  spec.bos_id = 1;
  spec.eos_id = 2;
  spec.pad_id = -1;
  proto.normalizer_spec.name = "identity";
  proto.normalizer_spec.add_dummy_prefix = true;
  proto.normalizer_spec.remove_extra_whitespaces = false;
  proto.normalizer_spec.escape_whitespaces = true;
  return proto.Serialize();
}

absl::Status TrainSentencePiece(const std::vector<std::string>& sentences, int vocab_size,
                                const std::filesystem::path& model_out) {
  auto model = TrainSentencePieceModel(sentences, vocab_size);
  if (!model.ok()) {
    return absl::Status(model.status().code(), absl::StrCat(model.status().message(), " (training ",
                                                            model_out.string(), ")"));
  }
  std::ofstream out(model_out, std::ios::binary | std::ios::trunc);
  out.write(model->data(), static_cast<std::streamsize>(model->size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", model_out.string()));
  return absl::OkStatus();
}

}  // namespace tophat
