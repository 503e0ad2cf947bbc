// What a step's time goes to: the kernels (and copies) a GPU ran, or the outermost ATen ops
// of the CPU, collected with PyTorch's own profiler (Kineto; on a GPU through CUPTI, graph
// replays included) and summed by name. The engine benchmark prints it per case, so that a
// GPU run shows which kernels hold a step away from its bound (issue 31), not only that one is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace tophat::bench {

struct KernelTime {
  std::string name;
  int64_t calls = 0;
  double total_ms = 0;
};

struct KernelProfile {
  std::vector<KernelTime> kernels;  // by total time, longest first
  double busy_ms = 0;               // the sum over `kernels`
  int steps = 0;                    // the steps profiled; per-step figures divide by it
  bool on_gpu = false;              // device work (else the CPU's outermost ATen ops)
  // Host time from Start to Stop; a caller whose window holds more than its steps (input
  // preparation between them) sets it to the steps' own time.
  double wall_ms = 0;
};

// One profiling window (the profiler is process-wide: one at a time). On a GPU it records
// that device's kernels, copies and memsets; on the CPU the outermost ATen ops run on the
// thread that started it (nested ops are inside their parent's time).
class KernelProfiler {
 public:
  static absl::StatusOr<KernelProfiler> Start(at::Device device);
  KernelProfiler(KernelProfiler&& other) noexcept;
  KernelProfiler& operator=(KernelProfiler&&) = delete;
  ~KernelProfiler();  // stops a window not stopped yet, discarding it

  // Ends the window over `steps` steps (the caller synchronizes the device before).
  absl::StatusOr<KernelProfile> Stop(int steps);

 private:
  explicit KernelProfiler(at::Device device);
  at::Device device_;
  bool active_ = false;
  int64_t started_ns_ = 0;
};

// The `top` longest kernels as table rows: name (cut to `name_width`), calls and
// microseconds per step, share of the profiled wall time; then a line with the totals.
std::string KernelTable(const KernelProfile& profile, size_t top, size_t name_width = 72);

}  // namespace tophat::bench
