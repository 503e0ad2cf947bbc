#include "device_agent/speculative_decoder.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "base/test_util.h"
#include "device_agent/decode_round.h"
#include "device_agent/request_stats.h"
#include "models/formats/checkpoint.h"
#include "models/grammar/ebnf_grammar.h"
#include "models/grammar/json_grammar.h"
#include "models/grammar/json_schema.h"
#include "models/grammar/regex_grammar.h"
#include "models/grammar/schema_grammar.h"
#include "models/runtime/adapter.h"
#include "models/runtime/model_init.h"
#include "nlohmann/json.hpp"

namespace tophat {
namespace {

// A 3-layer model split m = 1, k = 1 (the cloud holds layer 1), with an adapter made from
// layer 1 plus noise: a drafter that agrees with the target often but not always.
struct Split {
  testing::TempDir dir;
  ModelConfig config;
  std::unique_ptr<Submodel> full, input, middle, output, adapter;
};

std::unique_ptr<Split> MakeSplit(int64_t vocab, double logit_scale, double adapter_noise,
                                 uint64_t seed) {
  auto split = std::make_unique<Split>();
  ModelConfig& config = split->config;
  config = TinyTestConfig();
  config.num_hidden_layers = 3;
  config.vocab_size = vocab;
  NamedTensors weights = InitWeights(config, seed);
  NamedTensors adapter;
  at::manual_seed(static_cast<int64_t>(seed) + 1);
  for (auto& [name, t] : weights) {
    // Larger token vectors make the distributions peaked enough for drafting to matter.
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight") t = t * logit_scale;
    const std::string prefix = "model.layers.1.";
    if (name.rfind(prefix, 0) == 0) {
      adapter.emplace_back("model.layers.0." + name.substr(prefix.size()),
                           t + adapter_noise * at::randn_like(t));
    }
  }
  REQUIRE(WriteCheckpoint(config, weights, split->dir.path()).ok());
  AdapterInfo info;
  info.input_layers = 1;
  info.intermediate_size = config.intermediate_size;
  REQUIRE(WriteAdapter(split->dir.path(), info, adapter).ok());
  auto reader = CheckpointReader::Open(split->dir.path());
  REQUIRE(reader.ok());
  const SubmodelOptions options{.huge_pages = false};
  split->full = *Submodel::Load(config, **reader, SubmodelSpec::Full(config), options);
  split->input = *Submodel::Load(config, **reader, SubmodelSpec::Input(1), options);
  split->middle = *Submodel::Load(config, **reader, SubmodelSpec::Middle(config, 1, 1), options);
  split->output = *Submodel::Load(config, **reader, SubmodelSpec::Output(config, 1), options);
  auto loaded = LoadAdapter(split->dir.path(), config, info, 1, options);
  REQUIRE(loaded.ok());
  split->adapter = *std::move(loaded);
  return split;
}

// The device and an in-process stand-in for the cloud (the middle submodel and its KV).
struct Session {
  Session(const Split& split, const SpeculativeOptions& options, const SamplingParams& params,
          int64_t capacity, std::shared_ptr<const TokenVocabulary> vocabulary = nullptr)
      : sampler(params, std::move(vocabulary)),
        input_cache(split.input->NewCache(capacity)),
        adapter_cache(split.adapter->NewCache(capacity)),
        output_cache(split.output->NewCache(capacity)),
        middle_cache(split.middle->NewCache(capacity)),
        decoder({.input = split.input.get(), .adapter = split.adapter.get(),
                 .output = split.output.get()},
                input_cache, &adapter_cache, output_cache, options, sampler),
        split(split) {}

  // Prefill; returns the target's logits for the token after the prompt.
  at::Tensor Prefill(const std::vector<int64_t>& prompt) {
    at::Tensor shallow = *split.input->Forward(*split.input->Embed(at::tensor(prompt)), input_cache);
    REQUIRE(decoder.AbsorbPrompt(shallow).ok());
    at::Tensor out = *split.output->Forward(*split.middle->Forward(shallow, middle_cache),
                                            output_cache);
    return (*split.output->Logits(out.narrow(0, out.size(0) - 1, 1)))[0];
  }

  RoundOutcome Round(int32_t token, int64_t room, bool draft_ahead) {
    REQUIRE(decoder.BeginRound(token, room).ok());
    reused += decoder.round_from_parallel();
    const at::Tensor rows = decoder.RoundShallow();
    REQUIRE(rows.size(0) == decoder.round_drafts() + 1);
    REQUIRE(middle_cache.length() == decoder.round_start());
    // PipeInfer's premise: the best branch sent ahead is, on a hit, the next round's start
    // as it was sent (same position, same rows).
    if (sent_ahead) {
      CHECK(decoder.round_from_parallel());
      CHECK(decoder.round_start() == sent_ahead->start);
      REQUIRE(rows.size(0) >= sent_ahead->drafts + 1);
      CHECK(at::equal(rows.narrow(0, 0, sent_ahead->drafts + 1), sent_ahead->shallow));
      ++ahead_kept;
      sent_ahead.reset();
    }
    std::optional<SpeculativeDecoder::Branch> best;
    if (draft_ahead) {
      while (true) {
        auto more = decoder.DraftAheadStep();
        REQUIRE(more.ok());
        if (!*more) break;
        if (!best) best = decoder.BestBranch();
      }
      if (!best) best = decoder.BestBranch();
      if (best) {
        CHECK(best->start == decoder.round_start() + decoder.round_drafts() + 1);
        CHECK(best->shallow.size(0) == best->drafts + 1);
      }
    } else {
      CHECK_FALSE(decoder.BestBranch().has_value());
    }
    at::Tensor out = *split.output->Forward(*split.middle->Forward(rows, middle_cache),
                                            output_cache);
    auto outcome = decoder.FinishRound(out);
    REQUIRE(outcome.ok());
    if (best && outcome->parallel_hit && outcome->tokens.back() == best->token &&
        outcome->length == best->start) {
      sent_ahead = std::move(best);
    }
    REQUIRE(middle_cache.Truncate(outcome->length).ok());  // the cloud's rollback
    return *outcome;
  }

