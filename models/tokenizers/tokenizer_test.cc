#include "models/tokenizers/tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include "base/test_util.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "models/tokenizers/bpe_tokenizer.h"
#include "models/tokenizers/sentencepiece_tokenizer.h"
#include "models/tokenizers/sentencepiece_trainer_util.h"
#include "models/tokenizers/spm_plugin_loader.h"
#include "models/tokenizers/test_tokenizer_json.h"
#include "nlohmann/json.hpp"

namespace tophat {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;
using testing::ReadBytes;
using testing::TempDir;
using testing::WriteBytes;
using namespace testing::tokenizer_json;  // NOLINT: the ids and builders below

constexpr const char* kUnicodeText = "héllo wörld 你好 🎩";

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}


std::unique_ptr<BpeTokenizer> MakeBpe(const Json& json) {
  auto tokenizer = BpeTokenizer::FromJson(json.dump(), "test/tokenizer.json");
  REQUIRE(tokenizer.ok());
  return *std::move(tokenizer);
}

std::vector<int32_t> EncodeOk(const Tokenizer& tokenizer, std::string_view text,
                              bool parse_special = false) {
  auto ids = tokenizer.Encode(text, parse_special);
  INFO(ids.status().ToString());
  REQUIRE(ids.ok());
  return *ids;
}

std::string DecodeOk(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  auto text = tokenizer.Decode(ids);
  INFO(text.status().ToString());
  REQUIRE(text.ok());
  return *text;
}

// Streams `ids` one at a time and checks the pieces add up to Decode(ids), never showing a
// replacement character for a character still being completed.
void CheckStreaming(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  StreamingDetokenizer stream(tokenizer);
  std::string streamed;
  for (const int32_t id : ids) {
    auto piece = stream.Push(id);
    REQUIRE(piece.ok());
    CHECK(piece->find("\xEF\xBF\xBD") == std::string::npos);
    streamed += *piece;
  }
  auto rest = stream.Flush();
  REQUIRE(rest.ok());
  streamed += *rest;
  CHECK(streamed == DecodeOk(tokenizer, ids));
}

std::string LetterName(int i) {
  static const char* const kSyllables[] = {"ka", "lo", "mi", "ne", "ru", "sa", "to", "vi"};
  std::string word;
  for (int n = i; word.empty() || n > 0; n /= 8) word += kSyllables[n % 8];
  return word;
}

// A few hundred sentences from a fixed recipe, with some non-ASCII words so that the trained
// model has multi-byte pieces.
std::vector<std::string> MakeCorpus() {
  static const char* const kWords[] = {"the",   "cat",   "sat",  "on",    "mat",   "dog",
                                       "héllo", "wörld", "你好", "quick", "brown", "fox"};
  std::vector<std::string> sentences;
  for (int i = 0; i < 300; ++i) {
    std::string sentence;
    for (int j = 0; j < 8; ++j) {
      if (j > 0) sentence += ' ';
      sentence += (i + j) % 5 == 0 ? LetterName(i * 3 + j) : kWords[(i * 7 + j * 13 + i * j) % 12];
    }
    sentence += " " + std::to_string(i) + ".";
    sentences.push_back(sentence);
  }
  return sentences;
}

constexpr int kSpmVocabSize = 320;

// The plugin loads in every build, sanitizer builds included (spm_plugin_loader.h).
void RequireSpmPlugin() {
  const absl::Status status = SpmPluginStatus();
  INFO(status.ToString());
  REQUIRE(status.ok());
}

// Trains once per process; the model is reused across test cases and removed at exit.
const fs::path& SpmModelDir() {
  static const TempDir dir;
  static const absl::Status status =
      TrainSentencePiece(MakeCorpus(), kSpmVocabSize, dir.path() / "tokenizer.model");
  INFO(status.ToString());
  REQUIRE(status.ok());
  return dir.path();
}

