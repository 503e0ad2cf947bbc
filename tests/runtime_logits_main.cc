// tophat-runtime-logits: what tophat's model runtime computes for given token ids, for
// tests/hf_reference_test.py to hold against Hugging Face transformers.
//
//   tophat-runtime-logits --model DIR --tokens 1,2,3 [-m M] [-k K] [--greedy N] --out FILE.json
//
// In float32 on the CPU it writes, for every position of the tokens, the logits of
//   full:        the monolithic model (Submodel::Full), the whole sequence in one forward;
//   split:       input [0, M) -> middle [M, L-K) -> output [L-K, L), each with its own KV
//                cache, as on the device and the cloud;
//   incremental: the same split pipeline fed one token, then 7 as a chunk, then one token a
//                step: chunked prefill and decode through the KV caches;
// and the N greedy tokens that follow the tokens (the whole sequence as the prompt), from
// the full model and from the split pipeline (PipelineGenerator, no stop tokens).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/program.h"
#include "base/status_macros.h"
#include "models/formats/checkpoint.h"
#include "models/formats/config.h"
#include "models/runtime/generate.h"
#include "models/runtime/submodel.h"

namespace tophat {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Options {
  fs::path model;
  std::string tokens;
  int64_t input_layers = 1;
  int64_t output_layers = 1;
  int64_t greedy = 0;
  fs::path out;
};

absl::StatusOr<std::vector<int32_t>> ParseTokens(const std::string& text) {
  std::vector<int32_t> tokens;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens: '", piece, "' is not a token id"));
    }
    tokens.push_back(id);
  }
  if (tokens.empty()) return absl::InvalidArgumentError("--tokens: no token ids");
  return tokens;
}

json Rows(const at::Tensor& logits) {
  const at::Tensor t = logits.to(at::kFloat).contiguous();
  json rows = json::array();
  for (int64_t i = 0; i < t.size(0); ++i) {
    const float* row = t[i].data_ptr<float>();
    rows.push_back(std::vector<float>(row, row + t.size(1)));
  }
  return rows;
}

absl::StatusOr<json> Run(const Options& options) {
  TOPHAT_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, ParseTokens(options.tokens));
  TOPHAT_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(options.model / "config.json"));
  TOPHAT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> checkpoint,
                          CheckpointReader::Open(options.model));
  const int64_t m = options.input_layers;
  const int64_t k = options.output_layers;
  if (m < 1 || k < 0 || m + k > config.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("-m ", m, " -k ", k, " do not fit ", config.num_hidden_layers, " layers"));
  }
  const SubmodelOptions float32{.dtype = at::kFloat, .device = at::kCPU};
  TOPHAT_ASSIGN_OR_RETURN(auto full,
                          Submodel::Load(config, *checkpoint, SubmodelSpec::Full(config), float32));
  TOPHAT_ASSIGN_OR_RETURN(auto input,
                          Submodel::Load(config, *checkpoint, SubmodelSpec::Input(m), float32));
  TOPHAT_ASSIGN_OR_RETURN(auto middle, Submodel::Load(config, *checkpoint,
                                                      SubmodelSpec::Middle(config, m, k), float32));
  TOPHAT_ASSIGN_OR_RETURN(
      auto output, Submodel::Load(config, *checkpoint, SubmodelSpec::Output(config, k), float32));

  TOPHAT_ASSIGN_OR_RETURN(PipelineGenerator whole, PipelineGenerator::Create({full.get()}));
  TOPHAT_ASSIGN_OR_RETURN(PipelineGenerator split,
                          PipelineGenerator::Create({input.get(), middle.get(), output.get()}));
  json out;
  out["tokens"] = tokens;
  out["m"] = m;
  out["k"] = k;
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor full_logits, whole.Step(tokens));
  out["full"] = Rows(full_logits);
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor split_logits, split.Step(tokens));
  out["split"] = Rows(split_logits);

  split.Reset();
  std::vector<at::Tensor> pieces;
  size_t begin = 0;
  while (begin < tokens.size()) {
    const size_t n = begin == 1 ? std::min<size_t>(7, tokens.size() - begin) : 1;
    TOPHAT_ASSIGN_OR_RETURN(
        at::Tensor piece,
        split.Step(std::vector<int32_t>(tokens.begin() + begin, tokens.begin() + begin + n)));
    pieces.push_back(piece);
    begin += n;
  }
  out["incremental"] = Rows(at::cat(pieces));

  const GenerationOptions greedy{.max_new_tokens = options.greedy};
  TOPHAT_ASSIGN_OR_RETURN(GenerationResult full_greedy, whole.Generate(tokens, greedy));
  TOPHAT_ASSIGN_OR_RETURN(GenerationResult split_greedy, split.Generate(tokens, greedy));
  out["greedy_full"] = full_greedy.tokens;
  out["greedy_split"] = split_greedy.tokens;
  out["config"] = config.ToJson();
  return out;
}

}  // namespace
}  // namespace tophat

int main(int argc, char** argv) {
  tophat::Options options;
  CLI::App app{"Logits and greedy tokens of tophat's model runtime (float32, CPU), as JSON"};
  app.add_option("--model", options.model, "Hugging Face checkpoint directory")->required();
  app.add_option("--tokens", options.tokens, "comma-separated token ids")->required();
  app.add_option("-m", options.input_layers, "input submodel's layers");
  app.add_option("-k", options.output_layers, "output submodel's layers");
  app.add_option("--greedy", options.greedy, "greedy tokens to generate after the tokens");
  app.add_option("--out", options.out, "JSON file to write")->required();
  CLI11_PARSE(app, argc, argv);

  auto result = tophat::Run(options);
  if (!result.ok()) return tophat::Fail(result.status());
  std::ofstream out(options.out);
  out << result->dump() << "\n";
  if (!out) {
    return tophat::Fail(absl::InternalError(absl::StrCat(options.out.string(), ": write failed")));
  }
  return 0;
}
