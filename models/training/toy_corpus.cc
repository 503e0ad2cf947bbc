#include "models/training/toy_corpus.h"

#include <array>
#include <random>
#include <string_view>

namespace tophat {
namespace {

struct Creature {
  std::string_view noun;
  std::array<std::string_view, 3> adjectives;
  std::array<std::string_view, 3> verbs;     // past tense, transitive
  std::array<std::string_view, 3> objects;
  std::array<std::string_view, 2> places;
};

// Each subject prefers its own adjectives, verbs, objects and places: a model that has
// learned the grammar predicts most continuations with high confidence.
constexpr std::array<Creature, 10> kCreatures = {{
    {"cat", {"small", "grey", "sleepy"}, {"chased", "watched", "caught"},
     {"mouse", "ball", "bird"}, {"garden", "kitchen"}},
    {"dog", {"big", "brown", "happy"}, {"fetched", "buried", "found"},
     {"stick", "bone", "ball"}, {"park", "yard"}},
    {"bird", {"little", "blue", "quick"}, {"built", "carried", "sang"},
     {"nest", "twig", "song"}, {"tree", "sky"}},
    {"farmer", {"old", "tired", "kind"}, {"planted", "harvested", "sold"},
     {"corn", "wheat", "apples"}, {"field", "market"}},
    {"child", {"young", "curious", "clever"}, {"read", "drew", "painted"},
     {"book", "picture", "map"}, {"school", "library"}},
    {"king", {"wise", "proud", "rich"}, {"ruled", "built", "guarded"},
     {"kingdom", "castle", "treasure"}, {"palace", "city"}},
    {"robot", {"shiny", "tall", "silent"}, {"repaired", "assembled", "tested"},
     {"engine", "machine", "circuit"}, {"factory", "lab"}},
    {"sailor", {"brave", "strong", "lonely"}, {"steered", "repaired", "painted"},
     {"boat", "ship", "sail"}, {"harbor", "sea"}},
    {"baker", {"busy", "cheerful", "careful"}, {"baked", "sliced", "sold"},
     {"bread", "cake", "pie"}, {"bakery", "shop"}},
    {"wizard", {"ancient", "mysterious", "powerful"}, {"cast", "brewed", "found"},
     {"spell", "potion", "scroll"}, {"tower", "forest"}},
}};

constexpr std::array<std::string_view, 20> kNumbers = {
    "one",     "two",     "three",     "four",     "five",    "six",      "seven",
    "eight",   "nine",    "ten",       "eleven",   "twelve",  "thirteen", "fourteen",
    "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"};

constexpr std::array<std::string_view, 4> kTimes = {"in the morning", "at noon",
                                                    "in the evening", "at night"};

class Grammar {
 public:
  explicit Grammar(uint64_t seed) : rng_(seed) {}

  size_t Pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  // "the sleepy cat chased the mouse in the garden ."
  void Action(std::string& out, const Creature& c) {
    out += "the ";
    if (Chance(0.7)) (out += c.adjectives[Pick(3)]) += " ";
    (out += c.noun) += " ";
    const size_t verb = Pick(3);
    // Verb and object mostly agree, so the object is predictable from the verb.
    const size_t object = Chance(0.8) ? verb : Pick(3);
    (out += c.verbs[verb]) += " the ";
    out += c.objects[object];
    if (Chance(0.5)) (out += " in the ") += c.places[Pick(2)];
    if (Chance(0.3)) (out += " ") += kTimes[Pick(kTimes.size())];
    out += " .";
  }

  // "then the cat went back to the garden ."
  void FollowUp(std::string& out, const Creature& c) {
    if (Chance(0.5)) {
      ((out += "then the ") += c.noun) += " went back to the ";
      (out += c.places[Pick(2)]) += " .";
    } else {
      ((out += "the ") += c.noun) += " was very happy .";
    }
  }

  // "the baker counted one two three four five ."
  void Counting(std::string& out, const Creature& c) {
    ((out += "the ") += c.noun) += " counted";
    const size_t start = Pick(8);
    const size_t length = 3 + Pick(8);
    for (size_t i = start; i < std::min(start + length, kNumbers.size()); ++i) {
      (out += " ") += kNumbers[i];
    }
    out += " .";
  }

  std::string Document() {
    std::string doc;
    const size_t sentences = 2 + Pick(4);
    for (size_t s = 0; s < sentences; ++s) {
      if (!doc.empty()) doc += " ";
      const Creature& c = kCreatures[Pick(kCreatures.size())];
      if (Chance(0.2)) {
        Counting(doc, c);
      } else {
        Action(doc, c);
        if (Chance(0.5)) {
          doc += " ";
          FollowUp(doc, c);
        }
      }
    }
    return doc;
  }

  std::string Opening() {
    const Creature& c = kCreatures[Pick(kCreatures.size())];
    std::string out = "the ";
    if (Chance(0.5)) (out += c.adjectives[Pick(3)]) += " ";
    out += c.noun;
    return out;
  }

 private:
  std::mt19937_64 rng_;
};

}  // namespace

std::vector<std::string> GenerateToyCorpus(uint64_t seed, int64_t count) {
  Grammar grammar(seed);
  std::vector<std::string> docs;
  docs.reserve(count);
  for (int64_t i = 0; i < count; ++i) docs.push_back(grammar.Document());
  return docs;
}

std::vector<std::string> ToyPrompts(uint64_t seed, int64_t count) {
  Grammar grammar(seed ^ 0x9e3779b97f4a7c15ULL);
  std::vector<std::string> prompts;
  prompts.reserve(count);
  for (int64_t i = 0; i < count; ++i) prompts.push_back(grammar.Opening());
  return prompts;
}

}  // namespace tophat
