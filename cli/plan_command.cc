#include "cli/plan_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/program.h"
#include "models/formats/checkpoint.h"
#include "models/formats/config.h"
#include "models/runtime/compute_threads.h"
#include "models/runtime/layer_profile.h"
#include "models/runtime/submodel.h"
#include "scheduler/layer_planner.h"

namespace tophat::cli {
namespace {

struct DeviceSpec {
  std::string name;  // as given
  at::Device device = at::kCPU;
  int threads = 0;  // CPU threads (0: one per core)
};

absl::StatusOr<DeviceSpec> ParseDevice(const std::string& text) {
  DeviceSpec spec{.name = text};
  if (text == "cpu") return spec;
  if (text.rfind("cpu:", 0) == 0) {
    if (!absl::SimpleAtoi(text.substr(4), &spec.threads) || spec.threads <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device ", text, ": cpu:THREADS needs a positive thread count"));
    }
    return spec;
  }
  try {
    spec.device = at::Device(text);
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device ", text, ": expected cpu, cpu:THREADS, cuda or cuda:N"));
  }
  return spec;
}

}  // namespace

int RunPlan(const PlanArgs& args) {
  if (args.devices.empty()) {
    return Fail(absl::InvalidArgumentError("--device: give at least one (stage 0 first)"));
  }
  if (!args.memory_gib.empty() && args.memory_gib.size() != args.devices.size()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--memory-gib: ", args.memory_gib.size(), " values for ", args.devices.size(),
        " devices; give one per device or none")));
  }
  const PlanObjective objective =
      args.objective == "latency" ? PlanObjective::kLatency : PlanObjective::kThroughput;
  auto config = ModelConfig::Load(args.model_dir / "config.json");
  if (!config.ok()) return Fail(config.status());
  auto checkpoint = CheckpointReader::Open(args.model_dir);
  if (!checkpoint.ok()) return Fail(checkpoint.status());
  const int64_t begin = args.input_layers;
  const int64_t end = config->num_hidden_layers - args.output_layers;
  if (begin < 0 || end <= begin) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "-m ", args.input_layers, " -k ", args.output_layers, " leave no middle layers of ",
        config->num_hidden_layers)));
  }
  const auto layers = static_cast<size_t>(end - begin);

  PlannerInputs inputs;
  std::vector<std::string> config_devices;  // how tophat-cloud's config names each device
  inputs.layer_bytes.assign(layers, 0);
  std::printf("profiling layers [%lld, %lld) of %s at %lld positions per step\n",
              static_cast<long long>(begin), static_cast<long long>(end),
              args.model_dir.c_str(), static_cast<long long>(args.tokens));
  for (size_t d = 0; d < args.devices.size(); ++d) {
    auto spec = ParseDevice(args.devices[d]);
    if (!spec.ok()) return Fail(spec.status());
    if (absl::Status threads = SetComputeThreads(spec->threads); !threads.ok()) return Fail(threads);
    config_devices.push_back(spec->device.str());
    PlannerDevice device{.name = spec->name,
                         .memory_bytes = args.memory_gib.empty()
                                             ? std::numeric_limits<double>::infinity()
                                             : args.memory_gib[d] * double(1 << 30)};
    auto profile = ProfileLayers(*config, **checkpoint, {begin, end}, spec->device, args.tokens,
                                 args.repetitions);
    if (!profile.ok()) return Fail(profile.status());
    inputs.layer_bytes = profile->bytes;
    device.layer_seconds = profile->seconds;
    double total = 0;
    for (double t : device.layer_seconds) total += t;
    std::printf("  %-10s %8.2f ms for all %zu layers\n", device.name.c_str(), 1e3 * total,
                layers);
    inputs.devices.push_back(std::move(device));
  }
  SetComputeThreads(0).IgnoreError();
  const double transfer = static_cast<double>(args.tokens * config->hidden_size * 4) /
                          (args.link_mb_per_s * 1e6);
  inputs.transfer_seconds.assign(args.devices.size(),
                                 std::vector<double>(args.devices.size(), transfer));
  for (size_t d = 0; d < args.devices.size(); ++d) inputs.transfer_seconds[d][d] = 0;

  auto plan = PlanLayers(inputs, objective);
  if (!plan.ok()) return Fail(plan.status());
  LayerPlan even{.boundaries = EvenBoundaries(static_cast<int64_t>(layers),
                                              static_cast<int64_t>(args.devices.size()))};
  for (size_t d = 0; d < args.devices.size(); ++d) even.devices.push_back(static_cast<int>(d));
  auto even_cost = EvaluatePlan(inputs, even, objective);

  std::printf("\n%s plan (%.3f ms per transfer at %.0f MB/s):\n", args.objective.c_str(),
              1e3 * transfer, args.link_mb_per_s);
  std::printf("| stage | device | layers | compute ms |\n|---|---|---|---:|\n");
  std::vector<std::string> boundaries;
  std::vector<std::string> devices;
  for (size_t s = 0; s < plan->devices.size(); ++s) {
    const PlannerDevice& device = inputs.devices[plan->devices[s]];
    double compute = 0;
    for (int64_t l = plan->boundaries[s]; l < plan->boundaries[s + 1]; ++l) {
      compute += device.layer_seconds[l];
    }
    std::printf("| %zu | %s | [%lld, %lld) | %.2f |\n", s, device.name.c_str(),
                static_cast<long long>(begin + plan->boundaries[s]),
                static_cast<long long>(begin + plan->boundaries[s + 1]), 1e3 * compute);
    devices.push_back(config_devices[plan->devices[s]]);
  }
  for (int64_t b : plan->boundaries) boundaries.push_back(std::to_string(begin + b));
  const char* what = objective == PlanObjective::kLatency ? "step latency" : "slowest stage";
  std::printf("predicted %s: %.2f ms", what, 1e3 * plan->predicted_seconds);
  if (even_cost.ok()) {
    std::printf(" (an even split over all %zu devices: %.2f ms, %.2fx)", args.devices.size(),
                1e3 * *even_cost, *even_cost / plan->predicted_seconds);
  } else {
    std::printf(" (an even split over all devices: %s)",
                std::string(even_cost.status().message()).c_str());
  }
  std::printf("\n\nFor the cloud's config (set each stage's compute_threads as profiled):\n"
              "pipeline:\n  layer_boundaries: [%s]\n  devices: [%s]\n",
              absl::StrJoin(boundaries, ", ").c_str(), absl::StrJoin(devices, ", ").c_str());
  return 0;
}

}  // namespace tophat::cli
