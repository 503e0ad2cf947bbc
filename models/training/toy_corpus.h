// The synthetic corpus the toy model is trained on: a small probabilistic grammar of
// English-like sentences with strong regularities (agreement between subjects, verbs and
// objects; counting; fixed phrases), so that a small model learns predictions far from
// uniform, which speculative decoding needs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tophat {

// `count` documents of a few sentences each, deterministic for a given seed.
std::vector<std::string> GenerateToyCorpus(uint64_t seed, int64_t count);

// Prompts drawn from the same grammar (sentence openings), for demos and benchmarks.
std::vector<std::string> ToyPrompts(uint64_t seed, int64_t count);

}  // namespace tophat
