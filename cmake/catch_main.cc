// The one main shared by every unit-test binary, compiled once; Catch2's implementation is
// cmake/catch_session.cc.
#include "cmake/catch_session.h"

int main(int argc, char** argv) { return tophat::testing::RunCatchSession(argc, argv); }
