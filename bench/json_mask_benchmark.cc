// tophat-bench-json-mask: what an answer constrained to JSON costs the device per token. For
// states a JSON answer passes through (the start, a key, a value, a string, a number, deep
// in structure), the time the constraint takes to find the allowed tokens of a whole
// vocabulary (a cold cache: a fresh constraint per run), and the time when the state's mask
// is kept (inside a string, every token after the first): for any JSON object
// (JsonConstraint) and for a JSON Schema's values (SchemaConstraint, a schema of every kind
// of value with no undeclared keys, a string with a maxLength, whose masks are never kept from
// one character to the next, and an integer and a number with bounds), and for tool calls in
// Qwen2.5's layout (ToolCallConstraint: its literals, a name along the tools' names, the
// arguments under their tool's schema; and tool_choice "auto", text before any call). The bound beside them is one pass
// over the vocabulary's bytes, measured in the same run: the walk reads each token at least
// once less what it shares with the token before. The vocabulary is a tokenizer's
// (--tokenizer DIR: tokenizer.json or tokenizer.model) or a synthetic byte-level one of
// --vocab tokens shaped like a BPE vocabulary (words with and without a leading space,
// digits, punctuation runs such as `":` and `},`, multi-byte characters). With --verify,
// each mask is checked against trying every token on its own, and a difference fails the
// run (the CTest smoke test).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/program.h"
#include "bench/bench_util.h"
#include "models/grammar/choice_grammar.h"
#include "models/grammar/ebnf_grammar.h"
#include "models/grammar/json_as_gbnf.h"
#include "models/grammar/json_constraint.h"
#include "models/grammar/regex_grammar.h"
#include "models/grammar/structural_tag_grammar.h"
#include "models/grammar/tool_call_grammar.h"
#include "models/tokenizers/tokenizer.h"