TEST_CASE("BPE encodes known ids", "[tokenizer]") {
  const auto tokenizer = MakeBpe(MakeTokenizerJson());
  CHECK(EncodeOk(*tokenizer, " the") == std::vector<int32_t>{kIdSpaceThe});
  CHECK(EncodeOk(*tokenizer, "the") == std::vector<int32_t>{'t', kIdHe});
  CHECK(EncodeOk(*tokenizer, "hello the") == std::vector<int32_t>{kIdHe, kIdLl, 'o', kIdSpaceThe});
  // "3 4" has the lowest rank, so it wins over "1 2" inside one GPT-2 pre-token.
  CHECK(EncodeOk(*tokenizer, "12345") == std::vector<int32_t>{kId12, kId34, '5'});
  // GPT-2's regex keeps contractions apart and leaves a space before a word attached to it.
  CHECK(EncodeOk(*tokenizer, "it's  the") ==
        std::vector<int32_t>{'i', 't', '\'', 's', ' ', kIdSpaceThe});
  CHECK(EncodeOk(*tokenizer, "").empty());
  // Bytes outside printable ASCII go through the byte-level alphabet.
  CHECK(EncodeOk(*tokenizer, "\n") == std::vector<int32_t>{'\n'});
  CHECK(EncodeOk(*tokenizer, "é") == std::vector<int32_t>{0xC3, 0xA9});
  CHECK(tokenizer->vocab_size() == kIdEndHeader + 1);
}

TEST_CASE("BPE round-trips ASCII and multi-byte UTF-8", "[tokenizer]") {
  const auto tokenizer = MakeBpe(MakeTokenizerJson());
  for (const std::string& text :
       {std::string("Hello, the world!\n\tTabs  and   spaces 12345 it's"),
        std::string(kUnicodeText), std::string("  leading and trailing  "),
        std::string("\x01\x7F control bytes")}) {
    CHECK(DecodeOk(*tokenizer, EncodeOk(*tokenizer, text)) == text);
  }
}

TEST_CASE("BPE maps ids to decoded text and checks them", "[tokenizer]") {
  const auto tokenizer = MakeBpe(MakeTokenizerJson());
  CHECK(DecodeOk(*tokenizer, {kIdSpaceThe, kIdHe}) == " thehe");
  // Half of "你" (E4 BD A0) is ill-formed on its own and shows as one replacement character.
  CHECK(DecodeOk(*tokenizer, {0xE4, 0xBD}) == "\xEF\xBF\xBD");
  CHECK(DecodeOk(*tokenizer, {0xE4, 0xBD, 0xA0}) == "你");
  CHECK_FALSE(tokenizer->Decode({-1}).ok());
  const auto out_of_range = tokenizer->Decode({kIdEndHeader + 1});
  REQUIRE_FALSE(out_of_range.ok());
  CHECK(absl::IsInvalidArgument(out_of_range.status()));
  CHECK_FALSE(tokenizer->Encode("\xFF invalid").ok());
}

TEST_CASE("BPE special tokens are parsed only when asked", "[tokenizer]") {
  const auto tokenizer = MakeBpe(MakeTokenizerJson());
  const std::string text = "<|begin_of_text|> the<|eot_id|>";
  CHECK(EncodeOk(*tokenizer, text, /*parse_special=*/true) ==
        std::vector<int32_t>{kIdBeginOfText, kIdSpaceThe, kIdEotId});

  const std::vector<int32_t> plain = EncodeOk(*tokenizer, text, /*parse_special=*/false);
  for (const int32_t id : {kIdBeginOfText, kIdEotId, kIdEndOfText}) {
    CHECK(std::find(plain.begin(), plain.end(), id) == plain.end());
  }
  CHECK(DecodeOk(*tokenizer, plain) == text);

  // Decode drops special tokens but keeps non-special added ones; the latter always match.
  CHECK(DecodeOk(*tokenizer, {kIdBeginOfText, kIdSpaceThe, kIdEotId}) == " the");
  CHECK(EncodeOk(*tokenizer, "a<tag>b") == std::vector<int32_t>{'a', kIdUserTag, 'b'});
  CHECK(DecodeOk(*tokenizer, {'a', kIdUserTag, 'b'}) == "a<tag>b");

  CHECK(tokenizer->bos_id() == kIdBeginOfText);
  CHECK(tokenizer->eos_id() == kIdEndOfText);
  CHECK(tokenizer->PieceToId("<|eot_id|>") == kIdEotId);
  CHECK(tokenizer->PieceToId(ByteSymbol(' ') + "the") == kIdSpaceThe);
  CHECK(tokenizer->PieceToId("not a piece") == std::nullopt);
}

