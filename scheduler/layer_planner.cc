#include "scheduler/layer_planner.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tophat {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr size_t kMaxDevices = 16;  // the DP's state holds a bitmask of devices

absl::Status CheckInputs(const PlannerInputs& in) {
  const size_t devices = in.devices.size();
  const size_t layers = in.layer_bytes.size();
  if (devices == 0 || devices > kMaxDevices) {
    return absl::InvalidArgumentError(
        absl::StrCat("the planner takes 1 to ", kMaxDevices, " devices, got ", devices));
  }
  if (layers == 0) return absl::InvalidArgumentError("the planner needs at least one layer");
  if (in.transfer_seconds.size() != devices) {
    return absl::InvalidArgumentError(absl::StrCat("transfer times for ",
                                                   in.transfer_seconds.size(),
                                                   " devices, expected ", devices));
  }
  for (size_t a = 0; a < devices; ++a) {
    const PlannerDevice& device = in.devices[a];
    if (device.layer_seconds.size() != layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device ", a, " (", device.name, "): ", device.layer_seconds.size(),
          " layer times for ", layers, " layers"));
    }
    for (double t : device.layer_seconds) {
      if (!(t >= 0) || !std::isfinite(t)) {
        return absl::InvalidArgumentError(
            absl::StrCat("device ", a, " (", device.name, "): a layer time is ", t));
      }
    }
    if (in.transfer_seconds[a].size() != devices) {
      return absl::InvalidArgumentError(
          absl::StrCat("transfer times from device ", a, " to ", in.transfer_seconds[a].size(),
                       " devices, expected ", devices));
    }
    for (double t : in.transfer_seconds[a]) {
      if (!(t >= 0)) {  // +infinity: no link
        return absl::InvalidArgumentError(
            absl::StrCat("a transfer time from device ", a, " is ", t));
      }
    }
  }
  for (double bytes : in.layer_bytes) {
    if (!(bytes >= 0)) return absl::InvalidArgumentError("a layer's memory is negative");
  }
  return absl::OkStatus();
}

// Sums over layer ranges in O(1): prefix[d][l] = sum of the first l layer times on device d.
struct Prefix {
  std::vector<std::vector<double>> seconds;
  std::vector<double> bytes;
  double Seconds(size_t device, size_t begin, size_t end) const {
    return seconds[device][end] - seconds[device][begin];
  }
  double Bytes(size_t begin, size_t end) const { return bytes[end] - bytes[begin]; }
};

Prefix MakePrefix(const PlannerInputs& in) {
  Prefix p;
  const size_t layers = in.layer_bytes.size();
  p.bytes.assign(layers + 1, 0);
  for (size_t l = 0; l < layers; ++l) p.bytes[l + 1] = p.bytes[l] + in.layer_bytes[l];
  for (const PlannerDevice& device : in.devices) {
    std::vector<double> sums(layers + 1, 0);
    for (size_t l = 0; l < layers; ++l) sums[l + 1] = sums[l] + device.layer_seconds[l];
    p.seconds.push_back(std::move(sums));
  }
  return p;
}

// How a stage's cost joins the cost so far: one step passes every stage in turn (sum), or
// stages work on different micro-batches at once and the slowest sets the pace (max).
double Combine(PlanObjective objective, double so_far, double stage) {
  return objective == PlanObjective::kLatency ? so_far + stage : std::max(so_far, stage);
}

// A stage's own cost: its compute, and the transfer into it. Summed for latency; for
// throughput the link and the compute overlap across micro-batches, so the larger counts.
double StageCost(PlanObjective objective, double compute, double incoming) {
  return objective == PlanObjective::kLatency ? compute + incoming : std::max(compute, incoming);
}

}  // namespace

std::vector<int64_t> EvenBoundaries(int64_t layers, int64_t stages) {
  std::vector<int64_t> out;
  if (stages <= 0) return out;
  for (int64_t s = 0; s <= stages; ++s) out.push_back(s * layers / stages);
  return out;
}

