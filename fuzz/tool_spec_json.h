// What the tool-call fuzz targets (tool_calls, harmony_calls) read first: a JSON object with
// "tools": [{"name", "parameters"}], then a NUL byte, then the rest of the input. Header-only.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "models/grammar/tool_call_grammar.h"
#include "nlohmann/json.hpp"

namespace tophat::fuzz {

struct ToolSpecInput {
  nlohmann::json spec;              // the object before the NUL
  std::vector<ToolCallTool> tools;  // its tools, their parameters compiled
  std::string_view rest;            // the bytes after the NUL
};

inline std::optional<std::string> JsonText(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

// nullopt where the input has no NUL, the object is not one with a "tools" array, or a tool's
// parameters do not compile (uninteresting inputs, not findings).
inline std::optional<ToolSpecInput> ReadToolSpecInput(std::string_view input) {
  const size_t nul = input.find('\0');
  if (nul == std::string_view::npos) return std::nullopt;
  ToolSpecInput read;
  read.spec = nlohmann::json::parse(input.substr(0, nul), nullptr, /*allow_exceptions=*/false);
  if (!read.spec.is_object() || !read.spec.contains("tools") || !read.spec["tools"].is_array()) {
    return std::nullopt;
  }
  for (const nlohmann::json& tool : read.spec["tools"]) {
    if (!tool.is_object() || !tool.contains("parameters")) return std::nullopt;
    auto compiled = CompiledSchema::Compile(tool["parameters"]);
    if (!compiled.ok()) return std::nullopt;
    read.tools.push_back(
        {.name = JsonText(tool, "name").value_or(""), .parameters = *std::move(compiled)});
  }
  read.rest = input.substr(nul + 1);
  return read;
}

}  // namespace tophat::fuzz