namespace tophat {
namespace {

struct Args {
  std::string tokenizer_dir;
  int64_t vocab = 128256;  // Llama-3's
  uint64_t seed = 1;
  int64_t repeats = 5;
  bool verify = false;
  std::string json_path;
  std::string only;  // measure only the states whose "format state" contains it
};

// A byte-level vocabulary of `size` tokens: the 256 bytes, then pieces drawn the way BPE
// merges look (most a word or part of one, some with a leading space, some digits or JSON
// punctuation runs, some with multi-byte characters), all distinct.
std::vector<std::optional<std::string>> SyntheticVocabulary(int64_t size, uint64_t seed) {
  std::vector<std::optional<std::string>> tokens;
  for (int byte = 0; byte < 256; ++byte) tokens.emplace_back(std::string(1, static_cast<char>(byte)));
  std::mt19937_64 rng(seed);
  static const char* const kSyllables[] = {"th", "e", "in", "er", "an", "re", "on", "at", "en",
                                           "nd", "ti", "es", "or", "te", "of", "ed", "is", "it",
                                           "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as",
                                           "ou", "io", "le", "ve", "co", "me", "de", "hi", "ri"};
  static const char* const kPunctuation[] = {"\":", "\",", "},", "\": \"", "{\"", "\"}", "],",
                                             "\n", "  ", "    ", "\n  ", ".", ",", "(", ")",
                                             "://", "\\n", "\\\"", "==", "->"};
  static const char* const kCharacters[] = {"é", "ü", "你", "好", "ß", "—", "’", "🎩"};
  std::unordered_set<std::string> unique;
  while (static_cast<int64_t>(tokens.size()) < size) {
    std::string piece;
    const uint64_t kind = rng() % 100;
    if (kind < 70) {
      if (rng() % 2 == 0) piece += ' ';
      if (rng() % 8 == 0) piece += static_cast<char>('A' + rng() % 26);
      for (uint64_t n = 1 + rng() % 4; n > 0; --n) piece += kSyllables[rng() % std::size(kSyllables)];
    } else if (kind < 80) {
      for (uint64_t n = 1 + rng() % 3; n > 0; --n) piece += static_cast<char>('0' + rng() % 10);
    } else if (kind < 92) {
      piece += kPunctuation[rng() % std::size(kPunctuation)];
      if (rng() % 2 == 0) piece += kSyllables[rng() % std::size(kSyllables)];
    } else {
      if (rng() % 2 == 0) piece += ' ';
      piece += kCharacters[rng() % std::size(kCharacters)];
      if (rng() % 2 == 0) piece += kSyllables[rng() % std::size(kSyllables)];
    }
    if (piece.size() > 1 && unique.insert(piece).second) tokens.emplace_back(std::move(piece));
  }
  return tokens;
}

struct State {
  const char* name;
  const char* text;  // the answer so far
};

int Run(const Args& args) {
  std::vector<std::optional<std::string>> tokens;
  std::string source = absl::StrFormat("synthetic byte-level, %d tokens, seed %d", args.vocab,
                                       args.seed);
  std::vector<int32_t> end_ids;
  if (!args.tokenizer_dir.empty()) {
    auto tokenizer = Tokenizer::Load(args.tokenizer_dir);
    if (!tokenizer.ok()) return Fail(tokenizer.status());
    for (int32_t id = 0; id < (*tokenizer)->vocab_size(); ++id) {
      tokens.push_back((*tokenizer)->TokenBytes(id));
    }
    if ((*tokenizer)->eos_id()) end_ids.push_back(*(*tokenizer)->eos_id());
    source = args.tokenizer_dir;
  } else {
    tokens = SyntheticVocabulary(args.vocab, args.seed);
    tokens.emplace_back(std::nullopt);  // the end of sequence
    end_ids.push_back(static_cast<int32_t>(tokens.size() - 1));
  }
  int64_t total_bytes = 0;
  for (const auto& token : tokens) total_bytes += token ? static_cast<int64_t>(token->size()) : 0;
  // The bytes a walk over every token can read: each token's past the prefix it shares with
  // the one before it in byte order (what TokenVocabulary keeps of each walk).
  int64_t tail_bytes = 0;
  {
    std::vector<std::string_view> sorted;
    for (const auto& token : tokens) {
      if (token.has_value() && !token->empty()) sorted.emplace_back(*token);
    }
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      size_t shared = 0;
      if (i > 0) {
        while (shared < sorted[i].size() && shared < sorted[i - 1].size() &&
               sorted[i][shared] == sorted[i - 1][shared]) {
          ++shared;
        }
      }
      tail_bytes += static_cast<int64_t>(sorted[i].size() - shared);
    }
  }
  const bench::BenchClock::time_point build_start = bench::BenchClock::now();
  const auto vocabulary = std::make_shared<const TokenVocabulary>(tokens);
  const double build_s = bench::SecondsBetween(build_start, bench::BenchClock::now());
  // A token for each single byte (byte-level BPE has them all, SentencePiece its byte
  // pieces), to write the states' answers with.
  std::vector<int32_t> byte_token(256, -1);
  for (int32_t id = vocabulary->size() - 1; id >= 0; --id) {
    const std::string* bytes = vocabulary->bytes(id);
    if (bytes != nullptr && bytes->size() == 1) byte_token[static_cast<unsigned char>((*bytes)[0])] = id;
  }

  // The bound: one pass over every token's bytes (summed, so the pass is not optimised away).
  std::vector<double> pass_s;
  uint64_t checksum = 0;
  for (int64_t r = 0; r < std::max<int64_t>(args.repeats, 3); ++r) {
    const auto start = bench::BenchClock::now();
    for (int32_t id = 0; id < vocabulary->size(); ++id) {
      if (const std::string* bytes = vocabulary->bytes(id)) {
        for (const char c : *bytes) checksum += static_cast<unsigned char>(c);
      }
    }
    pass_s.push_back(bench::SecondsBetween(start, bench::BenchClock::now()));
  }
  const double pass = bench::Median(pass_s);

