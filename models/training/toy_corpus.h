// The synthetic corpus the toy model is trained on: a small probabilistic grammar of
// English-like sentences with strong regularities (agreement between subjects, verbs and
// objects; counting; fixed phrases), so that a small model learns predictions far from
// uniform, which speculative decoding needs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tophat {

// `count` documents of a few sentences each, deterministic for a given seed.
std::vector<std::string> GenerateToyCorpus(uint64_t seed, int64_t count);

// Prompts drawn from the same grammar (sentence openings), for demos and benchmarks.
std::vector<std::string> ToyPrompts(uint64_t seed, int64_t count);

// Prompts whose answers are made of independent points (outline-based parallel decoding):
// "stories of the cat , the robot and the baker ." The corpus answers them with
// " outline : one cat two robot three baker . point one cat : <a sentence about the cat> ...
// end ."
std::vector<std::string> ToyOutlinePrompts(uint64_t seed, int64_t count);

// Whether `sentence` is one of the grammar's action sentences about the creature `noun`
// ("the sleepy cat chased the mouse in the garden ."): an expansion valid for its point.
bool IsToySentenceAbout(std::string_view sentence, std::string_view noun);

// An answer in the corpus's outline form scored point by point: each "point <number> <noun> :"
// and whether the sentence after it (up to its ".") is valid for that creature.
struct ToyOutlineScore {
  int points = 0;
  int valid = 0;
};
ToyOutlineScore ScoreToyOutlineAnswer(std::string_view answer);

}  // namespace tophat