  int64_t reused = 0;  // rounds whose drafts were made ahead
  int64_t ahead_kept = 0;  // rounds that began as the best branch, as BestBranch gave it
  std::optional<SpeculativeDecoder::Branch> sent_ahead;
  Sampler sampler;
  KvCache input_cache, adapter_cache, output_cache, middle_cache;
  SpeculativeDecoder decoder;
  const Split& split;
};

// Plain greedy decoding with the monolithic model, with `penalties`' presence, frequency and
// repetition penalties written out here (vLLM's formulas) rather than taken from Sampler;
// also returns each step's top-2 margin after them.
std::vector<int32_t> ReferenceGreedy(const Submodel& full, const std::vector<int64_t>& prompt,
                                     int64_t count, const SamplingParams& penalties,
                                     std::vector<double>* margins) {
  KvCache cache = full.NewCache(static_cast<int64_t>(prompt.size()) + count + 1);
  at::Tensor hidden = *full.Forward(*full.Embed(at::tensor(prompt)), cache);
  std::vector<int32_t> out;
  std::map<int64_t, int64_t> generated;  // token -> times
  for (int64_t i = 0; i < count; ++i) {
    at::Tensor logits = (*full.Logits(hidden.narrow(0, hidden.size(0) - 1, 1)))[0].clone();
    for (int64_t token = 0; token < logits.size(0); ++token) {
      const bool in_prompt = std::find(prompt.begin(), prompt.end(), token) != prompt.end();
      const int64_t times = generated.count(token) ? generated.at(token) : 0;
      double value = logits[token].item<double>();
      if (in_prompt || times > 0) {
        value = value > 0 ? value / penalties.repetition_penalty
                          : value * penalties.repetition_penalty;
      }
      if (times > 0) {
        value -= penalties.frequency_penalty * static_cast<double>(times) +
                 penalties.presence_penalty;
      }
      logits[token] = value;
    }
    auto top = logits.topk(2);
    margins->push_back((std::get<0>(top)[0] - std::get<0>(top)[1]).item<double>());
    const auto token = static_cast<int32_t>(logits.argmax().item<int64_t>());
    out.push_back(token);
    ++generated[token];
    hidden = *full.Forward(*full.Embed(at::full({1}, token, at::kLong)), cache);
  }
  return out;
}

// Counts of what a speculative decode exercised.
struct DecodeCounts {
  int64_t drafted = 0, accepted = 0, hits = 0, rounds = 0, rejections = 0, reused = 0;
  int64_t ahead_kept = 0;
  int64_t forced = 0;  // forced drafts kept
};

// Greedy speculative decoding of `new_tokens` tokens after `prompt` in `session`, checking
// every round's KV lengths; the sampler is told of each round's tokens, as the agent does.
std::vector<int32_t> DecodeGreedy(Session& session, const std::vector<int64_t>& prompt,
                                  int64_t new_tokens, bool parallel, int64_t max_draft,
                                  DecodeCounts& counts) {
  session.sampler.SetPrompt(std::vector<int32_t>(prompt.begin(), prompt.end()));
  std::vector<int32_t> generated = {session.sampler.Sample(session.Prefill(prompt))};
  session.sampler.Commit(generated);
  while (static_cast<int64_t>(generated.size()) < new_tokens) {
    const int64_t room = new_tokens - static_cast<int64_t>(generated.size()) - 1;
    const int64_t start = static_cast<int64_t>(prompt.size() + generated.size()) - 1;
    const RoundOutcome outcome = session.Round(generated.back(), room, parallel);
    session.sampler.Commit(outcome.tokens);
    ++counts.rounds;
    counts.drafted += outcome.drafted;
    counts.accepted += outcome.accepted;
    counts.rejections += outcome.accepted < outcome.drafted;
    counts.hits += outcome.parallel_hit;
    // The drafter's drafts within max_draft; those the format forced on top, within the room.
    CHECK(outcome.drafted - outcome.forced_drafted <= std::min<int64_t>(room, max_draft));
    CHECK(outcome.drafted <= room);
    CHECK(outcome.forced_accepted <= outcome.forced_drafted);
    counts.forced += outcome.forced_accepted;
    CHECK(outcome.length == start + outcome.accepted + 1);
    CHECK(outcome.input_kv_length == outcome.length);
    CHECK(outcome.adapter_kv_length == outcome.length);
    CHECK(outcome.output_kv_length == outcome.length);
    // A parallel hit already holds the next round's rows past the accepted length.
    CHECK(session.input_cache.length() >= outcome.length);
    CHECK(session.adapter_cache.length() == session.input_cache.length());
    if (!outcome.parallel_hit) CHECK(session.input_cache.length() == outcome.length);
    CHECK(session.output_cache.length() == outcome.length);
    CHECK(session.middle_cache.length() == outcome.length);
    generated.insert(generated.end(), outcome.tokens.begin(), outcome.tokens.end());
  }
  counts.reused += session.reused;
  counts.ahead_kept += session.ahead_kept;
  generated.resize(new_tokens);
  return generated;
}

// Checks `generated` against `reference` up to where a near tie (top-2 margin under 1e-3)
// may part them: batched verification and one-row decoding round differently.
void CheckAgainstReference(const std::vector<int32_t>& generated,
                           const std::vector<int32_t>& reference,
                           const std::vector<double>& margins) {
  REQUIRE(generated.size() == reference.size());
  for (size_t i = 0; i < generated.size(); ++i) {
    if (generated[i] == reference[i]) continue;
    INFO("token " << i << ": " << generated[i] << " vs " << reference[i]);
    CHECK(margins[i] < 1e-3);
    break;
  }
}

// The counts show that every path ran: drafts kept and rejected, parallel hits, rounds
// begun from a branch drafted ahead, and best branches that were the next round.
void CheckEveryPath(const DecodeCounts& c) {
  INFO("rounds " << c.rounds << " drafted " << c.drafted << " accepted " << c.accepted
                 << " rejections " << c.rejections << " hits " << c.hits);
  CHECK(c.accepted > 0);
  CHECK(c.rejections > 0);
  CHECK(c.hits > 0);
  CHECK(c.reused > 0);
  CHECK(c.reused <= c.hits);
  CHECK(c.ahead_kept > 0);
  CHECK(c.ahead_kept <= c.reused);
  CHECK(c.drafted > c.rounds);
}

// The greedy tests' prompts (p in [0, 6): 5 + p tokens of the 64-token model) and options
// (eta low enough to draft every round, 4-6 drafts a round, 3 candidates drafted 3 ahead).
std::vector<int64_t> TestPrompt(int p) {
  std::vector<int64_t> prompt;
  for (int i = 0; i < 5 + p; ++i) prompt.push_back((p * 7 + i * 13) % 64);
  return prompt;
}
SpeculativeOptions TestOptions(int p, bool parallel) {
  return {.eta = 1e-6, .max_draft = 4 + p % 3, .parallel = parallel, .parallel_top_k = 3,
          .parallel_steps = 3};
}

TEST_CASE("Speculative greedy decoding emits exactly plain greedy decoding and rolls every "
          "KV back to the accepted length",
          "[speculative]") {
  c10::InferenceMode inference;
  auto split = MakeSplit(/*vocab=*/64, /*logit_scale=*/25.0, /*adapter_noise=*/0.04, 5);
  DecodeCounts counts;
  for (const bool parallel : {false, true}) {
    for (int p = 0; p < 6; ++p) {
      INFO("parallel " << parallel << " prompt " << p);
      const std::vector<int64_t> prompt = TestPrompt(p);
      const int64_t new_tokens = 40;
      const SpeculativeOptions options = TestOptions(p, parallel);
      Session session(*split, options, SamplingParams{}, 128);
      const std::vector<int32_t> generated =
          DecodeGreedy(session, prompt, new_tokens, parallel, options.max_draft, counts);
      std::vector<double> margins;
      CheckAgainstReference(generated,
                            ReferenceGreedy(*split->full, prompt, new_tokens, {}, &margins),
                            margins);
    }
  }
  CheckEveryPath(counts);
}

TEST_CASE("With penalties on repetition, speculative greedy decoding is still plain greedy "
          "decoding with them",
          "[speculative]") {
  c10::InferenceMode inference;
  auto split = MakeSplit(/*vocab=*/64, /*logit_scale=*/25.0, /*adapter_noise=*/0.04, 5);
  // Strong enough to change what is generated (checked below), so that a verification row
  // penalised for the wrong history would show.
  const SamplingParams penalties{
      .presence_penalty = 1.5, .frequency_penalty = 1.0, .repetition_penalty = 1.5};
  DecodeCounts counts;
  int64_t changed = 0;
  for (int p = 0; p < 6; ++p) {
    INFO("prompt " << p);
    const std::vector<int64_t> prompt = TestPrompt(p);
    const int64_t new_tokens = 40;
    const SpeculativeOptions options = TestOptions(p, /*parallel=*/true);
    Session session(*split, options, penalties, 128);
    const std::vector<int32_t> generated =
        DecodeGreedy(session, prompt, new_tokens, /*parallel=*/true, options.max_draft, counts);
    std::vector<double> margins, plain_margins;
    const std::vector<int32_t> reference =
        ReferenceGreedy(*split->full, prompt, new_tokens, penalties, &margins);
    CheckAgainstReference(generated, reference, margins);
    changed += reference != ReferenceGreedy(*split->full, prompt, new_tokens, {}, &plain_margins);
  }
  CHECK(changed == 6);
  CheckEveryPath(counts);
}

// A vocabulary for the 64-token test model: ids 0-2 special (2 ends an answer), the rest
// pieces of JSON, some crossing its token boundaries.
std::shared_ptr<const TokenVocabulary> JsonTestVocabulary() {
  std::vector<std::optional<std::string>> tokens = {std::nullopt, std::nullopt, std::nullopt};
  for (const char* piece :
       {"{", "}", "[", "]", "\"", ":", ",", " ", "a", "b", "1", "2", "0", "-", ".", "e", "true",
        "false", "null", "{\"", "\":", "\",", "\"}", "ab", "12", "},", "]}", "[1", "\\", "n",
        "u", "\\n", "tr", "ue", "x", "y", "z", "\n", "key", "\"a\"", "c", "d", "f", "g", "h",
        "i", "j", "k", "l", "m", "o", "p", "q", "r", "s", "t", "v", "w", "E", "+", "9"}) {
    tokens.emplace_back(piece);
  }
  REQUIRE(tokens.size() == 64);
  return std::make_shared<const TokenVocabulary>(std::move(tokens));
}

// Plain greedy decoding with the monolithic model, each choice among the tokens that keep
// the answer possible, found by trying every token's bytes on `start`, a JsonGrammar or a
// SchemaGrammar (not through their constraint); `end` where the grammar may end, and once it
// is complete, or a token was refused, only `end`.
template <typename Grammar>
std::vector<int32_t> ReferenceJsonGreedy(const Submodel& full, const std::vector<int64_t>& prompt,
                                         int64_t count, const TokenVocabulary& vocabulary,
                                         int32_t end, std::vector<double>* margins,
                                         const Grammar& start) {
  KvCache cache = full.NewCache(static_cast<int64_t>(prompt.size()) + count + 1);
  at::Tensor hidden = *full.Forward(*full.Embed(at::tensor(prompt)), cache);
  std::vector<int32_t> out;
  std::optional<Grammar> state = start;
  for (int64_t i = 0; i < count; ++i) {
    at::Tensor logits = (*full.Logits(hidden.narrow(0, hidden.size(0) - 1, 1)))[0].clone();
    for (int32_t token = 0; token < logits.size(0); ++token) {
      bool allowed = token == end && (!state.has_value() || state->can_end());
      if (state.has_value() && !state->complete() && token != end) {
        Grammar next = *state;
        const std::string* bytes = vocabulary.bytes(token);
        allowed = bytes != nullptr && !bytes->empty() && next.Feed(*bytes);
      }
      if (!allowed) logits[token] = -std::numeric_limits<float>::infinity();
    }
    auto top = logits.topk(2);
    margins->push_back((std::get<0>(top)[0] - std::get<0>(top)[1]).item<double>());
    const auto token = static_cast<int32_t>(logits.argmax().item<int64_t>());
    out.push_back(token);
    const std::string* bytes = vocabulary.bytes(token);
    if (state.has_value() && (bytes == nullptr || !state->Feed(*bytes))) state.reset();
    hidden = *full.Forward(*full.Embed(at::full({1}, token, at::kLong)), cache);
  }
  return out;
}

// `generated` is the start of a value `grammar` takes, which may end where `end` came (the
// grammar's can_end: a JSON object's is complete()).
template <typename Grammar>
void CheckStartOfValue(const std::vector<int32_t>& generated, const TokenVocabulary& vocabulary,
                       int32_t end, Grammar grammar) {
  for (const int32_t token : generated) {
    if (token == end) {
      CHECK(grammar.can_end());
      return;
    }
    INFO("token " << token);
    REQUIRE(vocabulary.bytes(token) != nullptr);
    CHECK(grammar.Feed(*vocabulary.bytes(token)));
  }
}

// Speculative greedy decoding under `params`' format, on the 64-token test model over six
// prompts: each answer is plain greedy decoding under `start`'s grammar (the reference tries
// every token on it), and the start of a value it takes; the format changes every answer
// (it is not what the model says anyway), and every path of the decoder is taken. `ends`:
// every answer reaches the end within its 40 tokens. Returns how many tokens the format
// forced (appended as drafts without the drafter, and kept).
template <typename Grammar>
int64_t CheckConstrainedGreedy(const SamplingParams& params, const Grammar& start, bool ends) {
  c10::InferenceMode inference;
  auto split = MakeSplit(/*vocab=*/64, /*logit_scale=*/25.0, /*adapter_noise=*/0.04, 5);
  const auto vocabulary = JsonTestVocabulary();
  REQUIRE(params.stop_ids.size() == 1);
  const int32_t end = params.stop_ids[0];
  DecodeCounts counts;
  int64_t changed = 0;
  for (int p = 0; p < 6; ++p) {
    INFO("prompt " << p);
    const std::vector<int64_t> prompt = TestPrompt(p);
    const int64_t new_tokens = 40;
    const SpeculativeOptions options = TestOptions(p, /*parallel=*/true);
    Session session(*split, options, params, 128, vocabulary);
    const std::vector<int32_t> generated =
        DecodeGreedy(session, prompt, new_tokens, /*parallel=*/true, options.max_draft, counts);
    std::vector<double> margins, plain_margins;
    const std::vector<int32_t> reference =
        ReferenceJsonGreedy(*split->full, prompt, new_tokens, *vocabulary, end, &margins, start);
    CheckAgainstReference(generated, reference, margins);
    changed += reference != ReferenceGreedy(*split->full, prompt, new_tokens, {}, &plain_margins);
    // What was generated is the start of a value (up to the end, if it came).
    CheckStartOfValue(generated, *vocabulary, end, start);
    if (ends) CHECK(std::find(generated.begin(), generated.end(), end) != generated.end());
  }
  CHECK(changed == 6);
  CheckEveryPath(counts);
  return counts.forced;
}

TEST_CASE(
    "Constrained to a JSON object, speculative greedy decoding is still plain greedy "
    "decoding under the same constraint",
    "[speculative]") {
  CheckConstrainedGreedy(
      SamplingParams{.stop_ids = {2}, .response_format = ResponseFormat::kJsonObject},
      JsonGrammar(), /*ends=*/false);
}

TEST_CASE(
    "Constrained to a JSON Schema, speculative greedy decoding is still plain greedy "
    "decoding under the same constraint",
    "[speculative]") {
  // Keys the vocabulary spells, an integer, an array of booleans, and a nullable string.
  auto schema = CompiledSchema::Compile(nlohmann::json::parse(R"({
      "type": "object",
      "properties": {"a": {"type": "integer"},
                     "b": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
                     "key": {"type": ["string", "null"]}},
      "required": ["a", "b"], "additionalProperties": false})"));
  REQUIRE(schema.ok());
  // Where the schema leaves one token (a key's rest), the round takes it without the drafter.
  CHECK(CheckConstrainedGreedy(SamplingParams{.stop_ids = {2},
                                              .response_format = ResponseFormat::kJsonSchema,
                                              .json_schema = *schema},
                               SchemaGrammar(schema->get()), /*ends=*/false) > 0);
}

TEST_CASE(
    "Constrained to a regex, speculative greedy decoding is still plain greedy decoding "
    "under the same constraint",
    "[speculative]") {
  // Letters and spaces the model chooses among (so that drafts are sometimes rejected), a
  // separator of two tokens, and an end that stops any further byte: bounded, so every
  // answer ends within its tokens.
  auto regex = CompileRegexFormat(R"(key: [a-z ]{3,24}(, [a-z0-9]{1,4}){0,4}\.)");
  REQUIRE(regex.ok());
  CHECK(CheckConstrainedGreedy(
            SamplingParams{
                .stop_ids = {2}, .response_format = ResponseFormat::kRegex, .regex = *regex},
            RegexGrammar(regex->get()), /*ends=*/true) > 0);
}

TEST_CASE(
    "Constrained to a GBNF grammar, speculative greedy decoding is still plain greedy decoding "
    "under the same constraint",
    "[speculative]") {
  // Recursive, each list nesting the next with its "]" owed (a real stack of calls; the model
  // goes on nesting, so no answer ends within its tokens), alternatives that share their start
  // (both followed until ", [" or what follows the list tells them apart), and spelled by the
  // vocabulary's letters, brackets and separators.
  auto grammar = EbnfGrammar::Compile(R"(
      root ::= "key: " list "."          # a full stop ends it
      list ::= item | item ", [" list "]"  # each list nests the next: its "]" is owed
      item ::= [a-z] [a-z ]{0,11})");
  REQUIRE(grammar.ok());
  EbnfWorkspace workspace(grammar->get());  // the reference's, apart from the decoder's
  CHECK(CheckConstrainedGreedy(
            SamplingParams{
                .stop_ids = {2}, .response_format = ResponseFormat::kGrammar, .grammar = *grammar},
            EbnfState(&workspace), /*ends=*/false) > 0);
}

TEST_CASE(
    "Constrained to a structural tag, speculative greedy decoding is still plain greedy "
    "decoding under the same constraint",
    "[speculative]") {
  // Free text in which each of five bytes the test model writes often must go on as '"', a
  // bounded integer and '"]': drafts cross into and out of structures (every answer is
  // changed by them), and the answer may end only outside one.
  auto schema =
      CompiledSchema::CompileShared(nlohmann::json::parse(R"({"type": "integer", "minimum": 0,
                                                               "maximum": 99})"));
  REQUIRE(schema.ok());
  std::vector<StructuralTagStructure> structures;
  std::vector<std::string> triggers;
  for (const char* trigger : {"x", "e", "a", "1", "t"}) {
    structures.push_back({.begin = absl::StrCat(trigger, "\""), .schema = *schema, .end = "\"]"});
    triggers.emplace_back(trigger);
  }
  auto spec = StructuralTagSpec::Create(std::move(structures), std::move(triggers));
  REQUIRE(spec.ok());
  CHECK(CheckConstrainedGreedy(SamplingParams{.stop_ids = {2},
                                              .response_format = ResponseFormat::kStructuralTag,
                                              .structural_tag = *spec},
                               StructuralTagGrammar(spec->get()), /*ends=*/false) > 0);
}

// The greedy answer to `prompt` under `regex` (end id 2), one sequential round after another
// until the end or `max_tokens`, each round's outcome passed to `each`; the tokens up to the
// end, which it includes.
std::vector<int32_t> GreedyRegexAnswer(const Split& split, const SpeculativeOptions& options,
                                       std::shared_ptr<const StringPattern> regex,
                                       std::shared_ptr<const TokenVocabulary> vocabulary,
                                       const std::vector<int64_t>& prompt, int64_t max_tokens,
                                       const std::function<void(const RoundOutcome&)>& each) {
  const SamplingParams params{
      .stop_ids = {2}, .response_format = ResponseFormat::kRegex, .regex = std::move(regex)};
  Session session(split, options, params, 128, std::move(vocabulary));
  session.sampler.SetPrompt(std::vector<int32_t>(prompt.begin(), prompt.end()));
  std::vector<int32_t> generated = {session.sampler.Sample(session.Prefill(prompt))};
  session.sampler.Commit(generated);
  const auto ended = [&] { return absl::c_linear_search(generated, 2); };
  while (!ended() && static_cast<int64_t>(generated.size()) < max_tokens) {
    const int64_t room = max_tokens - static_cast<int64_t>(generated.size());
    const RoundOutcome outcome = session.Round(generated.back(), room, /*ahead=*/false);
    each(outcome);
    session.sampler.Commit(outcome.tokens);
    generated.insert(generated.end(), outcome.tokens.begin(), outcome.tokens.end());
  }
  REQUIRE(ended());
  generated.erase(std::find(generated.begin(), generated.end(), 2) + 1, generated.end());
  return generated;
}

TEST_CASE(
    "Tokens the format allows alone go to the cloud in one round, with the drafter or "
    "without, greedy or sampled",
    "[speculative]") {
  c10::InferenceMode inference;
  auto split = MakeSplit(/*vocab=*/64, /*logit_scale=*/25.0, /*adapter_noise=*/0.04, 5);
  const auto vocabulary = JsonTestVocabulary();
  // "zyx-wvp " is spelled one way only (no token of the vocabulary joins any of its letters),
  // so after the first of them the regex allows one token at a time: 7 forced tokens, then
  // words the model chooses, each followed by " zyx", forced after its space: forced tokens
  // in the middle of rounds and of branches drafted ahead.
  auto regex = CompileRegexFormat(R"(zyx-wvp( [a-z]{1,4} zyx){3,6}\.)");
  REQUIRE(regex.ok());
  std::vector<int32_t> literal;
  for (const std::string piece : {"z", "y", "x", "-", "w", "v", "p", " "}) {
    for (int32_t id = 0; id < vocabulary->size(); ++id) {
      if (vocabulary->bytes(id) != nullptr && *vocabulary->bytes(id) == piece)
        literal.push_back(id);
    }
  }
  REQUIRE(literal.size() == 8);
  const std::vector<int64_t> prompt = TestPrompt(2);
  // Each (seed, drafting, temperature)'s answer; with drafting ahead, rounds begin from
  // branches, and a seed's answer must not depend on that.
  std::map<std::tuple<uint64_t, bool, double>, std::vector<int32_t>> answers;
  std::map<bool, int64_t> greedy_rounds;  // by drafting, with jump-forward
  int64_t sampled_hits = 0;
  for (const uint64_t seed : {11, 12, 13, 14, 15, 16, 17, 18}) {
    for (const bool ahead : {false, true}) {
      for (const bool drafting : {true, false}) {
        if (ahead && !drafting) continue;
        for (const double temperature : {0.0, 0.2}) {
          if (temperature == 0 && seed != 11) continue;  // greedy: one seed is every seed
          INFO("seed " << seed << ", drafting " << drafting << ", ahead " << ahead
                       << ", temperature " << temperature);
          const SamplingParams params{.temperature = temperature,
                                      .seed = seed,
                                      .stop_ids = {2},
                                      .response_format = ResponseFormat::kRegex,
                                      .regex = *regex};
          SpeculativeOptions options = TestOptions(2, /*parallel=*/ahead);
          options.enabled = drafting;
          Session session(*split, options, params, 128, vocabulary);
          REQUIRE(session.decoder.drafting() == drafting);
          session.sampler.SetPrompt(std::vector<int32_t>(prompt.begin(), prompt.end()));
          std::vector<int32_t> generated = {session.sampler.Sample(session.Prefill(prompt))};
          session.sampler.Commit(generated);
          REQUIRE(generated[0] == literal[0]);
          // The first round takes the other 7 whatever the drafter would have guessed, and more
          // than max_draft (6) of them: the drafter's window is for its guesses only.
          const RoundOutcome first = session.Round(generated.back(), /*room=*/30, ahead);
          CHECK(first.forced_accepted >= 7);
          CHECK(first.forced_accepted <= first.forced_drafted);
          REQUIRE(first.tokens.size() >= 8);
          CHECK(std::vector<int32_t>(first.tokens.begin(), first.tokens.begin() + 7) ==
                std::vector<int32_t>(literal.begin() + 1, literal.end()));
          if (!drafting) {
            CHECK(first.drafted == 7);
            CHECK(first.forced_drafted == 7);
          }
          session.sampler.Commit(first.tokens);
          generated.insert(generated.end(), first.tokens.begin(), first.tokens.end());
          // The answer goes on as the regex allows, to its end.
          const auto ended = [&] { return absl::c_linear_search(generated, 2); };
          int64_t rounds = 1;
          for (; rounds <= 60 && !ended(); ++rounds) {
            const int64_t room = 60 - static_cast<int64_t>(generated.size());
            const RoundOutcome outcome = session.Round(generated.back(), room, ahead);
            session.sampler.Commit(outcome.tokens);
            generated.insert(generated.end(), outcome.tokens.begin(), outcome.tokens.end());
          }
          if (temperature == 0 && !ahead) greedy_rounds[drafting] = rounds;
          // Drafts past the end may be kept too; the agent stops at the end.
          REQUIRE(ended());
          generated.erase(std::find(generated.begin(), generated.end(), 2) + 1, generated.end());
          if (ahead) {
            if (temperature > 0) sampled_hits += session.reused;
            CHECK(generated == answers[{seed, drafting, temperature}]);
          } else {
            answers[{seed, drafting, temperature}] = generated;
          }
          std::string text;
          for (size_t i = 0; i + 1 < generated.size(); ++i) {
            REQUIRE(vocabulary->bytes(generated[i]) != nullptr);
            text += *vocabulary->bytes(generated[i]);
          }
          CHECK(std::regex_match(text, std::regex(R"(zyx-wvp( [a-z]{1,4} zyx){3,6}\.)")));
        }
      }
    }
  }
  // Rounds begun from branches drafted ahead, the case the comparison is for.
  CHECK(sampled_hits >= 5);

  // Jump-forward off (speculative.jump_forward: false): the same greedy answers, with no
  // forced drafts, in more rounds; without the drafter, one token a round.
  for (const bool drafting : {true, false}) {
    INFO("jump-forward off, drafting " << drafting);
    SpeculativeOptions options = TestOptions(2, /*parallel=*/false);
    options.enabled = drafting;
    options.jump_forward = false;
    int64_t rounds = 0;
    const std::vector<int32_t> answer = GreedyRegexAnswer(
        *split, options, *regex, vocabulary, prompt, 200, [&](const RoundOutcome& outcome) {
          ++rounds;
          CHECK(outcome.forced_drafted == 0);
          if (!drafting) CHECK(outcome.drafted == 0);
        });
    CHECK(answer == answers[{11, drafting, 0.0}]);
    CHECK(rounds > greedy_rounds[drafting]);
  }
}

TEST_CASE(
    "Without the drafter, a guess at a literal's spelling goes as a draft the verification "
    "keeps or refuses, and greedy answers stay plain greedy decoding's",
    "[speculative]") {
  c10::InferenceMode inference;
  auto split = MakeSplit(/*vocab=*/64, /*logit_scale=*/25.0, /*adapter_noise=*/0.04, 5);
  const auto vocabulary = JsonTestVocabulary();
  // "k" and "key" both start "key", "t", "tr" and "true" "true": guesses, not the only
  // token allowed; the model may spell them either way.
  auto regex = CompileRegexFormat(R"(keytrue( [a-z]{1,4} key){2,5}\.)");
  REQUIRE(regex.ok());
  int64_t guessed = 0;
  int64_t refused = 0;
  for (int p = 0; p < 6; ++p) {
    INFO("prompt " << p);
    std::map<bool, std::vector<int32_t>> answers;
    for (const bool jump_forward : {false, true}) {
      SpeculativeOptions options = TestOptions(p, /*parallel=*/false);
      options.enabled = false;
      options.jump_forward = jump_forward;
      answers[jump_forward] = GreedyRegexAnswer(*split, options, *regex, vocabulary, TestPrompt(p),
                                                100, [&](const RoundOutcome& outcome) {
                                                  CHECK(outcome.accepted <= outcome.drafted);
                                                  if (!jump_forward) return;
                                                  guessed += outcome.forced_drafted;
                                                  // Without the drafter every draft is the
                                                  // format's: one not kept is a guess refused.
                                                  refused +=
                                                      outcome.accepted < outcome.drafted ? 1 : 0;
                                                });
    }
    CHECK(answers[true] == answers[false]);
  }
  INFO(guessed << " guesses drafted, " << refused << " refused");
  CHECK(guessed > 0);
  CHECK(refused > 0);
}

// How many drafts a greedy drafter makes after `tokens` (the round's first token last) before
// its top probability falls below `eta` or it reaches `limit`, recomputed from scratch.
// `closest` gets the smallest |confidence - eta| it met, to skip rounds that a rounding
// difference between this and the decoder's incremental pass could decide either way.
int64_t ExpectedDrafts(const Split& split, std::vector<int64_t> tokens, double eta, int64_t limit,
                       double* closest) {
  int64_t drafts = 0;
  while (drafts < limit) {
    const auto length = static_cast<int64_t>(tokens.size());
    KvCache input_cache = split.input->NewCache(length);
    KvCache adapter_cache = split.adapter->NewCache(length);
    const at::Tensor shallow =
        *split.input->Forward(*split.input->Embed(at::tensor(tokens)), input_cache);
    const at::Tensor adapted = *split.adapter->Forward(shallow, adapter_cache);
    const at::Tensor logits = (*split.output->Logits(adapted.narrow(0, length - 1, 1)))[0];
    const double confidence = at::softmax(logits, 0).max().item<double>();
    *closest = std::min(*closest, std::abs(confidence - eta));
    if (confidence < eta) break;
    tokens.push_back(logits.argmax().item<int64_t>());
    ++drafts;
  }
  return drafts;
}

TEST_CASE("Drafting stops where the drafter's top probability falls below eta", "[speculative]") {
  c10::InferenceMode inference;
  auto split = MakeSplit(/*vocab=*/64, /*logit_scale=*/25.0, /*adapter_noise=*/0.04, 5);
  int64_t stopped_by_eta = 0;
  int64_t stopped_by_limit = 0;
  std::map<double, int64_t> drafted_at;
  for (const double eta : {0.3, 0.6, 0.9, 1.01}) {
    for (int p = 0; p < 3; ++p) {
      INFO("eta " << eta << " prompt " << p);
      std::vector<int64_t> prompt;
      for (int i = 0; i < 5 + p; ++i) prompt.push_back((p * 11 + i * 7) % 64);
      const int64_t new_tokens = 30;
      const SpeculativeOptions options{.eta = eta, .max_draft = 6, .parallel = false};
      Session session(*split, options, SamplingParams{}, 128);
      std::vector<int32_t> generated = {
          static_cast<int32_t>(session.Prefill(prompt).argmax().item<int64_t>())};
      while (static_cast<int64_t>(generated.size()) < new_tokens) {
        const int64_t room = new_tokens - static_cast<int64_t>(generated.size()) - 1;
        std::vector<int64_t> context = prompt;
        context.insert(context.end(), generated.begin(), generated.end());
        const RoundOutcome outcome = session.Round(generated.back(), room, false);
        const int64_t limit = std::min<int64_t>(room, options.max_draft);
        double closest = 1;
        const int64_t expected = ExpectedDrafts(*split, context, eta, limit, &closest);
        INFO("round at " << context.size() << ": drafted " << outcome.drafted << ", expected "
                         << expected << " of " << limit);
        if (closest > 1e-4) CHECK(outcome.drafted == expected);
        (expected < limit ? stopped_by_eta : stopped_by_limit) += 1;
        drafted_at[eta] += outcome.drafted;
        generated.insert(generated.end(), outcome.tokens.begin(), outcome.tokens.end());
      }
    }
  }
  INFO("rounds stopped by eta " << stopped_by_eta << ", by the limit " << stopped_by_limit);
  // Both ways of ending a round happened, a stricter eta drafted less, and no probability
  // reaches 1.01.
  CHECK(stopped_by_eta > 0);
  CHECK(stopped_by_limit > 0);
  CHECK(drafted_at[0.3] >= drafted_at[0.6]);
  CHECK(drafted_at[0.6] >= drafted_at[0.9]);
  CHECK(drafted_at[0.3] > drafted_at[0.9]);
  CHECK(drafted_at[0.9] > 0);
  CHECK(drafted_at[1.01] == 0);
}

// Total-variation distance between two distributions over the same support.
double TotalVariation(const at::Tensor& a, const at::Tensor& b) {
  return 0.5 * (a - b).abs().sum().item<double>();
}

TEST_CASE("Speculative sampling keeps the target's next-token distribution", "[speculative]") {
  c10::InferenceMode inference;
  const int64_t vocab = 8;
  auto split = MakeSplit(vocab, /*logit_scale=*/40.0, /*adapter_noise=*/0.3, 11);
  const std::vector<int64_t> prompt = {1, 5, 3};
  const int32_t token = 4;
  const SamplingParams base{.temperature = 1.0};

  // The target's and the drafter's distributions for the token after prompt + token.
  at::Tensor target;
  at::Tensor draft;
  {
    Session session(*split, {.eta = 1e-6, .max_draft = 1, .parallel = false}, base, 16);
    session.Prefill(prompt);
    KvCache cache = split->full->NewCache(16);
    std::vector<int64_t> all = prompt;
    all.push_back(token);
    at::Tensor hidden = *split->full->Forward(*split->full->Embed(at::tensor(all)), cache);
    target = at::softmax((*split->full->Logits(hidden.narrow(0, 3, 1)))[0], 0);
    KvCache input_cache = split->input->NewCache(16);
    at::Tensor shallow = *split->input->Forward(*split->input->Embed(at::tensor(all)), input_cache);
    KvCache adapter_cache = split->adapter->NewCache(16);
    at::Tensor adapted = *split->adapter->Forward(shallow, adapter_cache);
    draft = at::softmax((*split->output->Logits(adapted.narrow(0, 3, 1)))[0], 0);
  }
  // If drafts were kept unconditionally the output would follow the drafter; the test only
  // means something when the two are far apart.
  const double gap = TotalVariation(target, draft);
  INFO("TV(target, drafter) = " << gap);
  REQUIRE(gap > 0.2);

  const int trials = 3000;
  at::Tensor counts = at::zeros({vocab}, at::kDouble);
  int64_t kept = 0;
  for (int t = 0; t < trials; ++t) {
    SamplingParams params = base;
    params.seed = 1000 + static_cast<uint64_t>(t);
    Session session(*split, {.eta = 1e-6, .max_draft = 2, .parallel = false}, params, 16);
    session.Prefill(prompt);
    const RoundOutcome outcome = session.Round(token, /*room=*/4, false);
    REQUIRE(outcome.drafted >= 1);
    kept += outcome.accepted > 0;
    counts[outcome.tokens[0]] += 1;
  }
  const at::Tensor observed = counts / static_cast<double>(trials);
  const double tv = TotalVariation(observed, target.to(at::kDouble));
  INFO("TV(sampled, target) = " << tv << ", drafts kept in " << kept << " of " << trials);
  // Sampling noise over 8 outcomes and 3000 trials is about 0.02.
  CHECK(tv < 0.06);
  CHECK(kept > 0);
  CHECK(kept < trials);
}


// The cloud as a decode round sees it, in process and deterministic: chunks and truncates
// queue in stream order, and the cloud answers the head of the queue `answer_after` polls
// after the round starts waiting (each non-blocking Pump is one poll, and the round drafts
// ahead between polls), or at once when the round blocks. Results of chunks numbered below
// the last truncate are dropped, as the agent drops them.
class InProcessCloud final : public CloudSession {
 public:
  InProcessCloud(Session& session, DecodeRounds& rounds, int64_t length, int answer_after)
      : session_(session), rounds_(rounds), sent_(length), consumed_(length),
        answer_after_(answer_after) {}