TEST_CASE("BPE longest added token wins", "[tokenizer]") {
  Json json = MakeTokenizerJson();
  json["added_tokens"].push_back({{"id", 300}, {"content", "<tag>x"}, {"special", true}});
  const auto tokenizer = MakeBpe(json);
  CHECK(EncodeOk(*tokenizer, "<tag>x", true) == std::vector<int32_t>{300});
  // A special token that is not parsed leaves room for the non-special one inside it.
  CHECK(EncodeOk(*tokenizer, "<tag>x", false) == std::vector<int32_t>{kIdUserTag, 'x'});
}

TEST_CASE("BPE with Llama-3 style Split and ByteLevel pre-tokenizer", "[tokenizer]") {
  const auto tokenizer = MakeBpe(MakeTokenizerJson(/*llama3=*/true));
  // \p{N}{1,3} splits digits in threes, so "3 4" never meets.
  CHECK(EncodeOk(*tokenizer, "12345") == std::vector<int32_t>{kId123, kId45});
  CHECK(EncodeOk(*tokenizer, " the") == std::vector<int32_t>{kIdSpaceThe});
  // Case-insensitive contractions: "'S" is its own pre-token.
  CHECK(EncodeOk(*tokenizer, "IT'S") == std::vector<int32_t>{'I', 'T', '\'', 'S'});
  // ignore_merges takes a whole pre-token found in the vocabulary as is.
  CHECK(EncodeOk(*tokenizer, "abc") == std::vector<int32_t>{kIdAbc});
  for (const std::string& text :
       {std::string("Line one.\n\nLine 2: 1234567 IT'S ok?!  "), std::string(kUnicodeText)}) {
    CHECK(DecodeOk(*tokenizer, EncodeOk(*tokenizer, text)) == text);
  }

  // Without ignore_merges, "abc" has no merge path.
  Json json = MakeTokenizerJson(true);
  json["model"]["ignore_merges"] = false;
  CHECK(EncodeOk(*MakeBpe(json), "abc") == std::vector<int32_t>{'a', 'b', 'c'});
}

TEST_CASE("BPE ByteLevel add_prefix_space and NFC normalizer", "[tokenizer]") {
  Json json = MakeTokenizerJson();
  json["pre_tokenizer"]["add_prefix_space"] = true;
  json["normalizer"] = {{"type", "NFC"}};
  const auto tokenizer = MakeBpe(json);
  CHECK(EncodeOk(*tokenizer, "the") == std::vector<int32_t>{kIdSpaceThe});
  CHECK(EncodeOk(*tokenizer, " the") == std::vector<int32_t>{kIdSpaceThe});
}

TEST_CASE("BPE encodes concurrently", "[tokenizer]") {
  const auto tokenizer = MakeBpe(MakeTokenizerJson());
  const std::string text = std::string(kUnicodeText) + " the hello 12345";
  const std::vector<int32_t> expected = EncodeOk(*tokenizer, text);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto ids = tokenizer->Encode(text);
        if (!ids.ok() || *ids != expected) ++mismatches;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(mismatches == 0);
}

