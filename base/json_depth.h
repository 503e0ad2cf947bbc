// How deep a parsed JSON value nests, checked without recursion. nlohmann::json parses and
// frees a value of any depth without recursing, but copies, dumps and compares it
// recursively: a request body of 100,000 nested arrays (200 KB) would overflow the stack of
// the thread that touches it that way. Bodies and schemas from apps are checked first.
#pragma once

#include <utility>
#include <vector>

namespace tophat {

// Whether `value` nests arrays and objects more than `limit` deep (a scalar: 0, [] or {}: 1,
// [[1]]: 2). `Json` is nlohmann::json (a template, so that base needs no JSON library).
template <typename Json>
bool NestedDeeperThan(const Json& value, int limit) {
  std::vector<std::pair<const Json*, int>> pending{{&value, 0}};
  while (!pending.empty()) {
    const auto [item, depth] = pending.back();
    pending.pop_back();
    if (!item->is_structured()) continue;
    if (depth + 1 > limit) return true;
    for (const Json& child : *item) pending.emplace_back(&child, depth + 1);
  }
  return false;
}

}  // namespace tophat
