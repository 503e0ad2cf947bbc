#include "models/tokenizers/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <queue>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "models/tokenizers/tokenizer_utf8.h"
#include "nlohmann/json.hpp"
#include "base/strings.h"

namespace tophat {
namespace {

using Json = nlohmann::json;

// This Abseil build has its own string_view class, which std::string_view does not convert to.
// The pre-tokenizer regex of GPT-2, which ByteLevel applies when `use_regex` is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Ids beyond this are taken as a corrupt file rather than allocated for.
constexpr int64_t kMaxTokenId = int64_t{1} << 24;

// Pre-tokens longer than this are not cached: they are rare and would bloat the cache.
constexpr size_t kMaxCachedWordBytes = 128;
constexpr size_t kMaxCacheEntries = size_t{1} << 16;

// GPT-2's reversible map from bytes to printable code points, so that every byte sequence
// is a string of visible characters: printable Latin-1 bytes map to themselves, the other 68
// bytes to U+0100 onwards in byte order.
struct ByteLevelAlphabet {
  std::array<std::string, 256> byte_to_symbol;
  std::array<int16_t, 512> code_point_to_byte;

  ByteLevelAlphabet() {
    code_point_to_byte.fill(-1);
    char32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const char32_t cp = printable ? static_cast<char32_t>(b) : next_extra++;
      utf8::AppendCodePoint(cp, byte_to_symbol[b]);
      code_point_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelAlphabet& Alphabet() {
  static const ByteLevelAlphabet* const alphabet = new ByteLevelAlphabet();
  return *alphabet;
}

}  // namespace

std::string PlaceholderByteLevelTokenizerJson(int32_t vocab_size, int32_t bos, int32_t eos) {
  // Not ordered_json: its object insert searches linearly, quadratic over 128k pieces.
  using Json = nlohmann::json;
  Json vocab = Json::object();
  for (int b = 0; b < 256 && b < vocab_size; ++b) vocab[Alphabet().byte_to_symbol[b]] = b;
  Json added = Json::array();
  for (int32_t id = 256; id < vocab_size; ++id) {
    if (id == bos || id == eos) {
      const std::string content = id == bos ? "<|begin_of_text|>" : "<|end_of_text|>";
      vocab[content] = id;
      added.push_back({{"id", id}, {"content", content}, {"single_word", false},
                       {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                       {"special", true}});
      continue;
    }
    vocab[absl::StrCat("<", id, ">")] = id;  // printable ASCII: its own byte-level spelling
  }
  const Json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                           {"trim_offsets", true}, {"use_regex", true}};
  const Json tokenizer = {{"version", "1.0"},
                          {"truncation", nullptr},
                          {"padding", nullptr},
                          {"added_tokens", added},
                          {"normalizer", nullptr},
                          {"pre_tokenizer", byte_level},
                          {"post_processor", nullptr},
                          {"decoder", byte_level},
                          {"model",
                           {{"type", "BPE"},
                            {"dropout", nullptr},
                            {"unk_token", nullptr},
                            {"continuing_subword_prefix", nullptr},
                            {"end_of_word_suffix", nullptr},
                            {"fuse_unk", false},
                            {"byte_fallback", false},
                            {"ignore_merges", false},
                            {"vocab", vocab},
                            {"merges", Json::array()}}}};
  return tokenizer.dump();
}

namespace {

// Inverse of the byte-level map for one vocabulary symbol. A symbol with characters outside
// the alphabet (never produced by byte-level training) decodes to its own bytes, as the
// Hugging Face ByteLevel decoder does.
std::string SymbolToBytes(std::string_view symbol) {
  const ByteLevelAlphabet& alphabet = Alphabet();
  std::string bytes;
  for (size_t pos = 0; pos < symbol.size();) {
    size_t length = 0;
    const char32_t cp = utf8::DecodeAt(symbol, pos, &length);
    if (cp >= alphabet.code_point_to_byte.size() || alphabet.code_point_to_byte[cp] < 0) {
      return std::string(symbol);
    }
    bytes.push_back(static_cast<char>(alphabet.code_point_to_byte[cp]));
    pos += length;
  }
  return bytes;
}

struct PcreCodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct PcreMatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

std::string PcreErrorMessage(int code) {
  std::array<PCRE2_UCHAR, 256> buffer{};
  pcre2_get_error_message(code, buffer.data(), buffer.size());
  return std::string(reinterpret_cast<const char*>(buffer.data()));
}

// A compiled pattern. The pcre2_code is read-only once compiled, so threads share it and
// each match brings its own match data.
class Regex {
 public:
  static absl::StatusOr<std::shared_ptr<const Regex>> Compile(std::string_view pattern) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    // UCP makes \s, \w and friends Unicode-aware, as in the Oniguruma engine of Hugging Face.
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
    if (code == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "regex does not compile at offset ", error_offset, ": ", PcreErrorMessage(error_code)));
    }
    // JIT is only a speed-up; without it pcre2_match interprets the pattern.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    return std::shared_ptr<const Regex>(new Regex(code));
  }

