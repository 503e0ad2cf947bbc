#include "models/sentencepiece_model_proto.h"

#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tophat {
namespace {

// Protobuf wire types.
constexpr int kVarint = 0;
constexpr int kFixed64 = 1;
constexpr int kLengthDelimited = 2;
constexpr int kFixed32 = 5;

class WireReader {
 public:
  explicit WireReader(std::string_view data) : data_(data) {}

  bool done() const { return pos_ >= data_.size(); }

  bool ReadVarint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) return false;
      const auto byte = static_cast<uint8_t>(data_[pos_++]);
      *value |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  bool ReadTag(int* field, int* wire_type) {
    uint64_t tag = 0;
    if (!ReadVarint(&tag) || (tag >> 3) == 0 || (tag >> 3) > (uint64_t{1} << 29)) return false;
    *field = static_cast<int>(tag >> 3);
    *wire_type = static_cast<int>(tag & 7);
    return true;
  }

  bool ReadBytes(std::string_view* bytes) {
    uint64_t length = 0;
    if (!ReadVarint(&length) || length > data_.size() - pos_) return false;
    *bytes = data_.substr(pos_, length);
    pos_ += length;
    return true;
  }

  bool ReadFloat(float* value) {
    if (data_.size() - pos_ < 4) return false;
    // The wire format is little-endian, as is every platform tophat builds for.
    std::memcpy(value, data_.data() + pos_, 4);
    pos_ += 4;
    return true;
  }

  bool Skip(int wire_type) {
    uint64_t ignored = 0;
    std::string_view ignored_bytes;
    switch (wire_type) {
      case kVarint:
        return ReadVarint(&ignored);
      case kFixed64:
        if (data_.size() - pos_ < 8) return false;
        pos_ += 8;
        return true;
      case kLengthDelimited:
        return ReadBytes(&ignored_bytes);
      case kFixed32:
        if (data_.size() - pos_ < 4) return false;
        pos_ += 4;
        return true;
      default:  // Groups are long deprecated and absent from SentencePiece models.
        return false;
    }
  }

 private:
  std::string_view data_;
  size_t pos_ = 0;
};

class WireWriter {
 public:
  void Varint(uint64_t value) {
    while (value >= 0x80) {
      out_.push_back(static_cast<char>((value & 0x7F) | 0x80));
      value >>= 7;
    }
    out_.push_back(static_cast<char>(value));
  }
  void Tag(int field, int wire_type) { Varint((static_cast<uint64_t>(field) << 3) | wire_type); }
  void Bytes(int field, std::string_view bytes) {
    Tag(field, kLengthDelimited);
    Varint(bytes.size());
    out_.append(bytes);
  }
  // int32 and enum fields: negatives are sign-extended to ten bytes, as protobuf does.
  void Int(int field, int64_t value) {
    Tag(field, kVarint);
    Varint(static_cast<uint64_t>(value));
  }
  void Bool(int field, bool value) { Int(field, value ? 1 : 0); }
  void Float(int field, float value) {
    Tag(field, kFixed32);
    char bytes[4];
    std::memcpy(bytes, &value, 4);
    out_.append(bytes, 4);
  }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

// Field numbers of sentencepiece_model.proto.
namespace model_field {
constexpr int kPieces = 1;
constexpr int kTrainerSpec = 2;
constexpr int kNormalizerSpec = 3;
}  // namespace model_field
namespace piece_field {
constexpr int kPiece = 1;
constexpr int kScore = 2;
constexpr int kType = 3;
}  // namespace piece_field
namespace trainer_field {
constexpr int kModelType = 3;
constexpr int kVocabSize = 4;
constexpr int kCharacterCoverage = 10;
constexpr int kNumThreads = 16;
constexpr int kShuffleInputSentence = 19;
constexpr int kMaxSentencepieceLength = 20;
constexpr int kTreatWhitespaceAsSuffix = 24;
constexpr int kSplitDigits = 25;
constexpr int kAllowWhitespaceOnlyPieces = 26;
constexpr int kByteFallback = 35;
constexpr int kUnkId = 40;
constexpr int kBosId = 41;
constexpr int kEosId = 42;
constexpr int kPadId = 43;
constexpr int kUnkSurface = 44;
constexpr int kUnkPiece = 45;
constexpr int kBosPiece = 46;
constexpr int kEosPiece = 47;
constexpr int kPadPiece = 48;
}  // namespace trainer_field
namespace normalizer_field {
constexpr int kName = 1;
constexpr int kPrecompiledCharmap = 2;
constexpr int kAddDummyPrefix = 3;
constexpr int kRemoveExtraWhitespaces = 4;
constexpr int kEscapeWhitespaces = 5;
}  // namespace normalizer_field

absl::Status Malformed(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed SentencePiece ModelProto: ",
                                                 absl::string_view(what.data(), what.size())));
}

