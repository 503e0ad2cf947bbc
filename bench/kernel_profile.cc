#include "bench/kernel_profile.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <utility>

#include <torch/csrc/autograd/profiler_kineto.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace tophat::bench {
namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::set<ActivityType> Activities(at::Device device) {
  return device.is_cuda() ? std::set<ActivityType>{ActivityType::CUDA}
                          : std::set<ActivityType>{ActivityType::CPU};
}

}  // namespace

KernelProfiler::KernelProfiler(at::Device device) : device_(device) {}

KernelProfiler::KernelProfiler(KernelProfiler&& other) noexcept
    : device_(other.device_), active_(other.active_), started_ns_(other.started_ns_) {
  other.active_ = false;
}

KernelProfiler::~KernelProfiler() {
  if (active_) {
    try {
      (void)profiler::disableProfiler();
    } catch (...) {
    }
  }
}

absl::StatusOr<KernelProfiler> KernelProfiler::Start(at::Device device) {
  KernelProfiler window(device);
  const ProfilerConfig config(ProfilerState::KINETO);
  absl::Status started = CatchExceptions("kernel profile: starting the profiler", [&] {
    profiler::prepareProfiler(config, Activities(device));
    profiler::enableProfiler(config, Activities(device));
  });
  if (!started.ok()) return started;
  window.active_ = true;
  window.started_ns_ = NowNs();
  return window;
}

absl::StatusOr<KernelProfile> KernelProfiler::Stop(int steps) {
  if (!active_) return absl::FailedPreconditionError("kernel profile: not started");
  KernelProfile profile{.steps = std::max(steps, 1),
                        .on_gpu = device_.is_cuda(),
                        .wall_ms = static_cast<double>(NowNs() - started_ns_) / 1e6};
  std::unique_ptr<profiler::ProfilerResult> result;
  active_ = false;
  absl::Status stopped =
      CatchExceptions("kernel profile: stopping the profiler",
                      [&] { result = profiler::disableProfiler(); });
  if (!stopped.ok()) return stopped;
  if (result == nullptr) return absl::InternalError("kernel profile: the profiler gave no result");

  const c10::DeviceType wanted = device_.is_cuda() ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  // (start, end, name) of the events on the wanted device; for the CPU, per thread.
  struct Span {
    uint64_t start, end;
    std::string name;
  };
  std::map<uint64_t, std::vector<Span>> spans;  // by thread (one group on a GPU)
  for (const profiler::KinetoEvent& event : result->events()) {
    if (event.deviceType() != wanted || event.isHiddenEvent()) continue;
    // Kineto's CPU records include the profiler's own bookkeeping ranges.
    const std::string name = event.name();
    if (name.rfind("ProfilerStep", 0) == 0 || name.rfind("[memory]", 0) == 0) continue;
    const uint64_t group = device_.is_cuda() ? 0 : event.startThreadId();
    spans[group].push_back({event.startNs(), event.startNs() + event.durationNs(), name});
  }
  std::map<std::string, KernelTime> by_name;
  for (auto& [group, list] : spans) {
    std::sort(list.begin(), list.end(), [](const Span& a, const Span& b) {
      return a.start != b.start ? a.start < b.start : a.end > b.end;
    });
    uint64_t outer_end = 0;
    for (const Span& span : list) {
      // On the CPU only the outermost op counts (its children's time is inside it); GPU
      // kernels do not nest.
      if (!device_.is_cuda() && span.start < outer_end) continue;
      outer_end = std::max(outer_end, span.end);
      KernelTime& row = by_name[span.name];
      row.name = span.name;
      ++row.calls;
      row.total_ms += static_cast<double>(span.end - span.start) / 1e6;
    }
  }
  for (auto& [name, row] : by_name) {
    profile.busy_ms += row.total_ms;
    profile.kernels.push_back(std::move(row));
  }
  std::sort(profile.kernels.begin(), profile.kernels.end(),
            [](const KernelTime& a, const KernelTime& b) { return a.total_ms > b.total_ms; });
  return profile;
}

std::string KernelTable(const KernelProfile& profile, size_t top, size_t name_width) {
  const double steps = profile.steps;
  std::string table = absl::StrFormat("  %-*s | calls | us/step | of wall\n",
                                      static_cast<int>(name_width), "kernel");
  for (size_t i = 0; i < std::min(top, profile.kernels.size()); ++i) {
    const KernelTime& k = profile.kernels[i];
    std::string name = k.name.size() > name_width ? k.name.substr(0, name_width - 3) + "..."
                                                  : k.name;
    absl::StrAppendFormat(&table, "  %-*s | %5.1f | %7.1f | %6.1f%%\n",
                          static_cast<int>(name_width), name, k.calls / steps,
                          1e3 * k.total_ms / steps,
                          profile.wall_ms > 0 ? 100 * k.total_ms / profile.wall_ms : 0.0);
  }
  absl::StrAppendFormat(
      &table, "  %zu kinds, %.3f ms busy of %.3f ms wall per step (%.1f%%); the rest is %s\n",
      profile.kernels.size(), profile.busy_ms / steps, profile.wall_ms / steps,
      profile.wall_ms > 0 ? 100 * profile.busy_ms / profile.wall_ms : 0.0,
      profile.on_gpu ? "the device idle (launch gaps, waits on the host)"
                     : "outside ATen ops (tophat's own CPU kernels, host work)");
  return table;
}

}  // namespace tophat::bench