absl::StatusOr<double> EvaluatePlan(const PlannerInputs& inputs, const LayerPlan& plan,
                                    PlanObjective objective) {
  if (absl::Status valid = CheckInputs(inputs); !valid.ok()) return valid;
  const auto layers = static_cast<int64_t>(inputs.layer_bytes.size());
  const size_t stages = plan.devices.size();
  if (stages == 0 || plan.boundaries.size() != stages + 1 || plan.devices[0] != 0 ||
      plan.boundaries.front() != 0 || plan.boundaries.back() != layers) {
    return absl::InvalidArgumentError(
        "a plan needs device 0 first and boundaries from 0 to the layer count, one more than "
        "its devices");
  }
  const Prefix prefix = MakePrefix(inputs);
  std::vector<bool> used(inputs.devices.size(), false);
  double cost = 0;
  for (size_t s = 0; s < stages; ++s) {
    const int device = plan.devices[s];
    const int64_t begin = plan.boundaries[s];
    const int64_t end = plan.boundaries[s + 1];
    if (device < 0 || static_cast<size_t>(device) >= used.size() || used[device] ||
        end <= begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", s, ": device ", device, " with layers [", begin, ", ", end,
          ") is not a valid stage (each device once, each range non-empty)"));
    }
    used[device] = true;
    if (prefix.Bytes(begin, end) > inputs.devices[device].memory_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "stage ", s, ": layers [", begin, ", ", end, ") need ", prefix.Bytes(begin, end),
          " bytes; ", inputs.devices[device].name, " has ", inputs.devices[device].memory_bytes));
    }
    const double incoming = s == 0 ? 0 : inputs.transfer_seconds[plan.devices[s - 1]][device];
    cost = Combine(objective, cost,
                   StageCost(objective, prefix.Seconds(device, begin, end), incoming));
  }
  // The last stage's output returns to stage 0.
  return Combine(objective, cost, inputs.transfer_seconds[plan.devices.back()][0]);
}

absl::StatusOr<LayerPlan> PlanLayers(const PlannerInputs& inputs, PlanObjective objective) {
  if (absl::Status valid = CheckInputs(inputs); !valid.ok()) return valid;
  const size_t devices = inputs.devices.size();
  const size_t layers = inputs.layer_bytes.size();
  const size_t sets = size_t{1} << devices;
  const Prefix prefix = MakePrefix(inputs);
  // g[m][S][j], flattened; `from` records (previous m, previous device) for the backtrace.
  auto at = [&](size_t m, size_t set, size_t j) { return (m * sets + set) * devices + j; };
  std::vector<double> g((layers + 1) * sets * devices, kInf);
  struct From {
    int32_t m = -1;
    int32_t device = -1;
  };
  std::vector<From> from(g.size());
  // Stage 0 on device 0: layers [0, m).
  for (size_t m = 1; m <= layers; ++m) {
    if (prefix.Bytes(0, m) > inputs.devices[0].memory_bytes) break;
    g[at(m, 1, 0)] = StageCost(objective, prefix.Seconds(0, 0, m), 0);
  }
  for (size_t i = 1; i < layers; ++i) {
    for (size_t set = 1; set < sets; set += 2) {  // every set holds device 0
      for (size_t k = 0; k < devices; ++k) {
        const double so_far = g[at(i, set, k)];
        if (so_far == kInf) continue;
        for (size_t j = 1; j < devices; ++j) {
          if (set & (size_t{1} << j)) continue;
          const double incoming = inputs.transfer_seconds[k][j];
          const size_t next_set = set | (size_t{1} << j);
          for (size_t m = i + 1; m <= layers; ++m) {
            if (prefix.Bytes(i, m) > inputs.devices[j].memory_bytes) break;
            const double cost = Combine(
                objective, so_far, StageCost(objective, prefix.Seconds(j, i, m), incoming));
            double& best = g[at(m, next_set, j)];
            if (cost < best) {
              best = cost;
              from[at(m, next_set, j)] = {static_cast<int32_t>(i), static_cast<int32_t>(k)};
            }
          }
        }
      }
    }
  }
  double best = kInf;
  size_t best_set = 0;
  size_t best_device = 0;
  for (size_t set = 1; set < sets; set += 2) {
    for (size_t j = 0; j < devices; ++j) {
      const double stage_cost = g[at(layers, set, j)];
      if (stage_cost == kInf) continue;
      const double total = Combine(objective, stage_cost, inputs.transfer_seconds[j][0]);
      if (total < best) {
        best = total;
        best_set = set;
        best_device = j;
      }
    }
  }
  if (best == kInf) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no placement of the ", layers, " layers fits the devices' memory (",
        prefix.Bytes(0, layers), " bytes in all)"));
  }
  LayerPlan plan;
  plan.predicted_seconds = best;
  size_t m = layers;
  size_t set = best_set;
  size_t device = best_device;
  plan.boundaries.push_back(static_cast<int64_t>(m));
  plan.devices.push_back(static_cast<int>(device));
  while (!(device == 0 && set == 1)) {
    const From previous = from[at(m, set, device)];
    set &= ~(size_t{1} << device);
    m = static_cast<size_t>(previous.m);
    device = static_cast<size_t>(previous.device);
    plan.boundaries.push_back(static_cast<int64_t>(m));
    plan.devices.push_back(static_cast<int>(device));
  }
  plan.boundaries.push_back(0);
  std::reverse(plan.boundaries.begin(), plan.boundaries.end());
  std::reverse(plan.devices.begin(), plan.devices.end());
  return plan;
}