  // Returns the [start, end) spans of the non-empty matches in `text` (valid UTF-8).
  absl::StatusOr<std::vector<std::pair<size_t, size_t>>> FindAll(std::string_view text) const {
    std::unique_ptr<pcre2_match_data, PcreMatchDataDeleter> data(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr));
    if (data == nullptr) return absl::ResourceExhaustedError("pcre2_match_data_create failed");
    std::vector<std::pair<size_t, size_t>> spans;
    size_t offset = 0;
    while (offset < text.size()) {
      // The text was validated once up front; PCRE2 would otherwise re-check all of it on
      // every call, which is quadratic.
      const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()),
                                 text.size(), offset, PCRE2_NO_UTF_CHECK, data.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("pre-tokenizer regex failed: ", PcreErrorMessage(rc)));
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
      const size_t start = ovector[0];
      const size_t end = ovector[1];
      if (end <= start) {
        // Step past an empty match by one character so the loop advances.
        size_t length = 1;
        if (start < text.size()) utf8::DecodeAt(text, start, &length);
        offset = std::max(offset, start) + length;
        continue;
      }
      spans.emplace_back(start, end);
      offset = end;
    }
    return spans;
  }

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}
  std::unique_ptr<pcre2_code, PcreCodeDeleter> code_;
};

enum class SplitBehavior {
  kIsolated,
  kRemoved,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous,
};

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel };
  Kind kind = Kind::kSplit;
  // kSplit: a regex, or a literal when `regex` is null.
  std::shared_ptr<const Regex> regex;
  std::string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  // kByteLevel, which also splits with `regex` (GPT-2's) when its use_regex is set.
  bool add_prefix_space = false;
};

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
};

// How Decode renders an id.
enum class TokenKind : uint8_t { kNone, kVocab, kAdded, kSpecial };

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Applies one Split step to `piece`, appending the resulting pieces to `out`.
absl::Status ApplySplit(const PreTokenizerStep& step, const std::string& piece,
                        std::vector<std::string>& out) {
  std::vector<std::pair<size_t, size_t>> matches;
  if (step.regex != nullptr) {
    auto found = step.regex->FindAll(piece);
    if (!found.ok()) return found.status();
    matches = *std::move(found);
  } else if (!step.literal.empty()) {
    for (size_t pos = piece.find(step.literal); pos != std::string::npos;
         pos = piece.find(step.literal, pos + step.literal.size())) {
      matches.emplace_back(pos, pos + step.literal.size());
    }
  }
  // Every span of the piece, flagged by whether it is a delimiter.
  struct Part {
    size_t start;
    size_t end;
    bool is_match;
  };
  std::vector<Part> parts;
  size_t cursor = 0;
  for (const auto& [start, end] : matches) {
    if (start > cursor) parts.push_back({cursor, start, step.invert});
    parts.push_back({start, end, !step.invert});
    cursor = end;
  }
  if (cursor < piece.size()) parts.push_back({cursor, piece.size(), step.invert});

  std::vector<std::pair<size_t, size_t>> spans;
  bool previous_match = false;
  switch (step.behavior) {
    case SplitBehavior::kIsolated:
      for (const Part& part : parts) spans.emplace_back(part.start, part.end);
      break;
    case SplitBehavior::kRemoved:
      for (const Part& part : parts) {
        if (!part.is_match) spans.emplace_back(part.start, part.end);
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& part : parts) {
        if (part.is_match && !previous_match && !spans.empty()) {
          spans.back().second = part.end;
        } else {
          spans.emplace_back(part.start, part.end);
        }
        previous_match = part.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !spans.empty()) {
          spans.back().first = it->start;
        } else {
          spans.emplace_back(it->start, it->end);
        }
        previous_match = it->is_match;
      }
      std::reverse(spans.begin(), spans.end());
      break;
    case SplitBehavior::kContiguous:
      for (size_t i = 0; i < parts.size(); ++i) {
        if (i > 0 && parts[i].is_match && parts[i - 1].is_match) {
          spans.back().second = parts[i].end;
        } else {
          spans.emplace_back(parts[i].start, parts[i].end);
        }
      }
      break;
  }
  for (const auto& [start, end] : spans) {
    if (end > start) out.push_back(piece.substr(start, end - start));
  }
  return absl::OkStatus();
}