TEST_CASE("BPE rejects malformed and unsupported files", "[tokenizer]") {
  const auto expect_error = [](const std::string& text, absl::StatusCode code,
                               const std::string& mention) {
    auto tokenizer = BpeTokenizer::FromJson(text, "ckpt/tokenizer.json");
    REQUIRE_FALSE(tokenizer.ok());
    INFO(tokenizer.status().ToString());
    CHECK(tokenizer.status().code() == code);
    const std::string message(tokenizer.status().message());
    CHECK(message.find("ckpt/tokenizer.json") != std::string::npos);
    CHECK(message.find(mention) != std::string::npos);
  };
  const auto invalid = absl::StatusCode::kInvalidArgument;
  expect_error("{\"model\": ", invalid, "JSON");
  expect_error("[1, 2]", invalid, "root");

  Json json = MakeTokenizerJson();
  json.erase("model");
  expect_error(json.dump(), invalid, "`model`");

  for (const char* type : {"WordPiece", "Unigram"}) {
    json = MakeTokenizerJson();
    json["model"]["type"] = type;
    expect_error(json.dump(), invalid, "`model.type`");
  }
  json = MakeTokenizerJson();
  json["model"]["merges"].push_back("q z");
  expect_error(json.dump(), invalid, "`model.merges[8]`");
  json = MakeTokenizerJson();
  json["model"]["vocab"]["x"] = "seven";
  expect_error(json.dump(), invalid, "model.vocab");
  json = MakeTokenizerJson();
  json["added_tokens"][0].erase("id");
  expect_error(json.dump(), invalid, "`added_tokens[0].id`");
  json = MakeTokenizerJson(true);
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_error(json.dump(), invalid, "pre_tokenizer.pretokenizers[0].pattern.Regex");

  // Well-formed but not byte-level: Unimplemented, which lets Load fall back to
  // tokenizer.model.
  json = MakeTokenizerJson();
  json["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}};
  expect_error(json.dump(), absl::StatusCode::kUnimplemented, "pre_tokenizer.type");
  json = MakeTokenizerJson();
  json["decoder"] = {{"type", "ByteFallback"}};
  expect_error(json.dump(), absl::StatusCode::kUnimplemented, "decoder.type");
}

TEST_CASE("Tokenizer::Load picks the file and reads tokenizer_config.json", "[tokenizer]") {
  TempDir dir;
  auto missing = Tokenizer::Load(dir.path());
  REQUIRE_FALSE(missing.ok());
  CHECK(absl::IsNotFound(missing.status()));

  WriteBytes(dir.path() / "tokenizer.json", MakeTokenizerJson(true).dump());
  auto loaded = Tokenizer::Load(dir.path());
  REQUIRE(loaded.ok());
  CHECK((*loaded)->eos_id() == kIdEndOfText);

  WriteBytes(dir.path() / "tokenizer_config.json",
            R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}})");
  loaded = Tokenizer::Load(dir.path());
  REQUIRE(loaded.ok());
  CHECK((*loaded)->bos_id() == kIdBeginOfText);
  CHECK((*loaded)->eos_id() == kIdEotId);

  WriteBytes(dir.path() / "tokenizer.json", "{ not json");
  loaded = Tokenizer::Load(dir.path());
  REQUIRE_FALSE(loaded.ok());
  CHECK(std::string(loaded.status().message()).find("tokenizer.json") != std::string::npos);
}

TEST_CASE("StreamingDetokenizer matches Decode for BPE", "[tokenizer]") {
  const auto tokenizer = MakeBpe(MakeTokenizerJson(true));
  CheckStreaming(*tokenizer, EncodeOk(*tokenizer, std::string(kUnicodeText) + " the end 🎩"));
  CheckStreaming(*tokenizer, EncodeOk(*tokenizer, "<|begin_of_text|>héllo<|eot_id|>", true));
  // A character left incomplete at the end comes out of Flush as U+FFFD, as Decode has it.
  StreamingDetokenizer stream(*tokenizer);
  CHECK(*stream.Push('a') == "a");
  CHECK(stream.Push(0xE4)->empty());
  CHECK(stream.Push(0xBD)->empty());
  CHECK(*stream.Flush() == "\xEF\xBF\xBD");
  CHECK_FALSE(stream.Push(-5).ok());
}

TEST_CASE("TokenText names a BPE token on its own", "[tokenizer]") {
  const auto tokenizer = MakeBpe(MakeTokenizerJson());
  CHECK(TokenText(*tokenizer, std::nullopt, kIdSpaceThe) == " the");
  CHECK(TokenText(*tokenizer, kIdHe, kIdSpaceThe) == " the");
  // Specials, which Decode skips, by their spelling; an unknown id is "".
  CHECK(TokenText(*tokenizer, kIdSpaceThe, kIdEotId) == "<|eot_id|>");
  CHECK(tokenizer->SpecialText(kIdSpaceThe) == std::nullopt);
  CHECK(TokenText(*tokenizer, std::nullopt, -3).empty());
  // A character split between tokens: each part on its own is U+FFFD, never half a
  // character (not UTF-8) nor the whole one twice.
  CHECK(TokenText(*tokenizer, 'a', 0xE4) == "\xEF\xBF\xBD");
  CHECK(TokenText(*tokenizer, 0xE4, 0xBD) == "\xEF\xBF\xBD");
}

