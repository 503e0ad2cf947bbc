// Status plumbing that Abseil 20220623 does not ship: early-return macros and a bridge
// from LibTorch's exceptions to absl::Status at module boundaries.
#pragma once

#include <exception>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#define TOPHAT_CONCAT_INNER(a, b) a##b
#define TOPHAT_CONCAT(a, b) TOPHAT_CONCAT_INNER(a, b)

#define TOPHAT_RETURN_IF_ERROR(expr)        \
  do {                                      \
    ::absl::Status tophat_status_ = (expr); \
    if (!tophat_status_.ok()) {             \
      return tophat_status_;                \
    }                                       \
  } while (0)

#define TOPHAT_ASSIGN_OR_RETURN(lhs, rexpr) \
  TOPHAT_ASSIGN_OR_RETURN_IMPL(TOPHAT_CONCAT(tophat_statusor_, __LINE__), lhs, rexpr)

#define TOPHAT_ASSIGN_OR_RETURN_IMPL(var, lhs, rexpr) \
  auto var = (rexpr);                                 \
  if (!var.ok()) {                                    \
    return std::move(var).status();                   \
  }                                                   \
  lhs = std::move(var).value()

namespace tophat {

// Runs `fn`, turning any exception (c10::Error included) into an internal error that
// starts with `context`, so a Torch failure surfaces as a status naming what was being done.
// `context` is a view, built into a message only on failure: a step's calls allocate nothing.
template <typename Fn>
absl::Status CatchExceptions(absl::string_view context, Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    std::string what = e.what();
    // c10::Error appends a C++ backtrace after the first line; users need only the message.
    if (auto newline = what.find('\n'); newline != std::string::npos) what.resize(newline);
    return absl::InternalError(absl::StrCat(context, ": ", what));
  }
}

}  // namespace tophat
