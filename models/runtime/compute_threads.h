// How many CPU threads a process's model math uses. LibTorch's intra-op pool and the BLAS
// library under it (OpenBLAS with Debian's libopenblas0-pthread) each keep their own pool,
// and OpenBLAS's threads busy-wait between calls: two daemons on one small machine (a cloud
// and an agent on a 2-core test box, or an agent beside other apps on a Jetson) spin against
// each other unless both pools are capped together. This sets both, and the threads of the
// single-row decode kernel (kernels/gemv.h), which has its own.
#pragma once

#include "absl/status/status.h"

namespace tophat {

// Caps LibTorch's intra-op threads, OpenBLAS's own pool (when LibTorch's BLAS is OpenBLAS)
// and the single-row kernel's threads at `threads`. 0 keeps LibTorch's and OpenBLAS's
// defaults and gives the single-row kernel one thread per core as Linux counts them
// (kernels::CoresForCompute; gemv.h says why it differs from LibTorch's count). Negative is
// InvalidArgument.
absl::Status SetComputeThreads(int threads);

// OpenBLAS's current thread count when LibTorch's BLAS is OpenBLAS, else 0.
int BlasThreads();

}  // namespace tophat