struct BpeModel {
  std::unordered_map<std::string, int32_t> vocab;
  // (left id, right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  bool ignore_merges = false;
  int32_t max_id = -1;
};

// Parsing helpers. Each error names the file and the field at fault.
class Parser {
 public:
  explicit Parser(std::string_view source) : source_(source) {}

  absl::Status Error(std::string_view field, std::string_view problem) const {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer file ", Sv(source_), ": field `", Sv(field), "` ", Sv(problem)));
  }
  absl::Status Unsupported(std::string_view field, std::string_view what) const {
    return absl::UnimplementedError(absl::StrCat("tokenizer file ", Sv(source_), ": field `",
                                                 Sv(field), "` is ", Sv(what),
                                                 ", which tophat does not support (only "
                                                 "byte-level BPE tokenizer.json files are)"));
  }

  // Returns `object[key]` as a string, or `fallback` when absent or null.
  absl::StatusOr<std::string> OptionalString(const Json& object, const char* key,
                                             std::string_view field,
                                             std::string fallback = "") const {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) return fallback;
    if (!it->is_string()) return Error(field, "is not a string");
    return it->get<std::string>();
  }

  absl::StatusOr<bool> OptionalBool(const Json& object, const char* key, std::string_view field,
                                    bool fallback) const {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return Error(field, "is not a boolean");
    return it->get<bool>();
  }

  absl::StatusOr<int32_t> TokenId(const Json& value, std::string_view field) const {
    if (!value.is_number_integer()) return Error(field, "is not an integer token id");
    const auto id = value.get<int64_t>();
    if (id < 0 || id >= kMaxTokenId) {
      return Error(field, absl::StrCat("has token id ", id, " outside [0, ", kMaxTokenId, ")"));
    }
    return static_cast<int32_t>(id);
  }

  absl::Status ParsePreTokenizer(const Json& node, std::string_view field,
                                 std::vector<PreTokenizerStep>& steps) const {
    if (!node.is_object()) return Error(field, "is not an object");
    const auto type_or = OptionalString(node, "type", absl::StrCat(Sv(field), ".type"));
    if (!type_or.ok()) return type_or.status();
    const std::string& type = *type_or;
    if (type == "Sequence") {
      const auto list = node.find("pretokenizers");
      if (list == node.end() || !list->is_array()) {
        return Error(absl::StrCat(Sv(field), ".pretokenizers"), "is missing or not an array");
      }
      for (size_t i = 0; i < list->size(); ++i) {
        const absl::Status status = ParsePreTokenizer(
            (*list)[i], absl::StrCat(Sv(field), ".pretokenizers[", i, "]"), steps);
        if (!status.ok()) return status;
      }
      return absl::OkStatus();
    }
    PreTokenizerStep step;
    if (type == "ByteLevel") {
      step.kind = PreTokenizerStep::Kind::kByteLevel;
      auto add_prefix_space = OptionalBool(node, "add_prefix_space",
                                           absl::StrCat(Sv(field), ".add_prefix_space"), false);
      if (!add_prefix_space.ok()) return add_prefix_space.status();
      auto use_regex = OptionalBool(node, "use_regex", absl::StrCat(Sv(field), ".use_regex"), true);
      if (!use_regex.ok()) return use_regex.status();
      step.add_prefix_space = *add_prefix_space;
      if (*use_regex) {
        auto regex = Regex::Compile(kGpt2Pattern);
        if (!regex.ok()) return regex.status();
        step.regex = *std::move(regex);
      }
      steps.push_back(std::move(step));
      return absl::OkStatus();
    }
    if (type == "Split") {
      const std::string pattern_field = absl::StrCat(Sv(field), ".pattern");
      const auto pattern = node.find("pattern");
      if (pattern == node.end() || !pattern->is_object()) {
        return Error(pattern_field, "is missing or not an object");
      }
      if (const auto regex = pattern->find("Regex"); regex != pattern->end()) {
        if (!regex->is_string()) return Error(pattern_field + ".Regex", "is not a string");
        auto compiled = Regex::Compile(regex->get<std::string>());
        if (!compiled.ok())
          return Error(pattern_field + ".Regex", std::string(compiled.status().message()));
        step.regex = *std::move(compiled);
      } else if (const auto literal = pattern->find("String"); literal != pattern->end()) {
        if (!literal->is_string()) return Error(pattern_field + ".String", "is not a string");
        step.literal = literal->get<std::string>();
      } else {
        return Error(pattern_field, "has neither `Regex` nor `String`");
      }
      auto behavior =
          OptionalString(node, "behavior", absl::StrCat(Sv(field), ".behavior"), "Isolated");
      if (!behavior.ok()) return behavior.status();
      if (*behavior == "Isolated") {
        step.behavior = SplitBehavior::kIsolated;
      } else if (*behavior == "Removed") {
        step.behavior = SplitBehavior::kRemoved;
      } else if (*behavior == "MergedWithPrevious") {
        step.behavior = SplitBehavior::kMergedWithPrevious;
      } else if (*behavior == "MergedWithNext") {
        step.behavior = SplitBehavior::kMergedWithNext;
      } else if (*behavior == "Contiguous") {
        step.behavior = SplitBehavior::kContiguous;
      } else {
        return Error(absl::StrCat(Sv(field), ".behavior"),
                     absl::StrCat("has unknown value \"", *behavior, "\""));
      }
      auto invert = OptionalBool(node, "invert", absl::StrCat(Sv(field), ".invert"), false);
      if (!invert.ok()) return invert.status();
      step.invert = *invert;
      steps.push_back(std::move(step));
      return absl::OkStatus();
    }
    return Unsupported(absl::StrCat(Sv(field), ".type"), absl::StrCat("\"", type, "\""));
  }

  // model: the vocabulary and merges of a BPE model.
  absl::Status ParseModel(const Json& root, BpeModel& bpe) const {
    const auto model_it = root.find("model");
    if (model_it == root.end() || !model_it->is_object()) {
      return Error("model", "is missing or not an object");
    }
    const Json& model = *model_it;
    // Old files omit the type; a merges list identifies BPE.
    auto type = OptionalString(model, "type", "model.type", model.contains("merges") ? "BPE" : "");
    if (!type.ok()) return type.status();
    if (*type != "BPE") {
      return Error("model.type", absl::StrCat("is \"", *type, "\"; only \"BPE\" is supported"));
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      auto affix = OptionalString(model, key, absl::StrCat("model.", key));
      if (!affix.ok()) return affix.status();
      if (!affix->empty()) {
        return Unsupported(absl::StrCat("model.", key), absl::StrCat("\"", *affix, "\""));
      }
    }
    auto ignore_merges = OptionalBool(model, "ignore_merges", "model.ignore_merges", false);
    if (!ignore_merges.ok()) return ignore_merges.status();
    bpe.ignore_merges = *ignore_merges;

    const auto vocab = model.find("vocab");
    if (vocab == model.end() || !vocab->is_object()) {
      return Error("model.vocab", "is missing or not an object");
    }
    for (const auto& [symbol, value] : vocab->items()) {
      auto id = TokenId(value, absl::StrCat("model.vocab[\"", symbol, "\"]"));
      if (!id.ok()) return id.status();
      bpe.vocab.emplace(symbol, *id);
      bpe.max_id = std::max(bpe.max_id, *id);
    }

    const auto merges = model.find("merges");
    if (merges == model.end() || !merges->is_array()) {
      return Error("model.merges", "is missing or not an array");
    }
    for (size_t rank = 0; rank < merges->size(); ++rank) {
      const Json& merge = (*merges)[rank];
      const std::string field = absl::StrCat("model.merges[", rank, "]");
      std::string left;
      std::string right;
      if (merge.is_string()) {
        // Byte-level symbols never contain a space, so the first space separates the pair.
        const std::string text = merge.get<std::string>();
        const size_t space = text.find(' ');
        if (space == std::string::npos) return Error(field, "is not \"left right\"");
        left = text.substr(0, space);
        right = text.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
                 merge[1].is_string()) {
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      } else {
        return Error(field, "is neither \"left right\" nor [\"left\", \"right\"]");
      }
      const auto left_id = bpe.vocab.find(left);
      const auto right_id = bpe.vocab.find(right);
      const auto merged_id = bpe.vocab.find(left + right);
      if (left_id == bpe.vocab.end() || right_id == bpe.vocab.end() ||
          merged_id == bpe.vocab.end()) {
        return Error(field, absl::StrCat("merges \"", left, "\" and \"", right,
                                         "\", which (or whose result) is not in model.vocab"));
      }
      // A repeated pair keeps its first, lowest rank.
      bpe.merges.emplace(PairKey(left_id->second, right_id->second),
                         std::make_pair(static_cast<int32_t>(rank), merged_id->second));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<AddedToken>> ParseAddedTokens(const Json& root) const {
    std::vector<AddedToken> tokens;
    const auto added = root.find("added_tokens");
    if (added == root.end() || added->is_null()) return tokens;
    if (!added->is_array()) return Error("added_tokens", "is not an array");
    for (size_t i = 0; i < added->size(); ++i) {
      const Json& entry = (*added)[i];
      const std::string field = absl::StrCat("added_tokens[", i, "]");
      if (!entry.is_object()) return Error(field, "is not an object");
      AddedToken token;
      const auto id_it = entry.find("id");
      if (id_it == entry.end()) return Error(field + ".id", "is missing");
      auto id = TokenId(*id_it, field + ".id");
      if (!id.ok()) return id.status();
      token.id = *id;
      auto content = OptionalString(entry, "content", field + ".content");
      if (!content.ok()) return content.status();
      if (content->empty()) return Error(field + ".content", "is missing or empty");
      token.content = *std::move(content);
      auto special = OptionalBool(entry, "special", field + ".special", false);
      auto lstrip = OptionalBool(entry, "lstrip", field + ".lstrip", false);
      auto rstrip = OptionalBool(entry, "rstrip", field + ".rstrip", false);
      for (const auto* flag : {&special, &lstrip, &rstrip}) {
        if (!flag->ok()) return flag->status();
      }
      token.special = *special;
      token.lstrip = *lstrip;
      token.rstrip = *rstrip;
      tokens.push_back(std::move(token));
    }
    return tokens;
  }

  // normalizer, pre_tokenizer and decoder, checked to form a byte-level pipeline.
  absl::StatusOr<std::vector<PreTokenizerStep>> ParsePipeline(const Json& root) const {
    // NFC leaves ASCII and already-composed text unchanged, which is what models see in
    // practice, so it is applied as the identity rather than pulling in a Unicode library.
    if (const auto normalizer = root.find("normalizer");
        normalizer != root.end() && !normalizer->is_null()) {
      if (!normalizer->is_object()) return Error("normalizer", "is not an object");
      auto type = OptionalString(*normalizer, "type", "normalizer.type");
      if (!type.ok()) return type.status();
      if (*type != "NFC") return Unsupported("normalizer.type", absl::StrCat("\"", *type, "\""));
    }

    std::vector<PreTokenizerStep> steps;
    const auto pre_tokenizer = root.find("pre_tokenizer");
    if (pre_tokenizer == root.end() || pre_tokenizer->is_null()) {
      return Unsupported("pre_tokenizer", "null");
    }
    if (absl::Status status = ParsePreTokenizer(*pre_tokenizer, "pre_tokenizer", steps);
        !status.ok()) {
      return status;
    }
    // The mapping to byte-level symbols must come last, after all splitting.
    const auto byte_level_steps = std::count_if(steps.begin(), steps.end(), [](const auto& step) {
      return step.kind == PreTokenizerStep::Kind::kByteLevel;
    });
    if (byte_level_steps != 1 || steps.back().kind != PreTokenizerStep::Kind::kByteLevel) {
      return Unsupported("pre_tokenizer", "not a pipeline ending in its only ByteLevel step");
    }

    const auto decoder = root.find("decoder");
    if (decoder == root.end() || decoder->is_null()) return Unsupported("decoder", "null");
    if (!decoder->is_object()) return Error("decoder", "is not an object");
    auto decoder_type = OptionalString(*decoder, "type", "decoder.type");
    if (!decoder_type.ok()) return decoder_type.status();
    if (*decoder_type != "ByteLevel") {
      return Unsupported("decoder.type", absl::StrCat("\"", *decoder_type, "\""));
    }
    return steps;
  }

 private:
  std::string_view source_;
};

}  // namespace

