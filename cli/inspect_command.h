// `tophat inspect`: what tophat makes of a Hugging Face checkpoint before anyone splits or
// serves it. Each part is read by the code that serving reads it with (ModelConfig,
// CheckpointReader, Tokenizer, ChatTemplate, Submodel::ArchitectureRunsOn), so its verdicts
// and errors are the ones `tophat split`, tophat-cloud and tophat-agent would give:
// the architecture and the features it turns on (windows, rotary, caps), the weights as
// stored, the tokenizer, the chat template's family, whether a GPU cloud computes it, and for
// a split (m, k) the bytes each side holds and reads a token.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"

namespace tophat::cli {

struct InspectArgs {
  std::filesystem::path model;
  int64_t input_layers = 2;   // m
  int64_t output_layers = 1;  // k
  bool json = false;
};

// The checkpoint in `args.model`, as JSON: config errors, and missing or unreadable weights,
// are errors (naming file and key or tensor); a tokenizer or chat template tophat cannot read
// is reported in the result, as serving reports it when a request needs it.
absl::StatusOr<nlohmann::json> InspectCheckpoint(const InspectArgs& args);

// The lines a person reads, from InspectCheckpoint's JSON.
std::string FormatInspection(const nlohmann::json& inspection);

// Prints the inspection (or its JSON); 0, or 1 with the error on stderr.
int RunInspect(const InspectArgs& args);

}  // namespace tophat::cli