  void SendDecodeRows(int64_t start, const at::Tensor& rows) override {
    queue_.push_back(Chunk{++sequence_, start, rows.clone()});
    sent_ = start + rows.size(0);
  }
  void SendAheadRows(int64_t start, const at::Tensor& rows) override {
    SendDecodeRows(start, rows);
  }
  void KeepAheadRows() override {}
  int64_t sent() const override { return sent_; }
  int64_t consumed() const override { return consumed_; }
  void RollBack(int64_t length) override {
    if (length < sent_) {
      queue_.push_back(Truncate{++sequence_, length});
      stale_below_ = sequence_;
    }
    sent_ = consumed_ = length;
  }
  absl::Status Pump(int64_t target, bool block) override {
    while (consumed_ < target) {
      if (!block && ++polls_ < answer_after_) return absl::OkStatus();
      polls_ = 0;
      if (queue_.empty()) return absl::InternalError("waiting for positions nobody sent");
      auto item = std::move(queue_.front());
      queue_.pop_front();
      if (auto* truncate = std::get_if<Truncate>(&item)) {
        if (!session_.middle_cache.Truncate(truncate->length).ok()) {
          return absl::InternalError("truncate past the cloud's KV");
        }
        continue;
      }
      const Chunk& chunk = std::get<Chunk>(item);
      if (session_.middle_cache.length() != chunk.start) {
        return absl::InternalError(absl::StrCat("chunk at ", chunk.start, " but the cloud's KV holds ",
                                                session_.middle_cache.length()));
      }
      auto deep = session_.split.middle->Forward(chunk.rows, session_.middle_cache);
      if (!deep.ok()) return deep.status();
      ++computed_chunks_;
      if (chunk.sequence < stale_below_) continue;  // cancelled: its result is dropped
      if (chunk.start != consumed_) return absl::InternalError("a result out of order");
      auto out = session_.split.output->Forward(*deep, session_.output_cache);
      if (!out.ok()) return out.status();
      rounds_.AddOutputStates(*out);
      consumed_ += chunk.rows.size(0);
    }
    return absl::OkStatus();
  }
  int64_t computed_chunks() const { return computed_chunks_; }