struct BpeTokenizer::Model {
  std::string source;
  std::unordered_map<std::string, int32_t> vocab;
  // (left id, right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  bool ignore_merges = false;
  // Id of each byte's single-character symbol, -1 when the vocabulary lacks it.
  std::array<int32_t, 256> byte_ids{};
  std::vector<AddedToken> added_tokens;
  // Indices into added_tokens by first byte, longest content first.
  std::array<std::vector<size_t>, 256> added_by_first_byte;
  std::unordered_map<std::string, int32_t> added_ids;
  std::vector<PreTokenizerStep> steps;
  // Per id: what Decode emits and whether to skip it.
  std::vector<TokenKind> kinds;
  std::vector<std::string> decoded;
  std::unordered_map<int32_t, std::string> special_text;  // special added tokens' content
  std::optional<int32_t> bos;
  std::optional<int32_t> eos;
};

BpeTokenizer::BpeTokenizer(std::unique_ptr<const Model> model) : model_(std::move(model)) {}
BpeTokenizer::~BpeTokenizer() = default;

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Load(
    const std::filesystem::path& json_path, const SpecialTokenNames& names) {
  std::ifstream in(json_path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", json_path.string()));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("cannot read tokenizer file ", json_path.string()));
  }
  return FromJson(contents.str(), json_path.string(), names);
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromJson(
    std::string_view json_text, std::string_view source, const SpecialTokenNames& names) {
  const Parser parser(source);
  Json root;
  try {
    root = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer file ", Sv(source), " is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) return parser.Error("(root)", "is not an object");

  auto model = std::make_unique<Model>();
  model->source = std::string(source);
  BpeModel bpe;
  if (absl::Status status = parser.ParseModel(root, bpe); !status.ok()) return status;
  auto added_tokens = parser.ParseAddedTokens(root);
  if (!added_tokens.ok()) return added_tokens.status();
  auto steps = parser.ParsePipeline(root);
  if (!steps.ok()) return steps.status();
  model->vocab = std::move(bpe.vocab);
  model->merges = std::move(bpe.merges);
  model->ignore_merges = bpe.ignore_merges;
  model->added_tokens = *std::move(added_tokens);
  model->steps = *std::move(steps);

  const ByteLevelAlphabet& alphabet = Alphabet();
  for (int b = 0; b < 256; ++b) {
    const auto it = model->vocab.find(alphabet.byte_to_symbol[b]);
    model->byte_ids[b] = it == model->vocab.end() ? -1 : it->second;
  }

  int32_t max_id = bpe.max_id;
  for (size_t i = 0; i < model->added_tokens.size(); ++i) {
    const AddedToken& token = model->added_tokens[i];
    max_id = std::max(max_id, token.id);
    model->added_ids[token.content] = token.id;
    model->added_by_first_byte[static_cast<unsigned char>(token.content[0])].push_back(i);
  }
  for (auto& indices : model->added_by_first_byte) {
    std::stable_sort(indices.begin(), indices.end(), [&](size_t a, size_t b) {
      return model->added_tokens[a].content.size() > model->added_tokens[b].content.size();
    });
  }

  // Added tokens are not byte-level encoded, so they decode verbatim (or to nothing when
  // special), as in Hugging Face.
  model->kinds.assign(max_id + 1, TokenKind::kNone);
  model->decoded.assign(max_id + 1, "");
  for (const auto& [symbol, id] : model->vocab) {
    model->kinds[id] = TokenKind::kVocab;
    model->decoded[id] = SymbolToBytes(symbol);
  }
  for (const AddedToken& token : model->added_tokens) {
    model->kinds[token.id] = token.special ? TokenKind::kSpecial : TokenKind::kAdded;
    model->decoded[token.id] = token.special ? "" : token.content;
    if (token.special) model->special_text[token.id] = token.content;
  }

  const auto find = [&](const std::string& piece) -> std::optional<int32_t> {
    if (const auto it = model->added_ids.find(piece); it != model->added_ids.end()) {
      return it->second;
    }
    if (const auto it = model->vocab.find(piece); it != model->vocab.end()) return it->second;
    return std::nullopt;
  };
  const auto pick = [&](const std::optional<std::string>& preferred,
                        std::initializer_list<const char*> candidates) -> std::optional<int32_t> {
    if (preferred.has_value()) {
      if (auto id = find(*preferred)) return id;
    }
    for (const char* candidate : candidates) {
      if (const auto it = model->added_ids.find(candidate); it != model->added_ids.end()) {
        return it->second;
      }
    }
    return std::nullopt;
  };
  model->bos = pick(names.bos, {"<|begin_of_text|>", "<s>"});
  model->eos =
      pick(names.eos, {"<|end_of_text|>", "<|endoftext|>", "<|eot_id|>", "</s>", "<|im_end|>"});

  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(model)));
}

