#include "server/cloud_stages.h"

#include <chrono>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/program.h"
#include "base/status_macros.h"
#include "kernels/cuda_device.h"
#include "kernels/decode_attention.h"
#include "models/formats/config.h"
#include "models/formats/checkpoint.h"
#include "models/runtime/compute_threads.h"
#include "models/runtime/layer_profile.h"
#include "scheduler/layer_planner.h"
#include "server/pipeline/stage_transport.h"

namespace tophat {
namespace {

std::chrono::milliseconds Timeout(const CloudConfig& config) {
  return std::chrono::milliseconds(static_cast<int64_t>(config.pipeline.timeout_s * 1000));
}

pipeline::RendezvousOptions RendezvousFor(const CloudConfig& config, int rank) {
  return {.address = config.pipeline.rendezvous_address,
          .rank = rank,
          .size = static_cast<int>(config.pipeline.stages()),
          .timeout = Timeout(config),
          .interface = config.pipeline.interface};
}

// The stage's links over the configured backend; `device` is where this stage computes.
absl::StatusOr<std::unique_ptr<pipeline::StageTransport>> ConnectLinks(
    const CloudConfig& config, pipeline::Rendezvous& rendezvous, const std::string& device) {
  if (config.pipeline.backend != "nccl") return pipeline::ConnectGloo(rendezvous);
  const at::Device cuda(device);
  return pipeline::ConnectNccl(rendezvous, cuda.has_index() ? cuda.index() : 0);
}

std::string StageKey(int rank) { return absl::StrCat("stage/", rank); }
std::string VerdictKey(int rank) { return absl::StrCat("verdict/", rank); }
constexpr char kPoolKey[] = "kv_pool";  // "<num_blocks> <block_size>"
constexpr char kAccepted[] = "ok";

// The space-separated numbers of a rendezvous value (profiles, boundaries, the pool shape);
// `what` names the value in the error.
template <typename Number>
absl::StatusOr<std::vector<Number>> ParseNumbers(absl::string_view text, absl::string_view what) {
  std::vector<Number> numbers;
  for (absl::string_view part : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    Number number{};
    bool parsed = false;
    if constexpr (std::is_floating_point_v<Number>) {
      parsed = absl::SimpleAtod(part, &number);
    } else {
      parsed = absl::SimpleAtoi(part, &number);
    }
    if (!parsed) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline: malformed ", what, " '", text, "' at the rendezvous"));
    }
    numbers.push_back(number);
  }
  return numbers;
}

}  // namespace

absl::StatusOr<StagePlan> PlanStage(const CloudConfig& config, int rank, LayerRange middle) {
  const std::vector<int64_t>& bounds = config.pipeline.layer_boundaries;
  const int64_t stages = config.pipeline.stages();
  if (rank < 0 || rank >= stages) {
    return absl::InvalidArgumentError(absl::StrCat("--stage ", rank, ": the config's pipeline has ",
                                                   stages, " stage(s), numbered from 0"));
  }
  if (bounds.empty()) {
    return StagePlan{.rank = 0, .size = 1, .layers = middle, .device = config.device};
  }
  if (bounds.front() != middle.begin || bounds.back() != middle.end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline.layer_boundaries: must start at the bundle's first middle layer and end at its "
        "end, [",
        middle.begin, ", ", middle.end, "); got ", bounds.front(), " ... ", bounds.back()));
  }
  return StagePlan{.rank = rank,
                   .size = static_cast<int>(stages),
                   .layers = {bounds[rank], bounds[rank + 1]},
                   .device = config.pipeline.devices.empty() ? config.device
                                                             : config.pipeline.devices[rank]};
}

std::string DescribeStage(const BundleManifest& manifest, const ModelConfig& model,
                          const std::string& dtype, LayerRange layers) {
  return absl::StrCat("model ", manifest.source_architecture, " with ",
                      manifest.num_hidden_layers, " layers of hidden size ", model.hidden_size,
                      " (", manifest.model_fingerprint.empty() ? "no fingerprint"
                                                               : manifest.model_fingerprint,
                      "), layers [", layers.begin, ", ", layers.end, ") in ", dtype);
}

absl::StatusOr<std::unique_ptr<pipeline::Rendezvous>> JoinStages(const CloudConfig& config,
                                                                 int rank) {
  if (config.pipeline.backend == "nccl" && !pipeline::NcclBuilt()) {
    // Before meeting anyone: the others would otherwise wait out their timeout.
    return absl::UnimplementedError(
        "pipeline.backend nccl: this tophat-cloud was built without NCCL (no CUDA toolkit with "
        "NCCL when it was configured); use gloo");
  }
  return pipeline::Rendezvous::Join(RendezvousFor(config, rank));
}