TEST_CASE("SentencePiece training is deterministic", "[tokenizer]") {
  RequireSpmPlugin();
  TempDir dir;
  const std::vector<std::string> corpus = MakeCorpus();
  REQUIRE(TrainSentencePiece(corpus, kSpmVocabSize, dir.path() / "a.model").ok());
  REQUIRE(TrainSentencePiece(corpus, kSpmVocabSize, dir.path() / "b.model").ok());
  const std::string first = ReadFile(dir.path() / "a.model");
  CHECK_FALSE(first.empty());
  CHECK(first == ReadFile(dir.path() / "b.model"));
  CHECK(first == ReadFile(SpmModelDir() / "tokenizer.model"));

  // Byte fallback needs 256 + 3 pieces before any merge.
  const absl::Status too_small = TrainSentencePiece(corpus, 100, dir.path() / "c.model");
  CHECK(absl::IsInvalidArgument(too_small));
  CHECK(std::string(too_small.message()).find("c.model") != std::string::npos);
}

TEST_CASE("SentencePiece round-trips and knows its control tokens", "[tokenizer]") {
  RequireSpmPlugin();
  auto loaded = Tokenizer::Load(SpmModelDir());
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  const Tokenizer& tokenizer = **loaded;
  CHECK(tokenizer.vocab_size() == kSpmVocabSize);
  CHECK(tokenizer.bos_id() == 1);
  CHECK(tokenizer.eos_id() == 2);
  CHECK(tokenizer.PieceToId("<s>") == 1);
  CHECK(tokenizer.PieceToId("<unk>") == 0);
  CHECK(tokenizer.PieceToId("<0x41>").has_value());
  CHECK(tokenizer.PieceToId("no such piece") == std::nullopt);

  // "zebra ✓ 🎩" is not in the corpus and goes through byte fallback.
  for (const std::string& text :
       {std::string("the cat sat on the mat"), std::string(kUnicodeText),
        std::string("zebra ✓ 🎩 and    spaces"), std::string("12345 Capital")}) {
    const std::vector<int32_t> ids = EncodeOk(tokenizer, text);
    CHECK(std::find(ids.begin(), ids.end(), 0) == ids.end());  // never <unk>
    CHECK(DecodeOk(tokenizer, ids) == text);
    std::vector<int32_t> framed = {1};
    framed.insert(framed.end(), ids.begin(), ids.end());
    framed.push_back(2);
    CHECK(DecodeOk(tokenizer, framed) == text);
  }

  const std::vector<int32_t> plain = EncodeOk(tokenizer, "<s>the cat</s>");
  CHECK(std::find(plain.begin(), plain.end(), 1) == plain.end());
  const std::vector<int32_t> parsed = EncodeOk(tokenizer, "<s>the cat</s>", true);
  REQUIRE(parsed.size() >= 3);
  CHECK(parsed.front() == 1);
  CHECK(parsed.back() == 2);
  CHECK(DecodeOk(tokenizer, parsed) == "the cat");

  CHECK_FALSE(tokenizer.Decode({kSpmVocabSize}).ok());
  CHECK_FALSE(tokenizer.Decode({-1}).ok());

  // A token shown on its own keeps the space it adds after the one before it, which Decode
  // drops at the start of a text.
  const std::vector<int32_t> words = EncodeOk(tokenizer, "the cat");
  REQUIRE(words.size() >= 2);
  // "▁cat" is one piece: "cat" decoded alone, " cat" after "e".
  CHECK(DecodeOk(tokenizer, {words.back()}) == "cat");
  CHECK(TokenText(tokenizer, words[words.size() - 2], words.back()) == " cat");
  std::string joined;
  for (size_t i = 0; i < words.size(); ++i) {
    joined += TokenText(tokenizer, i == 0 ? std::optional<int32_t>(1) : words[i - 1], words[i]);
  }
  CHECK(joined == "the cat");
  CHECK(TokenText(tokenizer, words.back(), 2) == "</s>");
  CHECK(tokenizer.SpecialText(0) == std::nullopt);  // <unk> decodes to text of its own
}