// Calls `on_field(field, wire_type, reader)` for each field of `message`; the callback
// consumes the value and returns false on malformed data.
template <typename OnField>
absl::Status ForEachField(std::string_view message, std::string_view name, OnField&& on_field) {
  WireReader reader(message);
  while (!reader.done()) {
    int field = 0;
    int wire_type = 0;
    if (!reader.ReadTag(&field, &wire_type) || !on_field(field, wire_type, reader)) {
      return Malformed(name);
    }
  }
  return absl::OkStatus();
}

bool ReadInt32(WireReader& reader, int wire_type, int32_t* value) {
  uint64_t raw = 0;
  if (wire_type != kVarint || !reader.ReadVarint(&raw)) return false;
  *value = static_cast<int32_t>(static_cast<int64_t>(raw));
  return true;
}

bool ReadBool(WireReader& reader, int wire_type, bool* value) {
  uint64_t raw = 0;
  if (wire_type != kVarint || !reader.ReadVarint(&raw)) return false;
  *value = raw != 0;
  return true;
}

bool ReadString(WireReader& reader, int wire_type, std::string* value) {
  std::string_view bytes;
  if (wire_type != kLengthDelimited || !reader.ReadBytes(&bytes)) return false;
  *value = std::string(bytes);
  return true;
}

absl::Status ParsePiece(std::string_view message, SentencePieceModelProto::Piece& piece) {
  return ForEachField(message, "pieces", [&](int field, int wire_type, WireReader& reader) {
    switch (field) {
      case piece_field::kPiece:
        return ReadString(reader, wire_type, &piece.piece);
      case piece_field::kScore:
        return wire_type == kFixed32 && reader.ReadFloat(&piece.score);
      case piece_field::kType: {
        int32_t type = 0;
        if (!ReadInt32(reader, wire_type, &type)) return false;
        piece.type = static_cast<SentencePieceModelProto::PieceType>(type);
        return true;
      }
      default:
        return reader.Skip(wire_type);
    }
  });
}

absl::Status ParseTrainerSpec(std::string_view message,
                              SentencePieceModelProto::TrainerSpec& spec) {
  return ForEachField(message, "trainer_spec", [&](int field, int wire_type, WireReader& reader) {
    switch (field) {
      case trainer_field::kModelType: {
        int32_t type = 0;
        if (!ReadInt32(reader, wire_type, &type)) return false;
        spec.model_type = static_cast<SentencePieceModelProto::ModelType>(type);
        return true;
      }
      case trainer_field::kVocabSize:
        return ReadInt32(reader, wire_type, &spec.vocab_size);
      case trainer_field::kTreatWhitespaceAsSuffix:
        return ReadBool(reader, wire_type, &spec.treat_whitespace_as_suffix);
      case trainer_field::kByteFallback:
        return ReadBool(reader, wire_type, &spec.byte_fallback);
      case trainer_field::kUnkId:
        return ReadInt32(reader, wire_type, &spec.unk_id);
      case trainer_field::kBosId:
        return ReadInt32(reader, wire_type, &spec.bos_id);
      case trainer_field::kEosId:
        return ReadInt32(reader, wire_type, &spec.eos_id);
      case trainer_field::kPadId:
        return ReadInt32(reader, wire_type, &spec.pad_id);
      case trainer_field::kUnkSurface:
        return ReadString(reader, wire_type, &spec.unk_surface);
      case trainer_field::kUnkPiece:
        return ReadString(reader, wire_type, &spec.unk_piece);
      case trainer_field::kBosPiece:
        return ReadString(reader, wire_type, &spec.bos_piece);
      case trainer_field::kEosPiece:
        return ReadString(reader, wire_type, &spec.eos_piece);
      case trainer_field::kPadPiece:
        return ReadString(reader, wire_type, &spec.pad_piece);
      default:
        return reader.Skip(wire_type);
    }
  });
}

absl::Status ParseNormalizerSpec(std::string_view message,
                                 SentencePieceModelProto::NormalizerSpec& spec) {
  return ForEachField(message, "normalizer_spec",
                      [&](int field, int wire_type, WireReader& reader) {
                        switch (field) {
                          case normalizer_field::kName:
                            return ReadString(reader, wire_type, &spec.name);
                          case normalizer_field::kPrecompiledCharmap:
                            return ReadString(reader, wire_type, &spec.precompiled_charmap);
                          case normalizer_field::kAddDummyPrefix:
                            return ReadBool(reader, wire_type, &spec.add_dummy_prefix);
                          case normalizer_field::kRemoveExtraWhitespaces:
                            return ReadBool(reader, wire_type, &spec.remove_extra_whitespaces);
                          case normalizer_field::kEscapeWhitespaces:
                            return ReadBool(reader, wire_type, &spec.escape_whitespaces);
                          default:
                            return reader.Skip(wire_type);
                        }
                      });
}

}  // namespace

