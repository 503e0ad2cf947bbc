// Small string helpers shared across the project.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace tophat {

// std::string_view -> absl::string_view. Debian's Abseil is built with its own string_view
// type, so the two do not convert implicitly.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace tophat