TEST_CASE("StreamingDetokenizer matches Decode for SentencePiece", "[tokenizer]") {
  RequireSpmPlugin();
  auto loaded = Tokenizer::Load(SpmModelDir());
  REQUIRE(loaded.ok());
  const Tokenizer& tokenizer = **loaded;
  std::vector<int32_t> ids = {1};
  const std::vector<int32_t> body =
      EncodeOk(tokenizer, std::string(kUnicodeText) + " zebra ✓ 🎩 the cat");
  ids.insert(ids.end(), body.begin(), body.end());
  ids.push_back(2);
  CheckStreaming(tokenizer, ids);
}

// A tokenizer that passes everything to another and remembers the longest Decode it was asked.
class DecodeLengthRecorder : public Tokenizer {
 public:
  explicit DecodeLengthRecorder(const Tokenizer& inner) : inner_(inner) {}
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool parse_special) const override {
    return inner_.Encode(text, parse_special);
  }
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override {
    longest_decode = std::max(longest_decode, ids.size());
    return inner_.Decode(ids);
  }
  int32_t vocab_size() const override { return inner_.vocab_size(); }
  std::optional<int32_t> bos_id() const override { return inner_.bos_id(); }
  std::optional<int32_t> eos_id() const override { return inner_.eos_id(); }
  std::optional<int32_t> PieceToId(std::string_view piece) const override {
    return inner_.PieceToId(piece);
  }
  std::optional<std::string> TokenBytes(int32_t id) const override {
    return inner_.TokenBytes(id);
  }
  mutable size_t longest_decode = 0;

 private:
  const Tokenizer& inner_;
};

// Streams a long text (multi-byte characters cut between tokens throughout) and checks the
// pieces add up to Decode of it all while no Push decodes more than a short window.
void CheckLongStreamDecodesAWindow(const Tokenizer& tokenizer, const std::string& sentence) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += sentence;
  const std::vector<int32_t> ids = EncodeOk(tokenizer, text);
  REQUIRE(ids.size() > 1000);
  DecodeLengthRecorder recorder(tokenizer);
  StreamingDetokenizer stream(recorder);
  std::string streamed;
  size_t longest_window = 0;
  for (const int32_t id : ids) {
    auto piece = stream.Push(id);
    REQUIRE(piece.ok());
    streamed += *piece;
    longest_window = std::max(longest_window, stream.window_size());
  }
  streamed += *stream.Flush();
  CHECK(streamed == DecodeOk(tokenizer, ids));
  // The window restarts past kWindowIds ids at a whole character: the longest is that plus
  // the ids of the longest character and the one kept before it.
  CHECK(longest_window <= StreamingDetokenizer::kWindowIds + 6);
  CHECK(recorder.longest_decode <= StreamingDetokenizer::kWindowIds + 6);
}

TEST_CASE("StreamingDetokenizer decodes a short window however long the stream",
          "[tokenizer]") {
  const std::string sentence = std::string(kUnicodeText) + " zebra ✓ 🎩 the cat ";
  SECTION("BPE") {
    const auto tokenizer = MakeBpe(MakeTokenizerJson(true));
    CheckLongStreamDecodesAWindow(*tokenizer, sentence);
  }
  SECTION("SentencePiece") {
    RequireSpmPlugin();
    auto loaded = Tokenizer::Load(SpmModelDir());
    REQUIRE(loaded.ok());
    CheckLongStreamDecodesAWindow(**loaded, sentence);
  }
}

TEST_CASE("Tokenizer::Load errors name the file", "[tokenizer]") {
  RequireSpmPlugin();
  TempDir dir;
  const auto missing = SentencePieceTokenizer::Load(dir.path() / "tokenizer.model");
  REQUIRE_FALSE(missing.ok());
  CHECK(std::string(missing.status().message()).find("tokenizer.model") != std::string::npos);

  WriteBytes(dir.path() / "tokenizer.model", "definitely not a protobuf");
  auto corrupt = Tokenizer::Load(dir.path());
  REQUIRE_FALSE(corrupt.ok());
  CHECK(std::string(corrupt.status().message()).find("tokenizer.model") != std::string::npos);

  // A Metaspace tokenizer.json beside tokenizer.model (Llama-2 on the Hub) defers to the model.
  fs::copy_file(SpmModelDir() / "tokenizer.model", dir.path() / "tokenizer.model",
                fs::copy_options::overwrite_existing);
  Json json = MakeTokenizerJson();
  json["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}};
  WriteBytes(dir.path() / "tokenizer.json", json.dump());
  auto fallback = Tokenizer::Load(dir.path());
  INFO(fallback.status().ToString());
  REQUIRE(fallback.ok());
  CHECK((*fallback)->vocab_size() == kSpmVocabSize);
}

}  // namespace
}  // namespace tophat