 private:
  struct Chunk {
    uint64_t sequence;
    int64_t start;
    at::Tensor rows;
  };
  struct Truncate {
    uint64_t sequence;
    int64_t length;
  };
  Session& session_;
  DecodeRounds& rounds_;
  std::deque<std::variant<Chunk, Truncate>> queue_;
  uint64_t sequence_ = 0;
  uint64_t stale_below_ = 0;
  int64_t sent_, consumed_;
  int answer_after_;
  int polls_ = 0;
  int64_t computed_chunks_ = 0;
};

struct PipelinedRun {
  std::vector<int32_t> tokens;
  v1::RequestStats stats;
};

// Greedy decoding through DecodeRounds with runs sent ahead (PipeInfer), against the cloud
// above; `min_keep_rate` is speculative.ahead_min_keep_rate.
PipelinedRun DecodeWithRunsAhead(const Split& split, const std::vector<int64_t>& prompt,
                                 int64_t new_tokens, double min_keep_rate) {
  SpeculativeOptions options{.eta = 1e-6, .max_draft = 4, .parallel = true,
                             .parallel_top_k = 2, .parallel_steps = 3};
  Session session(split, options, SamplingParams{}, 256);
  std::vector<int32_t> generated = {
      static_cast<int32_t>(session.Prefill(prompt).argmax().item<int64_t>())};
  RequestStatsRecorder stats(nullptr, std::chrono::steady_clock::now());
  DecodeRounds rounds(session.decoder, stats,
                      {.max_draft_tokens = 4, .trace = true, .send_ahead = true,
                       .ahead_min_keep_rate = min_keep_rate});
  InProcessCloud cloud(session, rounds, static_cast<int64_t>(prompt.size()), /*answer_after=*/12);
  while (static_cast<int64_t>(generated.size()) < new_tokens) {
    const int64_t room = new_tokens - static_cast<int64_t>(generated.size()) - 1;
    auto outcome = rounds.Run(generated.back(), room, cloud);
    INFO(outcome.status().ToString());
    REQUIRE(outcome.ok());
    generated.insert(generated.end(), outcome->tokens.begin(), outcome->tokens.end());
    // Every cache, the cloud's included once its queue is applied, ends at the kept length.
    CHECK(session.output_cache.length() == outcome->length);
  }
  generated.resize(new_tokens);
  return {generated, stats.Finish(v1::FINISH_REASON_LENGTH, {})};
}

TEST_CASE("Runs sent ahead of their verification change no token, are kept or cancelled, and "
          "stop where they do not pay",
          "[speculative]") {
  c10::InferenceMode inference;
  std::vector<int64_t> prompt;
  for (int i = 0; i < 7; ++i) prompt.push_back((i * 13 + 3) % 64);
  const int64_t new_tokens = 48;
  // A drafter that mostly agrees: runs go ahead, most are kept, some are cancelled.
  {
    auto split = MakeSplit(/*vocab=*/64, /*logit_scale=*/25.0, /*adapter_noise=*/0.04, 5);
    std::vector<double> margins;
    const std::vector<int32_t> reference =
        ReferenceGreedy(*split->full, prompt, new_tokens, {}, &margins);
    const PipelinedRun run = DecodeWithRunsAhead(*split, prompt, new_tokens, 0.5);
    for (int64_t i = 0; i < new_tokens; ++i) {
      if (run.tokens[i] == reference[i]) continue;
      INFO("token " << i << ": " << run.tokens[i] << " vs " << reference[i]);
      CHECK(margins[i] < 1e-3);  // only a near-tie may flip (batched vs one-row rounding)
      break;
    }
    INFO("sent " << run.stats.ahead_runs_sent() << " kept " << run.stats.ahead_runs_kept());
    CHECK(run.stats.ahead_runs_kept() > 0);
    CHECK(run.stats.ahead_runs_kept() < run.stats.ahead_runs_sent());
    int64_t began_at_cloud = 0;
    for (const v1::DecodeRound& round : run.stats.rounds()) {
      began_at_cloud += round.rows_at_cloud_before() > 0;
    }
    CHECK(began_at_cloud == run.stats.ahead_runs_kept());
  }
  // A drafter that mostly disagrees: with a minimum keep rate of one half the request soon
  // stops sending runs ahead; with none it keeps sending them; the tokens are the same.
  {
    auto split = MakeSplit(/*vocab=*/64, /*logit_scale=*/25.0, /*adapter_noise=*/0.5, 9);
    const PipelinedRun always = DecodeWithRunsAhead(*split, prompt, new_tokens, 0.0);
    const PipelinedRun gated = DecodeWithRunsAhead(*split, prompt, new_tokens, 0.5);
    CHECK(gated.tokens == always.tokens);
    INFO("always: sent " << always.stats.ahead_runs_sent() << " kept "
                         << always.stats.ahead_runs_kept() << "; gated: sent "
                         << gated.stats.ahead_runs_sent());
    CHECK(always.stats.ahead_runs_kept() * 2 < always.stats.ahead_runs_sent());
    CHECK(gated.stats.ahead_runs_sent() * 2 < always.stats.ahead_runs_sent());
  }
}

}  // namespace
}  // namespace tophat
