// Catch2 v2's implementation (the session, reporters, matchers), compiled once per build
// tree: ~40 s of a 2-core build each time a main defined CATCH_CONFIG_MAIN or
// CATCH_CONFIG_RUNNER itself. Every test binary links this object and one of the mains:
// cmake/catch_main.cc (unit tests), cmake/gpu_test_main.cc (GPU tests) or
// tests/serving_staged_main.cc, which call RunCatchSession.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "cmake/catch_session.h"

namespace tophat::testing {
int RunCatchSession(int argc, char** argv) { return Catch::Session().run(argc, argv); }
}  // namespace tophat::testing
