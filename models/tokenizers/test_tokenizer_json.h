// A small tokenizer.json in the shapes of GPT-2's and Llama 3's, for tests of the tokenizers and
// of what is built on them (chat templates). Test-only.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace tophat::testing::tokenizer_json {

using Json = nlohmann::json;

// GPT-2's byte-to-unicode map, written independently of the code under test.
inline std::string ByteSymbol(int byte) {
  int code_point = byte;
  if (!((byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || byte >= 174)) {
    int extra = 0;
    for (int b = 0; b < byte; ++b) {
      if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) ++extra;
    }
    code_point = 256 + extra;
  }
  std::string out;
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
  return out;
}

// Ids of the test vocabulary: byte b has id b; merges produce ids from 256 on.
constexpr int32_t kIdSpaceT = 256;    // "Ġt"
constexpr int32_t kIdHe = 257;        // "he"
constexpr int32_t kIdSpaceThe = 258;  // "Ġthe"
constexpr int32_t kIdLl = 259;        // "ll"
constexpr int32_t kId12 = 260;        // "12"
constexpr int32_t kId123 = 261;       // "123"
constexpr int32_t kId45 = 262;        // "45"
constexpr int32_t kId34 = 263;        // "34"
constexpr int32_t kIdAbc = 264;       // "abc", reachable only through ignore_merges
constexpr int32_t kIdEndOfText = 265;
constexpr int32_t kIdBeginOfText = 266;
constexpr int32_t kIdEotId = 267;
constexpr int32_t kIdUserTag = 268;  // non-special added token "<tag>"
constexpr int32_t kIdStartHeader = 269;  // Llama 3's chat markup
constexpr int32_t kIdEndHeader = 270;

constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A tokenizer.json in the shape of GPT-2's (use_regex ByteLevel, "a b" merges) or, with
// `llama3`, of Llama-3's (Split + ByteLevel, [a, b] merges, ignore_merges).
inline Json MakeTokenizerJson(bool llama3 = false) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteSymbol(b)] = b;
  const std::string space_t = ByteSymbol(' ') + "t";
  vocab[space_t] = kIdSpaceT;
  vocab["he"] = kIdHe;
  vocab[space_t + "he"] = kIdSpaceThe;
  vocab["ll"] = kIdLl;
  vocab["12"] = kId12;
  vocab["123"] = kId123;
  vocab["45"] = kId45;
  vocab["34"] = kId34;
  vocab["abc"] = kIdAbc;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"3", "4"},  {ByteSymbol(' '), "t"},
      {"h", "e"},  {space_t, "he"},
      {"l", "l"},  {"1", "2"},
      {"12", "3"}, {"4", "5"}};
  Json merges_json = Json::array();
  for (const auto& [left, right] : merges) {
    if (llama3) {
      merges_json.push_back(Json::array({left, right}));
    } else {
      merges_json.push_back(left + " " + right);
    }
  }
  Json added = Json::array();
  const auto add = [&](int32_t id, const std::string& content, bool special) {
    added.push_back({{"id", id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", special}});
  };
  add(kIdEndOfText, "<|end_of_text|>", true);
  add(kIdBeginOfText, "<|begin_of_text|>", true);
  add(kIdEotId, "<|eot_id|>", true);
  add(kIdUserTag, "<tag>", false);
  add(kIdStartHeader, "<|start_header_id|>", true);
  add(kIdEndHeader, "<|end_header_id|>", true);

  Json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", true},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", llama3 ? Json(nullptr) : Json("")},
        {"end_of_word_suffix", llama3 ? Json(nullptr) : Json("")},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", llama3},
        {"vocab", vocab},
        {"merges", merges_json}}},
  };
  if (llama3) {
    tokenizer["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers", Json::array({{{"type", "Split"},
                                        {"pattern", {{"Regex", kLlama3Pattern}}},
                                        {"behavior", "Isolated"},
                                        {"invert", false}},
                                       {{"type", "ByteLevel"},
                                        {"add_prefix_space", false},
                                        {"trim_offsets", true},
                                        {"use_regex", false}}})}};
  } else {
    tokenizer["pre_tokenizer"] = {{"type", "ByteLevel"},
                                  {"add_prefix_space", false},
                                  {"trim_offsets", true},
                                  {"use_regex", true}};
  }
  return tokenizer;
}

}  // namespace tophat::testing::tokenizer_json
