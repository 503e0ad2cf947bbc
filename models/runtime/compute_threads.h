// How many CPU threads a process's model math uses. Two daemons on one small machine (a cloud
// and an agent on a 2-core test box, or an agent beside other apps on a Jetson) spin against
// each other unless every pool under them is capped: LibTorch's intra-op pool (OpenMP in
// PyTorch's wheels), the BLAS under it (MKL on x86-64, which keeps its own count; NVPL on
// aarch64, which runs on OpenMP's; OpenBLAS in other LibTorch builds, with a busy-waiting
// pool of its own), and the single-row decode kernel (kernels/gemv.h), whose OpenMP region
// asks for its own number of threads. This sets them all.
#pragma once

#include "absl/status/status.h"

namespace tophat {

// Caps LibTorch's intra-op threads (and with them OpenMP's and MKL's), OpenBLAS's own pool
// (when LibTorch's BLAS is OpenBLAS) and the single-row kernel's threads at `threads`. 0
// keeps LibTorch's defaults and gives the single-row kernel one thread per core as Linux
// counts them (kernels::CoresForCompute; gemv.h says why it differs from LibTorch's count).
// Negative is InvalidArgument.
absl::Status SetComputeThreads(int threads);

// The threads the BLAS under LibTorch uses: MKL's or OpenBLAS's own count, or OpenMP's when
// the BLAS runs on OpenMP's pool; 0 when it cannot be told.
int BlasThreads();

}  // namespace tophat
