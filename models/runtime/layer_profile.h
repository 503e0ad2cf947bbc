// How long each decoder layer of a checkpoint takes on a device: the profile the cloud's
// layer planner (scheduler/layer_planner.h) works from, for `tophat plan` and for
// tophat-cloud's `pipeline.planned_stages`.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "models/formats/checkpoint.h"
#include "models/formats/config.h"
#include "models/runtime/submodel.h"

namespace tophat {

struct LayerProfile {
  std::vector<double> seconds;  // per layer: median forward time of one step
  std::vector<double> bytes;    // per layer: weight bytes on the device
};

// Loads each layer of `layers` alone on `device` (float32) and times a forward of `tokens`
// positions with a fresh cache: one warm-up, then the median of `repetitions`. Uses the
// process's current compute threads.
absl::StatusOr<LayerProfile> ProfileLayers(const ModelConfig& config,
                                           const CheckpointReader& checkpoint, LayerRange layers,
                                           at::Device device, int64_t tokens, int repetitions);

}  // namespace tophat