namespace tophat {
namespace {

TEST_CASE("The placeholder byte-level tokenizer encodes text to bytes and decodes every id",
          "[tokenizer]") {
  const std::string json = PlaceholderByteLevelTokenizerJson(1000, 900, 901);
  auto tokenizer = BpeTokenizer::FromJson(json, "placeholder/tokenizer.json");
  REQUIRE(tokenizer.ok());
  CHECK((*tokenizer)->vocab_size() == 1000);
  CHECK((*tokenizer)->bos_id() == 900);
  CHECK((*tokenizer)->eos_id() == 901);
  auto ids = (*tokenizer)->Encode("hi é");
  REQUIRE(ids.ok());
  // Bytes: 'h', 'i', ' ', then é's two UTF-8 bytes.
  CHECK(*ids == std::vector<int32_t>{'h', 'i', ' ', 0xC3, 0xA9});
  auto text = (*tokenizer)->Decode({'o', 'k', 300, 999});
  REQUIRE(text.ok());
  CHECK(*text == "ok<300><999>");
}

// The bytes of a text's tokens, concatenated, are the text (SentencePiece: after its dummy
// prefix space): what constrained decoding walks.
std::string ConcatenatedTokenBytes(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  std::string bytes;
  for (const int32_t id : ids) {
    const std::optional<std::string> token = tokenizer.TokenBytes(id);
    INFO("token " << id);
    REQUIRE(token.has_value());
    bytes += *token;
  }
  return bytes;
}

TEST_CASE("TokenBytes spells each token raw, and nothing for special tokens", "[tokenizer]") {
  SECTION("BPE") {
    const auto tokenizer = MakeBpe(MakeTokenizerJson());
    for (const std::string& text : {std::string("Hello, the world!\n\t12345 it's"),
                                    std::string(kUnicodeText)}) {
      CHECK(ConcatenatedTokenBytes(*tokenizer, EncodeOk(*tokenizer, text)) == text);
    }
    // Half a character is its byte, not a replacement character.
    CHECK(tokenizer->TokenBytes(0xE4) == std::string("\xE4"));
    CHECK(tokenizer->TokenBytes(kIdSpaceThe) == " the");
    CHECK(tokenizer->TokenBytes(*tokenizer->eos_id()) == std::nullopt);
    CHECK(tokenizer->TokenBytes(-1) == std::nullopt);
    CHECK(tokenizer->TokenBytes(tokenizer->vocab_size()) == std::nullopt);
  }
  SECTION("SentencePiece") {
    RequireSpmPlugin();
    auto loaded = Tokenizer::Load(SpmModelDir());
    REQUIRE(loaded.ok());
    const Tokenizer& tokenizer = **loaded;
    // "✓ 🎩" goes through byte fallback: each byte piece is its byte.
    for (const std::string& text : {std::string("the cat sat on the mat"),
                                    std::string(kUnicodeText), std::string("zebra ✓ 🎩 {\"a\": 1}")}) {
      CHECK(ConcatenatedTokenBytes(tokenizer, EncodeOk(tokenizer, text)) == " " + text);
    }
    CHECK(tokenizer.TokenBytes(*tokenizer.PieceToId("<0x0A>")) == "\n");
    CHECK(tokenizer.TokenBytes(*tokenizer.PieceToId("<0xE4>")) == std::string("\xE4"));
    CHECK(tokenizer.TokenBytes(0) == std::nullopt);  // <unk>
    CHECK(tokenizer.TokenBytes(1) == std::nullopt);  // <s>
    CHECK(tokenizer.TokenBytes(2) == std::nullopt);  // </s>
    CHECK(tokenizer.TokenBytes(kSpmVocabSize) == std::nullopt);
  }
}

}  // namespace
}  // namespace tophat
