// EdgeShard's planner for the cloud's pipeline: which devices, in which order, run which
// contiguous layers of the middle. Pure logic over measured inputs (per-layer compute time on
// each device, activation transfer time between devices, memory): `tophat plan` and the
// config's `layer_boundaries: auto` feed it profiles.
//
// State g(m, S, j): the best cost of the first m layers placed on the device set S, with
// device j holding the range that ends at layer m; each step gives the next device j' not in
// S a range [m, m'). This is EdgeShard's throughput DP (its Eq. 12, O(N^2 2^M M^2)); with a
// sum in place of the max it is the latency objective (its Eq. 7) under the constraint a
// pipeline of processes has and Eq. 7 does not: each device holds one contiguous range.
// Memory is checked exactly per range (Eq. 13). Device 0 is stage 0, the process the agents
// reach, so it takes the first range (EdgeShard's privacy constraint, Eq. 8/14, plays the
// same role), and the last stage's output returns to it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tophat {

struct PlannerDevice {
  std::string name;                  // for messages and `tophat plan`'s table
  double memory_bytes = 0;           // what this device can give the layers (weights + KV)
  std::vector<double> layer_seconds;  // compute time of each layer of the middle, one step
};

struct PlannerInputs {
  std::vector<PlannerDevice> devices;  // devices[0] is stage 0
  std::vector<double> layer_bytes;     // memory each layer needs (weights + its KV share)
  // transfer_seconds[a][b]: moving one step's hidden states from device a to device b
  // (0 on the diagonal).
  std::vector<std::vector<double>> transfer_seconds;
};

enum class PlanObjective {
  kLatency,     // one step through every stage and back: compute + transfers, summed
  kThroughput,  // micro-batches in flight: the slowest stage (its compute or incoming link)
};

struct LayerPlan {
  std::vector<int> devices;             // stage order: devices[0] == 0
  std::vector<int64_t> boundaries;      // P + 1 values from 0 to N: stage s runs [b_s, b_s+1)
  double predicted_seconds = 0;         // the objective's value for this plan
};

// The best plan, or: InvalidArgument for inconsistent inputs (sizes, negative times, more
// than 16 devices), ResourceExhausted when no placement fits the memory.
absl::StatusOr<LayerPlan> PlanLayers(const PlannerInputs& inputs, PlanObjective objective);

// The objective's value of a given plan (e.g. an even split, for comparison). Errors as
// PlanLayers, and InvalidArgument for a plan that is not a partition of the layers.
absl::StatusOr<double> EvaluatePlan(const PlannerInputs& inputs, const LayerPlan& plan,
                                    PlanObjective objective);

// The best split of the layers over every device in the given order (device i is stage i,
// each gets at least one layer): the plan for processes that are already placed, as
// tophat-cloud's `pipeline.planned_stages` is. O(P N^2). Errors as PlanLayers, and
// ResourceExhausted when there are more devices than layers.
absl::StatusOr<LayerPlan> PlanStagesInOrder(const PlannerInputs& inputs, PlanObjective objective);

// Boundaries that give each of `stages` stages as equal a number of the `layers` as can be.
std::vector<int64_t> EvenBoundaries(int64_t layers, int64_t stages);

}  // namespace tophat
