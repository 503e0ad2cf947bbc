#include "models/grammar/json_grammar.h"

namespace tophat {
namespace {

constexpr std::string_view kLiterals[] = {"true", "false", "null"};

bool IsWhitespace(unsigned char byte) {
  return byte == ' ' || byte == '\t' || byte == '\n' || byte == '\r';
}
bool IsDigit(unsigned char byte) { return byte >= '0' && byte <= '9'; }
int HexValue(unsigned char byte) {
  if (byte >= '0' && byte <= '9') return byte - '0';
  if (byte >= 'a' && byte <= 'f') return byte - 'a' + 10;
  if (byte >= 'A' && byte <= 'F') return byte - 'A' + 10;
  return -1;
}

}  // namespace

bool JsonGrammar::Feed(std::string_view bytes) {
  for (const char c : bytes) {
    if (!Feed(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool JsonGrammar::NumberContinues(unsigned char byte) const {
  switch (mode_) {
    case Mode::kNumberZero:
    case Mode::kNumberInteger:
    case Mode::kNumberFraction:
    case Mode::kNumberExponent:
      return (IsDigit(byte) && mode_ != Mode::kNumberZero) ||
             (byte == '.' && (mode_ == Mode::kNumberZero || mode_ == Mode::kNumberInteger)) ||
             ((byte == 'e' || byte == 'E') && mode_ != Mode::kNumberExponent);
    default:
      return false;
  }
}

bool JsonGrammar::Feed(unsigned char byte) {
  // A number goes on while its bytes fit; any other byte ends it and is read after it.
  switch (mode_) {
    case Mode::kNumberZero:
    case Mode::kNumberInteger:
    case Mode::kNumberFraction:
    case Mode::kNumberExponent:
      if (!NumberContinues(byte)) {
        mode_ = Mode::kAfterValue;
        break;
      }
      if (byte == '.') {
        mode_ = Mode::kNumberPoint;
      } else if (byte == 'e' || byte == 'E') {
        mode_ = Mode::kNumberE;
      }
      return true;
    default:
      break;
  }
  // Whitespace between tokens, in the modes that allow it, up to the run's limit.
  switch (mode_) {
    case Mode::kStart:
    case Mode::kKeyOrClose:
    case Mode::kKey:
    case Mode::kColon:
    case Mode::kValue:
    case Mode::kValueOrClose:
    case Mode::kAfterValue:
      if (IsWhitespace(byte)) return ++whitespace_ <= kMaxWhitespaceRun;
      whitespace_ = 0;
      break;
    default:
      break;
  }
  switch (mode_) {
    case Mode::kStart:
      return byte == '{' && Open(/*object=*/true);
    case Mode::kKeyOrClose:
      if (byte == '}') return Close(/*object=*/true);
      [[fallthrough]];
    case Mode::kKey:
      if (byte != '"') return false;
      mode_ = Mode::kString;
      key_ = true;
      return true;
    case Mode::kColon:
      if (byte != ':') return false;
      mode_ = Mode::kValue;
      return true;
    case Mode::kValueOrClose:
      if (byte == ']') return Close(/*object=*/false);
      return StartValue(byte);
    case Mode::kValue:
      return StartValue(byte);
    case Mode::kAfterValue:
      return AfterValue(byte);
    case Mode::kString:
      return StringByte(byte);
    case Mode::kUtf8:
      if (byte < low_ || byte > high_) return false;
      low_ = 0x80;
      high_ = 0xBF;
      if (--pending_ == 0) mode_ = Mode::kString;
      return true;
    case Mode::kEscape:
      switch (byte) {
        case '"':
        case '\\':
        case '/':
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't':
          mode_ = Mode::kString;
          return true;
        case 'u':
          mode_ = Mode::kHex;
          pending_ = 4;
          code_unit_ = 0;
          return true;
        default:
          return false;
      }
    case Mode::kHex: {
      const int digit = HexValue(byte);
      if (digit < 0) return false;
      code_unit_ = static_cast<uint16_t>(code_unit_ << 4 | digit);
      // Decided digit by digit, so that every prefix taken can still be completed: a low
      // surrogate (DC00-DFFF) where one must come, and only there.
      if (pending_ == 4 && low_surrogate_ && digit != 0xD) return false;
      if (pending_ == 3) {
        const bool low = code_unit_ >= 0xDC && code_unit_ <= 0xDF;
        if (low != low_surrogate_) return false;
      }
      if (--pending_ > 0) return true;
      // A surrogate stands only in a pair, high then low (what strict parsers accept).
      const bool high = code_unit_ >= 0xD800 && code_unit_ <= 0xDBFF;
      low_surrogate_ = false;
      code_unit_ = 0;  // equal states compare equal (JsonConstraint keeps masks by state)
      mode_ = high ? Mode::kSurrogateSlash : Mode::kString;
      return true;
    }
    case Mode::kSurrogateSlash:
      if (byte != '\\') return false;
      mode_ = Mode::kSurrogateU;
      return true;
    case Mode::kSurrogateU:
      if (byte != 'u') return false;
      mode_ = Mode::kHex;
      pending_ = 4;
      code_unit_ = 0;
      low_surrogate_ = true;
      return true;
    case Mode::kNumberMinus:
      if (!IsDigit(byte)) return false;
      mode_ = byte == '0' ? Mode::kNumberZero : Mode::kNumberInteger;
      return true;
    case Mode::kNumberPoint:
      if (!IsDigit(byte)) return false;
      mode_ = Mode::kNumberFraction;
      return true;
    case Mode::kNumberE:
      if (byte == '+' || byte == '-') {
        mode_ = Mode::kNumberExponentSign;
        return true;
      }
      [[fallthrough]];
    case Mode::kNumberExponentSign:
      if (!IsDigit(byte)) return false;
      mode_ = Mode::kNumberExponent;
      return true;
    case Mode::kLiteral: {
      const std::string_view literal = kLiterals[literal_];
      if (byte != static_cast<unsigned char>(literal[pending_])) return false;
      if (++pending_ == literal.size()) EndValue();
      return true;
    }
    case Mode::kDone:
      return false;
    case Mode::kNumberZero:
    case Mode::kNumberInteger:
    case Mode::kNumberFraction:
    case Mode::kNumberExponent:
      break;  // handled above: they became kAfterValue
  }
  return false;
}

bool JsonGrammar::StartValue(unsigned char byte) {
  switch (byte) {
    case '{':
      return Open(/*object=*/true);
    case '[':
      return Open(/*object=*/false);
    case '"':
      mode_ = Mode::kString;
      key_ = false;
      return true;
    case '-':
      mode_ = Mode::kNumberMinus;
      return true;
    case 't':
    case 'f':
    case 'n':
      mode_ = Mode::kLiteral;
      literal_ = byte == 't' ? 0 : byte == 'f' ? 1 : 2;
      pending_ = 1;
      return true;
    default:
      if (!IsDigit(byte)) return false;
      mode_ = byte == '0' ? Mode::kNumberZero : Mode::kNumberInteger;
      return true;
  }
}

bool JsonGrammar::Open(bool object) {
  if (depth_ == kMaxDepth) return false;
  const uint64_t bit = uint64_t{1} << depth_;
  stack_ = object ? stack_ | bit : stack_ & ~bit;
  ++depth_;
  mode_ = object ? Mode::kKeyOrClose : Mode::kValueOrClose;
  return true;
}

bool JsonGrammar::Close(bool object) {
  if (depth_ == 0 || top_is_object() != object) return false;
  --depth_;
  stack_ &= ~(uint64_t{1} << depth_);  // so equal states compare equal
  EndValue();
  return true;
}

void JsonGrammar::EndValue() {
  mode_ = depth_ == 0 ? Mode::kDone : Mode::kAfterValue;
  whitespace_ = 0;
  literal_ = 0;
  pending_ = 0;
}

bool JsonGrammar::AfterValue(unsigned char byte) {
  if (depth_ == 0) return false;
  const bool object = top_is_object();
  if (byte == ',') {
    mode_ = object ? Mode::kKey : Mode::kValue;
    return true;
  }
  if (byte == '}' || byte == ']') return Close(/*object=*/byte == '}');
  return false;
}

bool JsonGrammar::StringByte(unsigned char byte) {
  if (byte == '"') {
    if (key_) {
      mode_ = Mode::kColon;
      whitespace_ = 0;
    } else {
      EndValue();
    }
    return true;
  }
  if (byte == '\\') {
    mode_ = Mode::kEscape;
    return true;
  }
  if (byte < 0x20) return false;  // control characters must be escaped
  if (byte < 0x80) return true;
  // A multi-byte character's lead byte, and the range of its first continuation byte that
  // rules out overlong forms, surrogates and code points past U+10FFFF (RFC 3629).
  low_ = 0x80;
  high_ = 0xBF;
  if (byte >= 0xC2 && byte <= 0xDF) {
    pending_ = 1;
  } else if (byte >= 0xE0 && byte <= 0xEF) {
    pending_ = 2;
    if (byte == 0xE0) low_ = 0xA0;
    if (byte == 0xED) high_ = 0x9F;
  } else if (byte >= 0xF0 && byte <= 0xF4) {
    pending_ = 3;
    if (byte == 0xF0) low_ = 0x90;
    if (byte == 0xF4) high_ = 0x8F;
  } else {
    return false;
  }
  mode_ = Mode::kUtf8;
  return true;
}

}  // namespace tophat
