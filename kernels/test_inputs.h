// Random inputs and a timer for the kernel tests (test-only; no library code includes this).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <functional>

namespace tophat::kernels::testing {

// Values uniform in [-1, 1): as good as normal samples for checking a product against
// LibTorch's, and several times cheaper to draw under qemu-aarch64, where the arm64 kernel
// tests run: at::randn's transcendentals are emulated in software floating point there, and
// drawing the inputs took 120 of the 194 s of the int8 kernel's case (2026-12-02).
inline at::Tensor UniformInputs(at::IntArrayRef shape) {
  return at::empty(shape).uniform_(-1.0, 1.0);
}

// The fastest of `repeats` timed calls of `run`, in seconds, after one untimed call (buffers
// grown, weights in what cache holds them): the hidden measurements' timer.
inline double BestSeconds(int repeats, const std::function<void()>& run) {
  run();
  double best = 1e30;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    run();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace tophat::kernels::testing