absl::StatusOr<std::vector<int32_t>> BpeTokenizer::Encode(std::string_view text,
                                                          bool parse_special) const {
  if (!utf8::IsValid(text)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer ", model_->source, ": text to encode is not valid UTF-8"));
  }
  std::vector<int32_t> ids;
  size_t plain_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    // Longest added token starting here. Non-special added tokens always match, as in
    // Hugging Face; special ones only when asked to.
    const AddedToken* match = nullptr;
    for (const size_t index : model_->added_by_first_byte[static_cast<unsigned char>(text[pos])]) {
      const AddedToken& token = model_->added_tokens[index];
      if ((parse_special || !token.special) && text.substr(pos).starts_with(token.content)) {
        match = &token;
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t end = pos + match->content.size();
    if (match->lstrip) {
      while (start > plain_start && IsAsciiSpace(text[start - 1])) --start;
    }
    if (match->rstrip) {
      while (end < text.size() && IsAsciiSpace(text[end])) ++end;
    }
    if (absl::Status status = EncodeText(text.substr(plain_start, start - plain_start), ids);
        !status.ok()) {
      return status;
    }
    ids.push_back(match->id);
    pos = plain_start = end;
  }
  if (absl::Status status = EncodeText(text.substr(plain_start), ids); !status.ok()) {
    return status;
  }
  return ids;
}

absl::Status BpeTokenizer::EncodeText(std::string_view text, std::vector<int32_t>& ids) const {
  if (text.empty()) return absl::OkStatus();
  std::vector<std::string> pieces = {std::string(text)};
  for (const PreTokenizerStep& step : model_->steps) {
    std::vector<std::string> next;
    next.reserve(pieces.size());
    for (std::string& piece : pieces) {
      if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
        // Hugging Face adds the prefix space to each piece reaching this step.
        if (step.add_prefix_space && !piece.starts_with(' ')) piece.insert(0, " ");
        if (step.regex == nullptr) {
          next.push_back(std::move(piece));
          continue;
        }
      }
      if (absl::Status status = ApplySplit(step, piece, next); !status.ok()) {
        return absl::Status(status.code(),
                            absl::StrCat("tokenizer ", model_->source, ": ", status.message()));
      }
    }
    pieces = std::move(next);
  }
  for (const std::string& piece : pieces) {
    if (absl::Status status = EncodeWord(piece, ids); !status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>& ids) const {
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (const auto it = cache_.find(std::string(word)); it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return absl::OkStatus();
    }
  }

  const ByteLevelAlphabet& alphabet = Alphabet();
  std::vector<int32_t> result;
  if (model_->ignore_merges) {
    std::string symbol;
    for (const char c : word) symbol += alphabet.byte_to_symbol[static_cast<unsigned char>(c)];
    if (const auto it = model_->vocab.find(symbol); it != model_->vocab.end()) {
      result.push_back(it->second);
    }
  }
  if (result.empty()) {
    // Symbols form a linked list over byte positions; a heap of candidate pairs ordered by
    // (rank, position) makes each merge O(log n), so long pre-tokens stay cheap.
    const size_t n = word.size();
    std::vector<int32_t> symbol(n);
    std::vector<int64_t> prev(n);
    std::vector<int64_t> next(n);
    for (size_t i = 0; i < n; ++i) {
      const auto byte = static_cast<unsigned char>(word[i]);
      if (model_->byte_ids[byte] < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tokenizer ", model_->source, ": symbol \"", alphabet.byte_to_symbol[byte],
            "\" (byte 0x", absl::Hex(byte, absl::kZeroPad2), ") is not in the vocabulary"));
      }
      symbol[i] = model_->byte_ids[byte];
      prev[i] = static_cast<int64_t>(i) - 1;
      next[i] = i + 1 < n ? static_cast<int64_t>(i) + 1 : -1;
    }
    struct Candidate {
      int32_t rank;
      int64_t left;
      int32_t left_symbol;
      int32_t right_symbol;
      bool operator>(const Candidate& other) const {
        return rank != other.rank ? rank > other.rank : left > other.left;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    const auto push = [&](int64_t left) {
      if (left < 0 || next[left] < 0) return;
      const auto it = model_->merges.find(PairKey(symbol[left], symbol[next[left]]));
      if (it != model_->merges.end()) {
        heap.push({it->second.first, left, symbol[left], symbol[next[left]]});
      }
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int64_t>(i));
    std::vector<bool> alive(n, true);
    while (!heap.empty()) {
      const Candidate top = heap.top();
      heap.pop();
      const int64_t left = top.left;
      const int64_t right = next[left];
      // Skip candidates that earlier merges made stale.
      if (!alive[left] || right < 0 || symbol[left] != top.left_symbol ||
          symbol[right] != top.right_symbol) {
        continue;
      }
      symbol[left] = model_->merges.at(PairKey(top.left_symbol, top.right_symbol)).second;
      alive[right] = false;
      next[left] = next[right];
      if (next[right] >= 0) prev[next[right]] = left;
      push(prev[left]);
      push(left);
    }
    for (int64_t i = 0; i >= 0 && n > 0; i = next[i]) result.push_back(symbol[i]);
  }

  ids.insert(ids.end(), result.begin(), result.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    // Bounded by clearing: simpler than LRU and a cold cache only costs speed.
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(word), std::move(result));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> BpeTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  for (const int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= model_->kinds.size() ||
        model_->kinds[id] == TokenKind::kNone) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer ", model_->source, ": token id ",
                                                     id, " is not in the vocabulary"));
    }
    bytes += model_->decoded[id];
  }
  return utf8::ToValidLossy(bytes);
}

int32_t BpeTokenizer::vocab_size() const { return static_cast<int32_t>(model_->kinds.size()); }
std::optional<int32_t> BpeTokenizer::bos_id() const { return model_->bos; }
std::optional<int32_t> BpeTokenizer::eos_id() const { return model_->eos; }

std::optional<std::string> BpeTokenizer::SpecialText(int32_t id) const {
  if (const auto it = model_->special_text.find(id); it != model_->special_text.end()) {
    return it->second;
  }
  return std::nullopt;
}

std::optional<std::string> BpeTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= model_->kinds.size()) return std::nullopt;
  switch (model_->kinds[id]) {
    case TokenKind::kVocab:
    case TokenKind::kAdded:
      return model_->decoded[id];
    case TokenKind::kNone:
    case TokenKind::kSpecial:
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<int32_t> BpeTokenizer::PieceToId(std::string_view piece) const {
  const std::string key(piece);
  if (const auto it = model_->added_ids.find(key); it != model_->added_ids.end()) {
    return it->second;
  }
  if (const auto it = model_->vocab.find(key); it != model_->vocab.end()) return it->second;
  return std::nullopt;
}

}  // namespace tophat