absl::StatusOr<LayerPlan> PlanStagesInOrder(const PlannerInputs& inputs,
                                            PlanObjective objective) {
  if (absl::Status valid = CheckInputs(inputs); !valid.ok()) return valid;
  const size_t stages = inputs.devices.size();
  const size_t layers = inputs.layer_bytes.size();
  if (stages > layers) {
    return absl::ResourceExhaustedError(absl::StrCat(stages, " stages cannot each hold one of ",
                                                     layers, " layers"));
  }
  const Prefix prefix = MakePrefix(inputs);
  // best[s][m]: the first m layers on stages 0..s, stage s ending at m; cut[s][m] its start.
  std::vector<std::vector<double>> best(stages, std::vector<double>(layers + 1, kInf));
  std::vector<std::vector<size_t>> cut(stages, std::vector<size_t>(layers + 1, 0));
  for (size_t m = 1; m <= layers; ++m) {
    if (prefix.Bytes(0, m) <= inputs.devices[0].memory_bytes) {
      best[0][m] = StageCost(objective, prefix.Seconds(0, 0, m), 0);
    }
  }
  for (size_t s = 1; s < stages; ++s) {
    const double incoming = inputs.transfer_seconds[s - 1][s];
    for (size_t m = s + 1; m <= layers; ++m) {
      for (size_t i = s; i < m; ++i) {
        if (best[s - 1][i] == kInf || prefix.Bytes(i, m) > inputs.devices[s].memory_bytes) {
          continue;
        }
        const double cost = Combine(objective, best[s - 1][i],
                                    StageCost(objective, prefix.Seconds(s, i, m), incoming));
        if (cost < best[s][m]) {
          best[s][m] = cost;
          cut[s][m] = i;
        }
      }
    }
  }
  const double total = best[stages - 1][layers];
  if (total == kInf) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no split of the ", layers, " layers over the ", stages, " stages fits their memory"));
  }
  LayerPlan plan;
  plan.predicted_seconds =
      Combine(objective, total, inputs.transfer_seconds[stages - 1][0]);
  plan.boundaries.assign(stages + 1, 0);
  plan.boundaries[stages] = static_cast<int64_t>(layers);
  size_t m = layers;
  for (size_t s = stages - 1; s > 0; --s) {
    m = cut[s][m];
    plan.boundaries[s] = static_cast<int64_t>(m);
  }
  for (size_t s = 0; s < stages; ++s) plan.devices.push_back(static_cast<int>(s));
  return plan;
}

}  // namespace tophat
