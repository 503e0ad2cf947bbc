// Random inputs for the kernel tests (test-only; no library code includes this).
#pragma once

#include <ATen/ATen.h>

namespace tophat::kernels::testing {

// Values uniform in [-1, 1): as good as normal samples for checking a product against
// LibTorch's, and several times cheaper to draw under qemu-aarch64, where the arm64 kernel
// tests run: at::randn's transcendentals are emulated in software floating point there, and
// drawing the inputs took 120 of the 194 s of the int8 kernel's case (2026-12-02).
inline at::Tensor UniformInputs(at::IntArrayRef shape) {
  return at::empty(shape).uniform_(-1.0, 1.0);
}

}  // namespace tophat::kernels::testing
