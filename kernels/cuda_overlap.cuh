// Overlapped launches (programmatic dependent launch, compute capability 9.0 and later):
// a kernel launched with `overlap` may be scheduled while the kernel before it in the
// stream is still finishing, so that the gap between two kernels (a decode step at batch 1
// is over 200 of them, each a few microseconds long) is spent on the next one's start-up
// rather than on an idle GPU. For .cu files only.
//
// The contract every kernel here keeps, so that an overlapped launch computes exactly what
// a serialized one does:
// - Each thread calls WaitForPrecedingKernel() before it reads anything but weights and
//   before it writes anything, and before it returns, early exits included. The wait
//   returns once the preceding kernel has completed and its writes are visible; a kernel
//   all of whose blocks waited has therefore completed only after its predecessor did, so
//   the ordering chains through a run of overlapped kernels.
// - Before the wait a kernel may read only weights: a model's parameters, written when it
//   loads and by no kernel of a step, so that no predecessor can still be writing them
//   (the small-batch GEMM loads its first pass of them there). Anything else a kernel reads
//   (activations, caches, tables, counters) may be its predecessor's output.
// - AllowNextKernelToStart() comes after the wait, so that at most two kernels are resident
//   at once: the next one's blocks may take free SM slots only once this one's have all
//   passed their wait, i.e. once the kernel before this one has finished.
// Without the launch attribute, or on a GPU before compute capability 9.0, the wait and the
// trigger are no-ops and the stream orders the kernels as always.
#pragma once

#include <cuda_runtime.h>

namespace tophat::kernels {

__device__ inline void WaitForPrecedingKernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ inline void AllowNextKernelToStart() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Queues kernel<<<grid, block, 0, stream>>>(args...), overlapped with the preceding kernel
// when `overlap` (the caller passes OverlapKernelLaunches(), kernels/cuda_device.h). A
// refused launch is left for cudaGetLastError, as a <<<>>> launch's is (LaunchStatus).
template <typename... Params, typename... Args>
void LaunchKernel(bool overlap, void (*kernel)(Params...), dim3 grid, dim3 block,
                  cudaStream_t stream, Args... args) {
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = overlap ? 1 : 0;
  // The runtime records a refusal as the thread's last error as well, where LaunchStatus
  // reads it.
  (void)cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace tophat::kernels
