// CLI11 validators whose errors say what an option wants. CLI11's own PositiveNumber refuses 0
// as "Value 0 not in range 0.000000 to 17976931348623157081452742373170435679807056752584..."
// (its range printed to 300 digits).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "absl/strings/numbers.h"

namespace tophat {

// A number above 0, for an option of any integer or floating-point type: "--name: must be a
// number above 0, not 0".
inline CLI::Validator PositiveNumber() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        double value = 0;
        if (absl::SimpleAtod(input, &value) && value > 0) return {};
        return "must be a number above 0, not " + input;
      },
      "POSITIVE");
}

}  // namespace tophat
