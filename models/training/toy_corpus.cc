#include "models/training/toy_corpus.h"

#include <algorithm>
#include <array>
#include <sstream>
#include <random>
#include <string_view>
#include <vector>

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

// Of the corpus's documents, the share that are outline answers.
constexpr double kOutlineShare = 0.15;

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

  // An answer made of independent points, for outline-based parallel decoding (Jupiter
  // §IV-C): the prompt names 2-4 creatures, the outline numbers them, and each point's
  // expansion is one sentence about its creature, which depends on nothing but the point's
  // own marker.
  // "stories of the cat , the robot and the baker . outline : one cat two robot three baker .
  //  point one cat : the sleepy cat chased the mouse . point two robot : ... end ."
  std::string OutlineDocument() {
    std::string doc = OutlinePrompt();
    doc += " outline :";
    for (size_t i = 0; i < outline_.size(); ++i) {
      ((doc += " ") += kNumbers[i]) += " ";
      doc += kCreatures[outline_[i]].noun;
    }
    doc += " .";
    for (size_t i = 0; i < outline_.size(); ++i) {
      ((doc += " point ") += kNumbers[i]) += " ";
      (doc += kCreatures[outline_[i]].noun) += " : ";
      Action(doc, kCreatures[outline_[i]]);
    }
    doc += " end .";
    return doc;
  }

  // "stories of the cat , the robot and the baker ." (the creatures in outline_)
  std::string OutlinePrompt() {
    outline_.clear();
    const size_t points = 2 + Pick(3);
    while (outline_.size() < points) {
      const size_t c = Pick(kCreatures.size());
      if (std::find(outline_.begin(), outline_.end(), c) == outline_.end()) outline_.push_back(c);
    }
    std::string out = "stories of";
    for (size_t i = 0; i < outline_.size(); ++i) {
      if (i > 0) out += i + 1 == outline_.size() ? " and" : " ,";
      (out += " the ") += kCreatures[outline_[i]].noun;
    }
    return out + " .";
  }

  std::string Document() {
    if (Chance(kOutlineShare)) return OutlineDocument();
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
  std::vector<size_t> outline_;  // creatures of the last outline prompt
};

const Creature* CreatureNamed(std::string_view noun) {
  for (const Creature& c : kCreatures) {
    if (c.noun == noun) return &c;
  }
  return nullptr;
}

template <size_t N>
bool OneOf(const std::array<std::string_view, N>& words, std::string_view word) {
  return std::find(words.begin(), words.end(), word) != words.end();
}

}  // namespace

std::vector<std::string> ToyOutlinePrompts(uint64_t seed, int64_t count) {
  Grammar grammar(seed ^ 0x5851f42d4c957f2dULL);
  std::vector<std::string> prompts;
  prompts.reserve(count);
  for (int64_t i = 0; i < count; ++i) prompts.push_back(grammar.OutlinePrompt());
  return prompts;
}

bool IsToySentenceAbout(std::string_view sentence, std::string_view noun) {
  const Creature* c = CreatureNamed(noun);
  if (c == nullptr) return false;
  std::vector<std::string> words;
  std::istringstream in{std::string(sentence)};
  for (std::string w; in >> w;) words.push_back(w);
  size_t i = 0;
  const auto next = [&]() -> std::string_view {
    return i < words.size() ? std::string_view(words[i]) : std::string_view();
  };
  if (next() != "the") return false;
  ++i;
  if (OneOf(c->adjectives, next())) ++i;
  if (next() != c->noun) return false;
  ++i;
  if (!OneOf(c->verbs, next())) return false;
  ++i;
  if (next() != "the") return false;
  ++i;
  if (!OneOf(c->objects, next())) return false;
  ++i;
  if (next() == "in" && i + 2 < words.size() && words[i + 1] == "the" &&
      OneOf(c->places, words[i + 2])) {
    i += 3;
  }
  // What is left: " ." or a time of day and " .".
  std::string rest;
  for (size_t j = i; j < words.size(); ++j) (rest += rest.empty() ? "" : " ") += words[j];
  if (rest == ".") return true;
  return std::any_of(kTimes.begin(), kTimes.end(),
                     [&](std::string_view time) { return rest == std::string(time) + " ."; });
}

ToyOutlineScore ScoreToyOutlineAnswer(std::string_view answer) {
  std::vector<std::string> words;
  std::istringstream in{std::string(answer)};
  for (std::string w; in >> w;) words.push_back(w);
  ToyOutlineScore score;
  for (size_t i = 0; i + 3 < words.size(); ++i) {
    if (words[i] != "point" || !OneOf(kNumbers, words[i + 1]) || words[i + 3] != ":") continue;
    ++score.points;
    std::string sentence;
    size_t j = i + 4;
    for (; j < words.size(); ++j) {
      (sentence += sentence.empty() ? "" : " ") += words[j];
      if (words[j] == ".") break;
    }
    if (IsToySentenceAbout(sentence, words[i + 2])) ++score.valid;
    i = j > i ? j - 1 : i;
  }
  return score;
}

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