absl::StatusOr<CloudConfig> DecideBoundaries(const CloudConfig& config, int rank,
                                             pipeline::Rendezvous& rendezvous) {
  if (config.pipeline.planned_stages == 0) return config;
  const int stages = static_cast<int>(config.pipeline.stages());
  TOPHAT_ASSIGN_OR_RETURN(BundleManifest manifest, BundleManifest::Load(config.bundle));
  TOPHAT_ASSIGN_OR_RETURN(ModelConfig model, LoadBundleConfig(config.bundle, manifest));
  TOPHAT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> checkpoint,
                          CheckpointReader::Open(config.bundle));
  const std::string device =
      config.pipeline.devices.empty() ? config.device : config.pipeline.devices[rank];
  const LayerRange middle = manifest.middle_layers;
  // One stage at a time: stages that share a host's cores would otherwise slow each other's
  // profile (and a stage with more threads would measure its contention, not its speed).
  if (rank > 0) TOPHAT_RETURN_IF_ERROR(rendezvous.Get(absl::StrCat("profile/", rank - 1)).status());
  spdlog::info("stage {}: profiling layers [{}, {}) on {} for the layer planner", rank,
               middle.begin, middle.end, device);
  TOPHAT_ASSIGN_OR_RETURN(LayerProfile profile,
                          ProfileLayers(model, *checkpoint, middle, at::Device(device),
                                        /*tokens=*/64, /*repetitions=*/5));
  CloudConfig decided = config;
  decided.pipeline.planned_stages = 0;
  TOPHAT_RETURN_IF_ERROR(
      rendezvous.Set(absl::StrCat("profile/", rank), absl::StrJoin(profile.seconds, " ")));
  if (rank == 0) {
    PlannerInputs inputs;
    inputs.layer_bytes = profile.bytes;
    for (int s = 0; s < stages; ++s) {
      PlannerDevice planned{.name = absl::StrCat("stage ", s),
                            .memory_bytes = std::numeric_limits<double>::infinity()};
      if (s == 0) {
        planned.layer_seconds = profile.seconds;
      } else {
        TOPHAT_ASSIGN_OR_RETURN(std::string text, rendezvous.Get(absl::StrCat("profile/", s)));
        TOPHAT_ASSIGN_OR_RETURN(planned.layer_seconds,
                                ParseNumbers<double>(text, absl::StrCat("stage ", s, "'s profile")));
      }
      inputs.devices.push_back(std::move(planned));
    }
    // Transfers are left out: on one host (loopback) they are small against a layer, and
    // across hosts the planner has no measured link yet.
    inputs.transfer_seconds.assign(stages, std::vector<double>(stages, 0));
    TOPHAT_ASSIGN_OR_RETURN(LayerPlan plan,
                            PlanStagesInOrder(inputs, PlanObjective::kThroughput));
    std::vector<int64_t> boundaries;
    for (int64_t b : plan.boundaries) boundaries.push_back(middle.begin + b);
    spdlog::info("pipeline: planned layer boundaries [{}], slowest stage {:.2f} ms",
                 absl::StrJoin(boundaries, ", "), 1e3 * plan.predicted_seconds);
    TOPHAT_RETURN_IF_ERROR(rendezvous.Set("boundaries", absl::StrJoin(boundaries, " ")));
  }
  TOPHAT_ASSIGN_OR_RETURN(std::string text, rendezvous.Get("boundaries"));
  TOPHAT_ASSIGN_OR_RETURN(decided.pipeline.layer_boundaries,
                          ParseNumbers<int64_t>(text, "layer boundaries"));
  return decided;
}

absl::StatusOr<std::unique_ptr<pipeline::Downstream>> ConnectStages(
    const CloudConfig& config, const CloudBundle& bundle, at::ScalarType dtype,
    int64_t kv_num_blocks, pipeline::Rendezvous& rendezvous) {
  const int stages = static_cast<int>(config.pipeline.stages());
  TOPHAT_RETURN_IF_ERROR(rendezvous.Set(
      kPoolKey, absl::StrCat(kv_num_blocks, " ", config.kv_cache.block_size)));
  spdlog::info("pipeline: waiting for stages 1..{} at {}", stages - 1,
               config.pipeline.rendezvous_address);
  for (int rank = 1; rank < stages; ++rank) {
    TOPHAT_ASSIGN_OR_RETURN(StagePlan plan,
                            PlanStage(config, rank, bundle.manifest.middle_layers));
    const std::string expected =
        DescribeStage(bundle.manifest, bundle.config, config.dtype, plan.layers);
    TOPHAT_ASSIGN_OR_RETURN(std::string described, rendezvous.Get(StageKey(rank)));
    if (described != expected) {
      const std::string refusal = absl::StrCat("stage ", rank, " runs ", described,
                                               "; stage 0 expects ", expected);
      (void)rendezvous.Set(VerdictKey(rank), refusal);
      return absl::FailedPreconditionError(absl::StrCat("pipeline: refused ", refusal));
    }
    TOPHAT_RETURN_IF_ERROR(rendezvous.Set(VerdictKey(rank), kAccepted));
  }
  TOPHAT_ASSIGN_OR_RETURN(StagePlan own, PlanStage(config, 0, bundle.manifest.middle_layers));
  TOPHAT_ASSIGN_OR_RETURN(std::unique_ptr<pipeline::StageTransport> transport,
                          ConnectLinks(config, rendezvous, own.device));
  spdlog::info("pipeline: {} stages joined over {}", stages, transport->name());
  return std::make_unique<pipeline::Downstream>(
      std::move(transport), bundle.config.hidden_size, dtype,
      bundle.manifest.middle_layers.end, Timeout(config));
}