absl::StatusOr<SentencePieceModelProto> SentencePieceModelProto::Parse(std::string_view bytes) {
  SentencePieceModelProto proto;
  std::string_view trainer_spec;
  std::string_view normalizer_spec;
  std::vector<std::string_view> pieces;
  absl::Status status =
      ForEachField(bytes, "ModelProto", [&](int field, int wire_type, WireReader& reader) {
        std::string_view* target = nullptr;
        std::string_view piece;
        switch (field) {
          case model_field::kPieces:
            target = &piece;
            break;
          case model_field::kTrainerSpec:
            target = &trainer_spec;
            break;
          case model_field::kNormalizerSpec:
            target = &normalizer_spec;
            break;
          default:
            return reader.Skip(wire_type);
        }
        if (wire_type != kLengthDelimited || !reader.ReadBytes(target)) return false;
        if (field == model_field::kPieces) pieces.push_back(piece);
        return true;
      });
  if (!status.ok()) return status;
  proto.pieces.resize(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (status = ParsePiece(pieces[i], proto.pieces[i]); !status.ok()) return status;
  }
  if (status = ParseTrainerSpec(trainer_spec, proto.trainer_spec); !status.ok()) return status;
  if (status = ParseNormalizerSpec(normalizer_spec, proto.normalizer_spec); !status.ok()) {
    return status;
  }
  return proto;
}

std::string SentencePieceModelProto::Serialize() const {
  WireWriter model;
  for (const Piece& piece : pieces) {
    WireWriter message;
    message.Bytes(piece_field::kPiece, piece.piece);
    message.Float(piece_field::kScore, piece.score);
    if (piece.type != PieceType::kNormal) {
      message.Int(piece_field::kType, static_cast<int>(piece.type));
    }
    model.Bytes(model_field::kPieces, message.str());
  }

  WireWriter trainer;
  const TrainerSpec& t = trainer_spec;
  trainer.Int(trainer_field::kModelType, static_cast<int>(t.model_type));
  trainer.Int(trainer_field::kVocabSize, t.vocab_size);
  trainer.Float(trainer_field::kCharacterCoverage, t.character_coverage);
  trainer.Int(trainer_field::kNumThreads, t.num_threads);
  trainer.Bool(trainer_field::kShuffleInputSentence, t.shuffle_input_sentence);
  trainer.Int(trainer_field::kMaxSentencepieceLength, t.max_sentencepiece_length);
  trainer.Bool(trainer_field::kTreatWhitespaceAsSuffix, t.treat_whitespace_as_suffix);
  trainer.Bool(trainer_field::kSplitDigits, t.split_digits);
  trainer.Bool(trainer_field::kAllowWhitespaceOnlyPieces, t.allow_whitespace_only_pieces);
  trainer.Bool(trainer_field::kByteFallback, t.byte_fallback);
  trainer.Int(trainer_field::kUnkId, t.unk_id);
  trainer.Int(trainer_field::kBosId, t.bos_id);
  trainer.Int(trainer_field::kEosId, t.eos_id);
  trainer.Int(trainer_field::kPadId, t.pad_id);
  trainer.Bytes(trainer_field::kUnkSurface, t.unk_surface);
  trainer.Bytes(trainer_field::kUnkPiece, t.unk_piece);
  trainer.Bytes(trainer_field::kBosPiece, t.bos_piece);
  trainer.Bytes(trainer_field::kEosPiece, t.eos_piece);
  trainer.Bytes(trainer_field::kPadPiece, t.pad_piece);
  model.Bytes(model_field::kTrainerSpec, trainer.str());

  WireWriter normalizer;
  const NormalizerSpec& n = normalizer_spec;
  normalizer.Bytes(normalizer_field::kName, n.name);
  normalizer.Bytes(normalizer_field::kPrecompiledCharmap, n.precompiled_charmap);
  normalizer.Bool(normalizer_field::kAddDummyPrefix, n.add_dummy_prefix);
  normalizer.Bool(normalizer_field::kRemoveExtraWhitespaces, n.remove_extra_whitespaces);
  normalizer.Bool(normalizer_field::kEscapeWhitespaces, n.escape_whitespaces);
  model.Bytes(model_field::kNormalizerSpec, normalizer.str());

  return std::move(model.str());
}

}  // namespace tophat
