// Host launcher for the CUDA RMSNorm; includable from .cc files (no CUDA types exposed).
#pragma once

#include <cstdint>

namespace tophat::kernels {

// x, y: [rows, d] float32 device pointers; w: [d]. `stream` is a cudaStream_t (nullptr for
// the default stream). One block per row.
void LaunchRmsNormF32(const float* x, const float* w, float* y, int64_t rows, int64_t d,
                      float eps, void* stream);

}  // namespace tophat::kernels