  const std::vector<State> object_states = {
      {"start", ""},
      {"key", "{\""},
      {"after key", "{\"name\""},
      {"value", "{\"name\": "},
      {"string value", "{\"name\": \"Jo"},
      {"number", "{\"n\": 12"},
      {"array", "{\"a\": [1, 2"},
      {"literal", "{\"a\": {\"b\": tr"},
      {"escape", "{\"s\": \"\\u00"},
  };
  // The same places in an answer to a schema (every key declared, none other), and an enum.
  const auto schema = CompiledSchema::Compile(nlohmann::json::parse(R"({
      "type": "object",
      "properties": {"name": {"type": "string"}, "n": {"type": "integer"},
                     "a": {"type": "array", "items": {"type": "integer"}},
                     "o": {"type": "object", "properties": {"b": {"type": "boolean"}},
                           "additionalProperties": false},
                     "s": {"type": "string"},
                     "kind": {"enum": ["adult", "child", "other"]},
                     "code": {"type": "string", "maxLength": 8},
                     "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                     "score": {"type": "number", "minimum": 0, "maximum": 1},
                     "pet": {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]},
                     "shape": {"anyOf": [{"$ref": "#/$defs/Box"}, {"$ref": "#/$defs/Disc"}]},
                     "ticket": {"type": "string", "pattern": "^[A-Z]{2}-\\d{2,4}$"},
                     "line": {"type": "string", "pattern": "^.{0,64}$"}},
      "required": ["name"], "additionalProperties": false,
      "$defs": {
        "Cat": {"type": "object", "properties": {"pet_type": {"const": "cat"},
                "name": {"type": "string"}}, "required": ["pet_type", "name"]},
        "Dog": {"type": "object", "properties": {"pet_type": {"const": "dog"},
                "name": {"type": "string"}}, "required": ["pet_type", "name"]},
        "Box": {"type": "object", "properties": {"w": {"type": "number"},
                "label": {"type": "string"}}, "required": ["w"], "additionalProperties": false},
        "Disc": {"type": "object", "properties": {"r": {"type": "number"},
                 "label": {"type": "string"}}, "additionalProperties": false}}})"));
  if (!schema.ok()) return Fail(schema.status());
  const std::vector<State> schema_states = {
      {"start", ""},
      {"key", "{\""},
      {"after key", "{\"name\""},
      {"value", "{\"name\": "},
      {"string value", "{\"name\": \"Jo"},
      {"number", "{\"n\": 12"},
      {"array", "{\"a\": [1, 2"},
      {"literal", "{\"o\": {\"b\": tr"},
      {"escape", "{\"s\": \"\\u00"},
      {"enum", "{\"kind\": \"ch"},
      {"maxLength", "{\"code\": \"ab"},
      {"bounds", "{\"year\": 19"},
      {"number bounds", "{\"score\": 0.2"},
      // Unions of objects: a discriminated one (its tag first), and one read twice.
      {"union key", "{\"pet\": {\""},
      {"union tag", "{\"pet\": {\"pet_type\": \"c"},
      {"union value", "{\"pet\": {\"pet_type\": \"cat\", \"name\": \"To"},
      {"overlap", "{\"shape\": {\"label\": \"sq"},
      // Patterns: a narrow one (most tokens refused at their first byte) and one that takes
      // almost any character (every token walked whole: a pattern's string is not
      // in_string).
      {"pattern", "{\"ticket\": \"AB-1"},
      {"pattern any", "{\"line\": \"Hello, wo"},
  };
  // Tool calls: where a required call's answer is in its literals, its name and its arguments.
  const auto weather = CompiledSchema::Compile(nlohmann::json::parse(R"({
      "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
      "required": ["city", "days"], "additionalProperties": false})"));
  const auto clock = CompiledSchema::Compile(nlohmann::json::parse(R"({
      "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
      "additionalProperties": false})"));
  if (!weather.ok()) return Fail(weather.status());
  if (!clock.ok()) return Fail(clock.status());
  const auto tool_calls = ToolCallSpec::Create(
      ToolCallSyntax{.open = "<tool_call>\n{\"name\": \"",
                     .between = "\", \"arguments\": ",
                     .close = "}\n</tool_call>",
                     .separator = "\n"},
      {{.name = "get_weather", .parameters = *weather}, {.name = "get_time", .parameters = *clock}},
      4);
  if (!tool_calls.ok()) return Fail(tool_calls.status());
  // tool_choice "auto": text first, where every token is walked whole (nothing is refused
  // but special tokens, and the end is allowed), until the tag begins a call.
  const auto auto_calls = ToolCallSpec::Create(
      ToolCallSyntax{.open = "<tool_call>\n{\"name\": \"",
                     .between = "\", \"arguments\": ",
                     .close = "}\n</tool_call>",
                     .separator = "\n",
                     .start_tag = "<tool_call>"},
      {{.name = "get_weather", .parameters = *weather}, {.name = "get_time", .parameters = *clock}},
      4, /*text_first=*/true);
  if (!auto_calls.ok()) return Fail(auto_calls.status());
  const std::vector<State> auto_states = {
      {"text", "Let me check the weather."},
      {"partial tag", "Sure. <tool_"},
      {"call", "Sure. <tool_call>\n{\"name\": \"get_"},
  };
  // A structural tag (vLLM's response_format structural_tag) in Llama 3.1's function layout:
  // text, where every token is walked whole as under "auto", then the structures.
  const auto tags = StructuralTagSpec::Create(
      {{.begin = "<function=get_weather>", .schema = *weather, .end = "</function>"},
       {.begin = "<function=get_time>", .schema = *clock, .end = "</function>"}},
      {"<function="});
  if (!tags.ok()) return Fail(tags.status());
  const std::vector<State> tag_states = {
      {"text", "Let me check the weather."},
      {"partial trigger", "Sure. <func"},
      {"begin", "Sure. <function=get_"},
      {"value", "Sure. <function=get_weather>{\"city\": \"Os"},
      {"end", "Sure. <function=get_time>{}</fu"},
  };
  const std::vector<State> tool_states = {
      {"start", ""},
      {"open", "<tool_call>\n{\"na"},
      {"name", "<tool_call>\n{\"name\": \"get_"},
      {"between", "<tool_call>\n{\"name\": \"get_time\", \"arg"},
      {"arguments", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os"},
      {"after call", "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"},
  };
  std::string table = absl::StrFormat(
      "masks over %s (%d tokens, %d bytes, %d past shared prefixes; vocabulary sorted in "
      "%.1f ms)\n"
      "one pass over the bytes (bound): %.3f ms\n"
      "%-8s %-14s %12s %12s %10s %14s\n",
      source, vocabulary->size(), total_bytes, tail_bytes, build_s * 1e3, pass * 1e3, "format",
      "state", "allowed", "walk ms", "x bound", "kept mask us");
  nlohmann::json rows = nlohmann::json::array();
  bool verified = true;
  // Each state of `states` under the constraint `make` makes, checked (--verify) against
  // trying each token on `start` fed the state's text.
  const auto measure = [&](const char* format, const std::vector<State>& states,
                           const auto& make, const auto& start) -> absl::Status {
    for (const State& state : states) {
      if (!absl::StrContains(absl::StrCat(format, " ", state.name), args.only)) continue;
      // The answer's tokens: its text byte by byte.
      std::vector<int32_t> answer;
      for (const char c : std::string(state.text)) {
        const int32_t id = byte_token[static_cast<unsigned char>(c)];
        if (id < 0) {
          return absl::FailedPreconditionError(
              absl::StrFormat("%s has no token of the single byte '%c'", source, c));
        }
        answer.push_back(id);
      }
      std::vector<double> walk_s;
      std::vector<double> kept_s;
      int64_t allowed = 0;
      for (int64_t r = 0; r < args.repeats; ++r) {
        const std::unique_ptr<TokenConstraint> constraint = make();
        constraint->Commit(answer);
        auto begin = bench::BenchClock::now();
        const auto mask = constraint->Allowed({});
        walk_s.push_back(bench::SecondsBetween(begin, bench::BenchClock::now()));
        begin = bench::BenchClock::now();
        const auto again = constraint->Allowed({});
        kept_s.push_back(bench::SecondsBetween(begin, bench::BenchClock::now()));
        allowed = 0;
        for (const uint8_t a : *mask) allowed += a;
        if (args.verify && r == 0) {
          auto grammar = start;
          grammar.Feed(state.text);
          for (int32_t id = 0; id < vocabulary->size(); ++id) {
            const std::string* bytes = vocabulary->bytes(id);
            auto next = grammar;
            // An end id where the answer may end (after a whole tool call), else a token the
            // grammar takes.
            const bool end = std::find(end_ids.begin(), end_ids.end(), id) != end_ids.end();
            const bool expected = end ? grammar.can_end()
                                      : bytes != nullptr && !bytes->empty() && next.Feed(*bytes);
            if (expected != ((*mask)[id] != 0)) {
              std::fprintf(stderr, "--verify: %s state %s: token %d is %s but should %s\n",
                           format, state.name, id, (*mask)[id] ? "allowed" : "refused",
                           expected ? "be allowed" : "not be");
              verified = false;
              break;
            }
          }
          if (again != mask) {
            std::fprintf(stderr, "--verify: %s state %s: the mask was not kept\n", format,
                         state.name);
            verified = false;
          }
        }
      }
      const double walk = bench::Median(walk_s);
      const double kept = bench::Median(kept_s);
      absl::StrAppendFormat(&table, "%-8s %-14s %12d %12.3f %10.1f %14.2f\n", format,
                            state.name, allowed, walk * 1e3, walk / pass, kept * 1e6);
      rows.push_back({{"format", format},
                      {"state", state.name},
                      {"text", state.text},
                      {"allowed", allowed},
                      {"walk_s", walk},
                      {"walk_over_bound", walk / pass},
                      {"kept_mask_s", kept}});
    }
    return absl::OkStatus();
  };
  absl::Status measured = measure(
      "object", object_states,
      [&] { return std::make_unique<JsonConstraint>(vocabulary, end_ids); }, JsonGrammar());
  if (measured.ok()) {
    measured = measure(
        "schema", schema_states,
        [&] { return MakeSchemaConstraint(vocabulary, end_ids, *schema); },
        SchemaGrammar(schema->get()));
  }
  if (measured.ok()) {
    measured = measure(
        "tools", tool_states,
        [&] { return MakeToolCallConstraint(vocabulary, end_ids, *tool_calls); },
        ToolCallGrammar(tool_calls->get()));
  }
  if (measured.ok()) {
    measured = measure(
        "auto", auto_states,
        [&] { return MakeToolCallConstraint(vocabulary, end_ids, *auto_calls); },
        ToolCallGrammar(auto_calls->get()));
  }
  if (measured.ok()) {
    measured = measure(
        "tag", tag_states, [&] { return MakeStructuralTagConstraint(vocabulary, end_ids, *tags); },
        StructuralTagGrammar(tags->get()));
  }
  // Regexes over the whole answer (vLLM's structured_outputs regex): a narrow one, and one
  // that takes almost any character, where every token is walked whole through its DFA.
  for (const auto& [regex, state] : std::vector<std::pair<std::string, State>>{
           {R"([A-Z]{2}-\d{2,4})", {"narrow", "AB-1"}}, {".{0,200}", {"any", "Hello, wo"}}}) {
    if (!measured.ok()) break;
    const auto pattern = CompileRegexFormat(regex);
    if (!pattern.ok()) return Fail(pattern.status());
    measured = measure(
        "regex", {state}, [&] { return MakeRegexConstraint(vocabulary, end_ids, *pattern); },
        RegexGrammar(pattern->get()));
  }
  // A choice among a classifier's 5,000 labels (vLLM's structured_outputs choice): a trie.
  if (measured.ok()) {
    std::vector<std::string> labels;
    const char* const words[] = {"knight", "farmer", "bird", "robot"};
    for (int i = 0; i < 5000; ++i)
      labels.push_back(absl::StrCat("the ", words[i % 4], " number ", i));
    const auto choice = ChoiceSpec::Create(labels);
    if (!choice.ok()) return Fail(choice.status());
    measured = measure(
        "choice",
        {{"start", ""}, {"shared prefix", "the bird num"}, {"label", "the bird number 9"}},
        [&] { return MakeChoiceConstraint(vocabulary, end_ids, *choice); },
        ChoiceGrammar(choice->get()));
  }
  // GBNF grammars (vLLM's structured_outputs grammar, llama.cpp's grammar): JSON written as a
  // grammar (llama.cpp's json.gbnf shape), inside an object's key, a string and a number, and
  // one that takes almost any character.
  for (const auto& [text, states] : std::vector<std::pair<std::string_view, std::vector<State>>>{
           {kJsonAsGbnf,
            {{"json key", "{\"na"},
             {"json string", "{\"name\": \"Os"},
             {"json number", "{\"n\": 12"}}},
           {"root ::= .{0,200}", {{"any", "Hello, wo"}}},
           // The worst kind: ways that multiply with each "(" (docs/openai.md, "Grammars").
           {"root ::= f\nf ::= [0-9] | \"(\"+ g \")\"\ng ::= f | f \"x\"",
            {{"ambiguous", "(((("}}}}) {
    if (!measured.ok()) break;
    const auto grammar = EbnfGrammar::Compile(text);
    if (!grammar.ok()) return Fail(grammar.status());
    EbnfWorkspace workspace(grammar->get());
    measured = measure(
        "gbnf", states, [&] { return MakeEbnfConstraint(vocabulary, end_ids, *grammar); },
        EbnfState(&workspace));
  }
  if (!measured.ok()) return Fail(measured);
  const nlohmann::json report = {{"benchmark", "json_mask"},
                                 {"vocabulary", source},
                                 {"tokens", vocabulary->size()},
                                 {"bytes", total_bytes},
                                 {"tail_bytes", tail_bytes},
                                 {"sort_s", build_s},
                                 {"byte_pass_s", pass},
                                 {"checksum", checksum},
                                 {"states", rows},
                                 {"verified", args.verify ? nlohmann::json(verified) : nullptr}};
  if (absl::Status status = bench::PrintReport(table, report, args.json_path); !status.ok()) {
    return Fail(status);
  }
  if (!verified) return 1;
  return 0;
}

}  // namespace
}  // namespace tophat

int main(int argc, char** argv) {
  tophat::Args args;
  CLI::App app{"What an answer constrained to JSON costs per token: the allowed tokens of a "
               "whole vocabulary in states a JSON answer passes through, against one pass over "
               "the vocabulary's bytes"};
  app.add_option("--tokenizer", args.tokenizer_dir,
                 "A checkpoint directory whose tokenizer to use (default: a synthetic one)");
  app.add_option("--vocab", args.vocab, "Tokens in the synthetic vocabulary")
      ->capture_default_str()
      ->check(CLI::Range(300, 1 << 22));
  app.add_option("--seed", args.seed, "Seed of the synthetic vocabulary")->capture_default_str();
  app.add_option("--repeats", args.repeats, "Runs per state (the median is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_flag("--verify", args.verify,
               "Check every mask against trying each token on its own; fail on a difference");
  app.add_option("--json", args.json_path, "Also write the JSON report here");
  app.add_option("--only", args.only,
                 "Measure only the states whose \"format state\" contains this (for a profiler: "
                 "\"tools start\")");
  CLI11_PARSE(app, argc, argv);
  return tophat::Run(args);
}
