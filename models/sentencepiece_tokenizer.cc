#include "models/sentencepiece_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <queue>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "models/tokenizer_utf8.h"

namespace tophat {
namespace {

// U+2581, SentencePiece's visible stand-in for a space.
constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Parses "<0xAB>", the spelling of byte pieces; -1 if `piece` is not one.
int ParseBytePiece(std::string_view piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece.back() != '>') return -1;
  int value = 0;
  for (const char c : piece.substr(3, 2)) {
    value *= 16;
    if (c >= '0' && c <= '9') {
      value += c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value += c - 'A' + 10;
    } else {
      return -1;
    }
  }
  return value;
}

std::string ReplaceSpaceSymbols(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  for (size_t pos = 0; pos < piece.size();) {
    if (piece.substr(pos).starts_with(kSpaceSymbol)) {
      out.push_back(' ');
      pos += kSpaceSymbol.size();
    } else {
      out.push_back(piece[pos++]);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(
    const std::filesystem::path& model_path) {
  std::ifstream in(model_path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open SentencePiece model ", model_path.string()));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(
        absl::StrCat("cannot read SentencePiece model ", model_path.string()));
  }
  return FromSerialized(contents.str(), model_path.string());
}

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::FromSerialized(
    std::string_view model_bytes, std::string_view source) {
  const auto error = [&](std::string_view problem) {
    return absl::InvalidArgumentError(
        absl::StrCat("SentencePiece model ", Sv(source), ": ", Sv(problem)));
  };
  const auto unsupported = [&](std::string_view problem) {
    return absl::UnimplementedError(
        absl::StrCat("SentencePiece model ", Sv(source), ": ", Sv(problem)));
  };
  auto proto = SentencePieceModelProto::Parse(model_bytes);
  if (!proto.ok()) return error(std::string(proto.status().message()));
  if (proto->pieces.empty()) return error("field `pieces` is empty");
  const SentencePieceModelProto::TrainerSpec& trainer = proto->trainer_spec;
  if (trainer.model_type != SentencePieceModelProto::ModelType::kBpe) {
    return unsupported(absl::StrCat("field `trainer_spec.model_type` is ",
                                    static_cast<int>(trainer.model_type),
                                    "; only BPE (2) models are supported"));
  }
  if (trainer.treat_whitespace_as_suffix) {
    return unsupported("field `trainer_spec.treat_whitespace_as_suffix` is not supported");
  }
  if (!proto->normalizer_spec.precompiled_charmap.empty()) {
    return unsupported(absl::StrCat("field `normalizer_spec.precompiled_charmap` (rule \"",
                                    proto->normalizer_spec.name,
                                    "\") is not supported; only identity normalisation is"));
  }

  auto tokenizer = std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer());
  SentencePieceTokenizer& t = *tokenizer;
  t.source_ = std::string(source);
  t.pieces_ = std::move(proto->pieces);
  t.byte_fallback_ = trainer.byte_fallback;
  t.unk_surface_ = trainer.unk_surface;
  t.normalizer_ = proto->normalizer_spec;
  t.byte_ids_.fill(-1);
  std::optional<int32_t> unk_id;
  for (int32_t id = 0; id < static_cast<int32_t>(t.pieces_.size()); ++id) {
    const auto& piece = t.pieces_[id];
    if (piece.piece.empty()) return error(absl::StrCat("piece ", id, " is empty"));
    bool inserted = false;
    switch (piece.type) {
      case PieceType::kNormal:
      case PieceType::kUnused:
        inserted = t.mergeable_ids_.emplace(piece.piece, id).second;
        break;
      case PieceType::kUserDefined:
        inserted = t.mergeable_ids_.emplace(piece.piece, id).second;
        t.user_defined_.push_back(piece.piece);
        break;
      case PieceType::kUnknown:
        if (unk_id.has_value()) return error("more than one UNKNOWN piece");
        unk_id = id;
        inserted = t.reserved_ids_.emplace(piece.piece, id).second;
        break;
      case PieceType::kControl:
        inserted = t.reserved_ids_.emplace(piece.piece, id).second;
        break;
      case PieceType::kByte: {
        const int byte = ParseBytePiece(piece.piece);
        if (byte < 0) {
          return error(
              absl::StrCat("BYTE piece ", id, " is \"", piece.piece, "\", not of the form <0xAB>"));
        }
        t.byte_ids_[byte] = id;
        inserted = t.reserved_ids_.emplace(piece.piece, id).second;
        break;
      }
      default:
        return error(
            absl::StrCat("piece ", id, " has unknown type ", static_cast<int>(piece.type)));
    }
    if (!inserted) return error(absl::StrCat("piece \"", piece.piece, "\" appears twice"));
  }
  if (!unk_id.has_value()) return error("no UNKNOWN piece (e.g. <unk>)");
  t.unk_id_ = *unk_id;
  std::stable_sort(t.user_defined_.begin(), t.user_defined_.end(),
                   [](const std::string& a, const std::string& b) { return a.size() > b.size(); });

  // As SentencePieceProcessor: BOS/EOS are the control pieces spelled as the trainer named them.
  const auto control_id = [&](const std::string& spelling) -> std::optional<int32_t> {
    const auto it = t.reserved_ids_.find(spelling);
    if (it == t.reserved_ids_.end() || t.pieces_[it->second].type != PieceType::kControl) {
      return std::nullopt;
    }
    return it->second;
  };
  t.bos_id_ = control_id(trainer.bos_piece);
  t.eos_id_ = control_id(trainer.eos_piece);

  // "<unk>" is not a control piece but Hugging Face treats it as special all the same.
  for (int32_t id = 0; id < static_cast<int32_t>(t.pieces_.size()); ++id) {
    const PieceType type = t.pieces_[id].type;
    if (type == PieceType::kControl || type == PieceType::kUnknown) {
      t.special_pieces_.emplace_back(t.pieces_[id].piece, id);
    }
  }
  std::stable_sort(t.special_pieces_.begin(), t.special_pieces_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return tokenizer;
}

std::string SentencePieceTokenizer::Normalize(std::string_view text) const {
  const bool remove_extra = normalizer_.remove_extra_whitespaces;
  const std::string_view space = normalizer_.escape_whitespaces ? kSpaceSymbol : " ";
  if (remove_extra) {
    while (text.starts_with(' ')) text.remove_prefix(1);
  }
  if (text.empty()) return "";
  std::string out;
  out.reserve(text.size() + text.size() / 2 + 3);
  if (normalizer_.add_dummy_prefix) out.append(space);
  // The dummy prefix counts as a preceding space when collapsing runs of spaces.
  bool previous_space = remove_extra;
  for (const char c : text) {
    if (c == ' ') {
      if (previous_space) continue;
      out.append(space);
      previous_space = remove_extra;
    } else {
      out.push_back(c);
      previous_space = false;
    }
  }
  if (remove_extra) {
    while (out.ends_with(space)) out.resize(out.size() - space.size());
  }
  return out;
}

size_t SentencePieceTokenizer::MatchUserDefined(std::string_view text) const {
  for (const std::string& piece : user_defined_) {
    if (text.starts_with(piece)) return piece.size();
  }
  return 0;
}

int32_t SentencePieceTokenizer::LookUp(std::string_view piece) const {
  const std::string key(piece);
  if (const auto it = mergeable_ids_.find(key); it != mergeable_ids_.end()) return it->second;
  if (const auto it = reserved_ids_.find(key); it != reserved_ids_.end()) return it->second;
  return unk_id_;
}

void SentencePieceTokenizer::EncodeNormalized(std::string_view normalized,
                                              std::vector<int32_t>& ids) const {
  // Symbols are spans of `normalized` in a linked list; a merge extends the left span over
  // the right one. User-defined pieces are frozen: they never merge.
  struct Symbol {
    size_t begin;
    size_t size;
    int64_t prev;
    int64_t next;
    bool frozen;
  };
  std::vector<Symbol> symbols;
  for (size_t pos = 0; pos < normalized.size();) {
    size_t length = MatchUserDefined(normalized.substr(pos));
    const bool frozen = length > 0;
    if (!frozen) utf8::DecodeAt(normalized, pos, &length);
    const auto index = static_cast<int64_t>(symbols.size());
    symbols.push_back({pos, length, index - 1, -1, frozen});
    if (index > 0) symbols[index - 1].next = index;
    pos += length;
  }
  const auto text_of = [&](const Symbol& s) { return normalized.substr(s.begin, s.size); };

  // Candidate merges, best score first and leftmost among equals, as SentencePiece orders
  // them. A candidate is stale once either side has changed size.
  struct Candidate {
    float score;
    int64_t left;
    int64_t right;
    size_t size;
    bool operator<(const Candidate& other) const {
      return score != other.score ? score < other.score : left > other.left;
    }
  };
  std::priority_queue<Candidate> agenda;
  // Merged UNUSED pieces, to split back into their parts afterwards.
  std::unordered_map<std::string, std::pair<std::string, std::string>> unused_parts;
  const auto consider = [&](int64_t left, int64_t right) {
    if (left < 0 || right < 0 || symbols[left].frozen || symbols[right].frozen) return;
    const std::string_view merged =
        normalized.substr(symbols[left].begin, symbols[left].size + symbols[right].size);
    const auto it = mergeable_ids_.find(std::string(merged));
    if (it == mergeable_ids_.end()) return;
    agenda.push({pieces_[it->second].score, left, right, merged.size()});
    if (pieces_[it->second].type == PieceType::kUnused) {
      unused_parts[std::string(merged)] = {std::string(text_of(symbols[left])),
                                           std::string(text_of(symbols[right]))};
    }
  };
  for (size_t i = 1; i < symbols.size(); ++i) consider(i - 1, i);
  while (!agenda.empty()) {
    const Candidate top = agenda.top();
    agenda.pop();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    if (left.size == 0 || right.size == 0 || left.size + right.size != top.size) continue;
    left.size += right.size;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    right.size = 0;
    consider(left.prev, top.left);
    consider(top.left, left.next);
  }

  // Without byte fallback, a run of unknown symbols becomes one <unk>, as in SentencePiece.
  bool previous_unknown = false;
  const auto emit = [&](auto&& self, std::string_view piece) -> void {
    const int32_t id = LookUp(piece);
    if (pieces_[id].type == PieceType::kUnused) {
      if (const auto it = unused_parts.find(std::string(piece)); it != unused_parts.end()) {
        self(self, it->second.first);
        self(self, it->second.second);
        return;
      }
    }
    if (id == unk_id_ && byte_fallback_) {
      for (const char c : piece) {
        const int32_t byte_id = byte_ids_[static_cast<unsigned char>(c)];
        ids.push_back(byte_id >= 0 ? byte_id : unk_id_);
      }
      return;
    }
    const bool unknown = id == unk_id_;
    if (!(unknown && previous_unknown)) ids.push_back(id);
    previous_unknown = unknown;
  };
  for (int64_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    emit(emit, text_of(symbols[i]));
  }
}

absl::StatusOr<std::vector<int32_t>> SentencePieceTokenizer::Encode(std::string_view text,
                                                                    bool parse_special) const {
  if (!utf8::IsValid(text)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SentencePiece model ", source_, ": text to encode is not valid UTF-8"));
  }
  std::vector<int32_t> ids;
  const auto encode_plain = [&](std::string_view plain) {
    const std::string normalized = Normalize(plain);
    if (!normalized.empty()) EncodeNormalized(normalized, ids);
  };
  if (!parse_special) {
    encode_plain(text);
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
    encode_plain(text.substr(plain_start, pos - plain_start));
    ids.push_back(match->second);
    pos += match->first.size();
    plain_start = pos;
  }
  encode_plain(text.substr(plain_start));
  return ids;
}

absl::StatusOr<std::string> SentencePieceTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string text;
  std::string pending_bytes;
  // Byte pieces accumulate so that a character split over several of them decodes whole; an
  // invalid byte becomes U+FFFD on its own, as in SentencePiece.
  const auto flush_bytes = [&] {
    text += utf8::ToValidLossy(pending_bytes, /*replace_each_byte=*/true);
    pending_bytes.clear();
  };
  // The dummy prefix is the leading space of the first piece that has one. With
  // remove_extra_whitespaces the text cannot start with a space, so SentencePiece strips the
  // leading space of every piece until some text has come out.
  bool expect_prefix = true;
  bool prefix_seen = false;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("SentencePiece model ", source_, ": token id ",
                                                     id, " is outside [0, ", vocab_size(), ")"));
    }
    const auto& piece = pieces_[id];
    if (piece.type == PieceType::kByte) {
      pending_bytes.push_back(static_cast<char>(ParseBytePiece(piece.piece)));
      continue;
    }
    flush_bytes();
    if (prefix_seen || !text.empty()) expect_prefix = false;
    prefix_seen = false;
    if (piece.type == PieceType::kControl) continue;
    if (piece.type == PieceType::kUnknown) {
      text += unk_surface_;
      continue;
    }
    std::string_view surface = piece.piece;
    if (expect_prefix && (normalizer_.add_dummy_prefix || normalizer_.remove_extra_whitespaces) &&
        surface.starts_with(kSpaceSymbol)) {
      surface.remove_prefix(kSpaceSymbol.size());
      prefix_seen = !normalizer_.remove_extra_whitespaces;
    }
    text += ReplaceSpaceSymbols(surface);
  }
  flush_bytes();
  return text;
}

int32_t SentencePieceTokenizer::vocab_size() const { return static_cast<int32_t>(pieces_.size()); }

std::optional<int32_t> SentencePieceTokenizer::bos_id() const { return bos_id_; }
std::optional<int32_t> SentencePieceTokenizer::eos_id() const { return eos_id_; }

std::optional<int32_t> SentencePieceTokenizer::PieceToId(std::string_view piece) const {
  const std::string key(piece);
  if (const auto it = mergeable_ids_.find(key); it != mergeable_ids_.end()) return it->second;
  if (const auto it = reserved_ids_.find(key); it != reserved_ids_.end()) return it->second;
  return std::nullopt;
}

}  // namespace tophat
