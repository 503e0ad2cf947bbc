// The mask a grammar's state must have, worked out the slow way (each token fed on its own),
// and the ids a mask allows: what GrammarConstraint's walk is checked against by the unit
// tests (grammar_test_util.h) and the fuzz targets (fuzz/mask_check.h). Header-only, with
// no test framework, so that both can use it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/grammar/json_constraint.h"

namespace tophat::testing {

// The ids a mask allows, in order.
inline std::vector<int32_t> Ids(const std::vector<uint8_t>& mask) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] != 0) ids.push_back(static_cast<int32_t>(i));
  }
  return ids;
}

// What `state`'s mask must allow: each token its grammar takes fed on its own (none once the
// grammar is complete), and `end` where it may end; a state nothing continues ends the
// answer, so its mask is `end` alone.
template <typename Grammar>
std::vector<int32_t> TokensTaken(const Grammar& state, const TokenVocabulary& vocabulary,
                                 int32_t end) {
  std::vector<int32_t> taken;
  for (int32_t id = 0; id < vocabulary.size(); ++id) {
    const std::string* bytes = vocabulary.bytes(id);
    Grammar next = state;
    const bool allowed =
        id == end ? state.can_end()
                  : !state.complete() && bytes != nullptr && !bytes->empty() && next.Feed(*bytes);
    if (allowed) taken.push_back(id);
  }
  if (taken.empty()) taken = {end};
  return taken;
}

}  // namespace tophat::testing