int RunLaterStage(const CloudConfig& written, int rank) {
  spdlog::set_level(spdlog::level::from_str(written.log_level));
  if (rank <= 0 || rank >= written.pipeline.stages()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--stage ", rank, ": the config's pipeline has stages 1..", written.pipeline.stages() - 1,
        " besides stage 0 (tophat-cloud without --stage)")));
  }
  // Before the profile of planned_stages: it measures the stage as it will run.
  if (absl::Status threads = SetComputeThreads(static_cast<int>(
          written.pipeline.StageComputeThreads(rank, written.compute_threads)));
      !threads.ok()) {
    return Fail(threads);
  }
  auto rendezvous = JoinStages(written, rank);
  if (!rendezvous.ok()) return Fail(rendezvous.status());
  auto decided = DecideBoundaries(written, rank, **rendezvous);
  if (!decided.ok()) return Fail(decided.status());
  const CloudConfig& config = *decided;
  auto manifest = BundleManifest::Load(config.bundle);
  if (!manifest.ok()) return Fail(manifest.status());
  auto plan = PlanStage(config, rank, manifest->middle_layers);
  if (!plan.ok()) return Fail(plan.status());
  if (rank == 0) return Fail(absl::InvalidArgumentError("--stage 0 is the gRPC-facing daemon"));
  auto dtype = ParseTorchDtypeName(config.dtype, "dtype");
  if (!dtype.ok()) return Fail(dtype.status());
  auto small_batch_gemm = ParseSmallBatchGemm(config.small_batch_gemm, "small_batch_gemm");
  if (!small_batch_gemm.ok()) return Fail(small_batch_gemm.status());
  kernels::SetOverlapKernelLaunches(config.overlap_kernel_launches);
  kernels::SetFusedSplitMerge(config.fused_split_merge);
  spdlog::info("stage {} of {}: loading layers [{}, {}) of {} on {}", rank, plan->size,
               plan->layers.begin, plan->layers.end, config.bundle, plan->device);
  auto bundle = CloudBundle::Load(
      config.bundle,
      {.dtype = *dtype,
       .device = at::Device(plan->device),
       .max_context = config.max_context,
       .small_batch_gemm = *small_batch_gemm,
       .verification_as_decode_rows = config.verification_as_decode_rows},
      plan->layers);
  if (!bundle.ok()) return Fail(bundle.status());

  const std::string self =
      DescribeStage(bundle->manifest, bundle->config, config.dtype, plan->layers);
  if (absl::Status set = (*rendezvous)->Set(StageKey(rank), self); !set.ok()) return Fail(set);
  auto verdict = (*rendezvous)->Get(VerdictKey(rank));
  if (!verdict.ok()) return Fail(verdict.status());
  if (*verdict != kAccepted) {
    return Fail(absl::FailedPreconditionError(absl::StrCat("pipeline: stage 0 refused this "
                                                           "stage: ", *verdict)));
  }
  auto pool_shape = (*rendezvous)->Get(kPoolKey);
  if (!pool_shape.ok()) return Fail(pool_shape.status());
  auto shape = ParseNumbers<int64_t>(*pool_shape, "KV pool shape");
  if (!shape.ok()) return Fail(shape.status());
  if (shape->size() != 2) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("pipeline: malformed KV pool shape '",
                                                        *pool_shape, "' at the rendezvous")));
  }
  const int64_t num_blocks = (*shape)[0];
  const int64_t block_size = (*shape)[1];
  auto pool = KvBlockPool::Create(bundle->config, plan->layers.size(), num_blocks, block_size,
                                  *dtype, at::Device(plan->device));
  if (!pool.ok()) return Fail(pool.status());
  auto transport = ConnectLinks(config, **rendezvous, plan->device);
  if (!transport.ok()) return Fail(transport.status());
  spdlog::info("stage {} of {}: serving layers [{}, {}) over {}, KV pool {} blocks x {} positions",
               rank, plan->size, plan->layers.begin, plan->layers.end, (*transport)->name(),
               num_blocks, block_size);
  // A CUDA error thrown by a copy on a lost GPU ends the stage with a message, not a
  // std::terminate; stage 0 finds the pipeline broken and shuts it down for a restart.
  absl::Status served;
  absl::Status thrown = CatchExceptions(absl::StrCat("stage ", rank, " serving steps"), [&] {
    served = pipeline::ServeStage(**transport, *bundle->middle, *pool, Timeout(config));
  });
  if (!thrown.ok()) served = thrown;
  if (!served.ok()) return Fail(served);
  spdlog::info("stage {}: stage 0 shut the pipeline down", rank);
  return 0;
}

}  // namespace tophat
