#include "bench/kernel_profile.h"

#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

namespace tophat::bench {
namespace {

const KernelTime* Find(const KernelProfile& profile, const std::string& name) {
  for (const KernelTime& k : profile.kernels) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

TEST_CASE("The CPU kernel profile counts each outermost ATen op once per call", "[profile]") {
  c10::InferenceMode inference_mode;
  const at::Tensor x = at::randn({64, 256});
  const at::Tensor w = at::randn({512, 256});
  auto window = KernelProfiler::Start(at::kCPU);
  REQUIRE(window.ok());
  constexpr int kSteps = 3;
  for (int step = 0; step < kSteps; ++step) {
    const at::Tensor y = at::linear(x, w);  // aten::linear holds aten::t and aten::matmul
    (void)at::relu(y);
  }
  auto profile = window->Stop(kSteps);
  REQUIRE(profile.ok());
  const KernelTime* linear = Find(*profile, "aten::linear");
  const KernelTime* relu = Find(*profile, "aten::relu");
  REQUIRE(linear != nullptr);
  REQUIRE(relu != nullptr);
  CHECK(linear->calls == kSteps);
  CHECK(relu->calls == kSteps);
  CHECK(linear->total_ms > 0);
  // Nested ops are inside their parent's time, not rows of their own.
  CHECK(Find(*profile, "aten::t") == nullptr);
  CHECK(Find(*profile, "aten::mm") == nullptr);
  CHECK(profile->busy_ms <= profile->wall_ms);
  CHECK(profile->kernels.front().total_ms >= profile->kernels.back().total_ms);

  const std::string table = KernelTable(*profile, 5);
  CHECK(table.find("aten::linear") != std::string::npos);
  CHECK(table.find("ms busy of") != std::string::npos);
}

TEST_CASE("A kernel profile window is one at a time and stops once", "[profile]") {
  auto window = KernelProfiler::Start(at::kCPU);
  REQUIRE(window.ok());
  (void)at::ones({4}).sum();
  REQUIRE(window->Stop(1).ok());
  CHECK(window->Stop(1).status().code() == absl::StatusCode::kFailedPrecondition);
  // After a stop a new window starts (the destructor of a stopped one does nothing).
  auto again = KernelProfiler::Start(at::kCPU);
  REQUIRE(again.ok());
  (void)at::ones({4}).sum();
  auto profile = again->Stop(1);
  REQUIRE(profile.ok());
  CHECK(Find(*profile, "aten::sum") != nullptr);
}

}  // namespace
}  // namespace tophat::bench
