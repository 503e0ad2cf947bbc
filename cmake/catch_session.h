// Runs Catch2's session (cmake/catch_session.cc, Catch2's implementation compiled once): the
// mains of the test binaries call this, since Catch2 v2 declares Catch::Session only where
// its implementation is compiled.
#pragma once

namespace tophat::testing {
int RunCatchSession(int argc, char** argv);
}  // namespace tophat::testing
