// The main of tophat_serving_staged_test: the [staged] serving cases with the cloud's middle
// split into two pipeline stages (two tophat-cloud processes over Gloo), which must give what
// one stage gives: the same tokens, the same cancellation, KV accounting and drain.
#include <cstdlib>

#include "cmake/catch_session.h"  // Catch2's implementation: cmake/catch_session.cc

int main(int argc, char** argv) {
  // The toy model's middle is layers [2, 5): stage 0 runs [2, 4), stage 1 runs [4, 5).
  setenv("TOPHAT_TEST_CLOUD_STAGES", "2,4,5", /*overwrite=*/0);
  return tophat::testing::RunCatchSession(argc, argv);
}
