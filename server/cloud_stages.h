// How tophat-cloud becomes one stage of a pipeline (configs: `pipeline:`): which layers and
// device each stage gets, the checks at rendezvous (a stage with another model, layer range
// or dtype is refused with both descriptions), and the later stages' main loop. Part of the
// tophat-cloud program, not of the server library: it reads the daemon's config.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "configs/cloud_config.h"
#include "models/runtime/bundle.h"
#include "server/pipeline/pipeline_stage.h"

namespace tophat {

struct StagePlan {
  int rank = 0;
  int size = 1;
  LayerRange layers;   // this stage's part of the middle
  std::string device;  // where it runs
};

// Stage `rank` of the config's pipeline over a bundle whose middle is `middle`. Errors name
// pipeline.layer_boundaries when it does not span the middle exactly.
absl::StatusOr<StagePlan> PlanStage(const CloudConfig& config, int rank, LayerRange middle);

// What a stage runs, as compared at rendezvous: the model it was split from, its layers,
// dtype and hidden size.
std::string DescribeStage(const BundleManifest& manifest, const ModelConfig& model,
                          const std::string& dtype, LayerRange layers);

// Joins the stages' rendezvous as stage `rank` (stage 0 serves it).
absl::StatusOr<std::unique_ptr<pipeline::Rendezvous>> JoinStages(const CloudConfig& config,
                                                                 int rank);

// The config with its pipeline's layer boundaries decided: as written, or with
// `planned_stages`, planned at start-up. Then every stage profiles its own device over the
// bundle's middle layers (models/runtime/layer_profile.h) and publishes the profile; stage 0
// runs the layer planner over them (the slowest stage as short as it can be, stages in their
// order) and publishes the boundaries every stage then loads.
absl::StatusOr<CloudConfig> DecideBoundaries(const CloudConfig& config, int rank,
                                             pipeline::Rendezvous& rendezvous);

// Stage 0: checks each other stage's description against what the config gives it, tells
// them the KV pool's shape, and returns the link to them.
absl::StatusOr<std::unique_ptr<pipeline::Downstream>> ConnectStages(
    const CloudConfig& config, const CloudBundle& bundle, at::ScalarType dtype,
    int64_t kv_num_blocks, pipeline::Rendezvous& rendezvous);

// Stages 1..P-1 (`tophat-cloud --stage N`): loads its layers, meets stage 0 and serves
// steps until stage 0 shuts the pipeline down. Returns the process's exit code.
int RunLaterStage(const CloudConfig& config, int rank);

}  // namespace tophat
