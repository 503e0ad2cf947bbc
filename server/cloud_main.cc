// tophat-cloud: the cloud daemon. Hosts the middle submodel for every connected device agent,
// batching their sessions in one engine loop. Runs under systemd (deploy/tophat-cloud.service);
// SIGTERM drains: no new sessions, in-flight ones get drain_grace_period_s to finish. SIGHUP
// (systemctl reload) reloads who may connect and the log level (ApplyReloadedConfig).

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/cli_checks.h"
#include "base/program.h"
#include "base/service_notify.h"
#include "configs/cloud_config.h"
#include "configs/config_checks.h"
#include "configs/yaml_reader.h"
#include "kernels/cuda_device.h"
#include "kernels/decode_attention.h"
#include "models/formats/config.h"
#include "models/runtime/bundle.h"
#include "models/runtime/compute_threads.h"
#include "models/runtime/submodel.h"
#include "proto/certificate_expiry.h"
#include "proto/certificate_revocation.h"
#include "proto/channel_security.h"
#include "proto/hidden_states.h"
#include "server/cloud_metrics.h"
#include "server/cloud_service.h"
#include "server/cloud_stages.h"
#include "server/engine.h"
#include "server/kv_pool_size.h"
#include "telemetry/config_reload.h"
#include "telemetry/metrics_http_server.h"
#include "telemetry/shutdown_signals.h"

using tophat::Fail;

namespace {

using tophat::CloudConfig;

// Set by the engine thread when a pipeline stage or the GPU is lost: the daemon stops at
// once (nothing in flight can finish) and its exit code tells systemd to restart it.
std::atomic<bool> serving_lost{false};
// And when it was the GPU: nothing may touch it on the way out (frees on a lost context fail,
// some by throwing from destructors), so the daemon exits without releasing it.
std::atomic<bool> device_lost{false};

// What start-up checks before it loads weights or binds a port, shared by Run and
// --check-config (CheckConfig), so that a check passes where a start would get that far.

// The agents' port: mutual TLS unless the config says plaintext.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> AgentsPortCredentials(
    const CloudConfig& config) {
  if (config.tls.insecure) {
    spdlog::warn(config.tls.device_tokens.empty()
                     ? "tls.insecure: agents connect in plaintext, unauthenticated, and devices "
                       "have no identity; use it only on a trusted network"
                     : "tls.insecure: agents connect in plaintext and are known by their bearer "
                       "tokens (tls.device_tokens); use it only behind a proxy that ends TLS, or "
                       "on a trusted network");
    return grpc::InsecureServerCredentials();
  }
  return tophat::MutualTlsServerCredentials({.certificate_file = config.tls.certificate_file,
                                             .private_key_file = config.tls.private_key_file,
                                             .ca_file = config.tls.client_ca_file},
                                            "tls", "client_ca_file");
}

// Who may hold a stream under `config`: its device tokens, revoked devices, and the CRLs of
// tls.crl_file, read now (at start-up and at each reload: a renewed CRL applies at the next
// `systemctl reload`). A CRL past its nextUpdate still applies, and is warned of.
absl::StatusOr<tophat::DeviceAccess> AccessOf(const CloudConfig& config) {
  tophat::DeviceAccess access{.device_tokens = config.tls.device_tokens,
                              .revoked_devices = config.tls.revoked_devices};
  if (config.tls.crl_file.empty()) return access;
  auto revoked = tophat::LoadRevocationLists(config.tls.crl_file, "tls.crl_file",
                                             config.tls.client_ca_file, "tls.client_ca_file");
  if (!revoked.ok()) return revoked.status();
  tophat::WarnOfStaleRevocationLists(*revoked, "tls.crl_file", config.tls.crl_file,
                                     "renew it (deploy/make-certs.sh --crl) and reload");
  access.revoked_certificates =
      std::make_shared<const tophat::RevokedCertificates>(*std::move(revoked));
  return access;
}

// "N certificate(s) revoked by M CRL(s), " for a reload's summary; "" without a CRL.
std::string CrlSummary(const tophat::DeviceAccess& access) {
  if (access.revoked_certificates == nullptr) return "";
  return absl::StrCat(access.revoked_certificates->certificates, " certificate(s) revoked by ",
                      access.revoked_certificates->crls, " CRL(s), ");
}

// Agents refuse a cloud that announces no fingerprint (nothing would show they serve one
// model).
absl::Status CheckFingerprint(const CloudConfig& config, const tophat::BundleManifest& manifest) {
  if (!manifest.model_fingerprint.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      config.bundle, ": the bundle carries no model fingerprint; split the checkpoint again "
      "with `tophat split` and deploy both halves"));
}

// The KV pool's blocks of `block_bytes`: kv_cache.memory_bytes, or a fraction of what the
// GPU has free after the weights (`device_free_bytes`, unknown before they load).
absl::StatusOr<int64_t> KvBlocks(const CloudConfig& config, int64_t block_bytes, bool on_gpu,
                                 std::optional<int64_t> device_free_bytes) {
  auto pool_bytes = tophat::KvPoolBytes({.memory_bytes = config.kv_cache.memory_bytes,
                                         .memory_fraction = config.kv_cache.memory_fraction,
                                         .on_gpu = on_gpu,
                                         .device_free_bytes = device_free_bytes});
  if (!pool_bytes.ok()) return pool_bytes.status();
  const int64_t num_blocks = block_bytes == 0 ? 1 : *pool_bytes / block_bytes;
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.kv_cache.memory_fraction > 0 ? "kv_cache.memory_fraction: "
                                            : "kv_cache.memory_bytes: ",
        *pool_bytes, " bytes hold no KV block; one block of ", config.kv_cache.block_size,
        " positions needs ", block_bytes, " bytes"));
  }
  return num_blocks;
}

// The largest chunk the engine accepts must fit in one gRPC message, or agents hit the
// transport limit before the engine's clear per-session error.
absl::Status CheckChunkFitsMessage(const CloudConfig& config, const tophat::ModelConfig& model,
                                   at::ScalarType dtype) {
  const int64_t row_bytes = model.hidden_size * static_cast<int64_t>(at::elementSize(dtype));
  const int64_t largest_chunk = config.limits.max_chunk_tokens * row_bytes + (64 << 10);
  if (largest_chunk <= config.limits.max_message_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "limits.max_chunk_tokens: ", config.limits.max_chunk_tokens, " positions x ", row_bytes,
      " bytes do not fit limits.max_message_bytes (", config.limits.max_message_bytes,
      "); lower the first or raise the second"));
}

// --check-config: everything Run checks before it loads weights, binds a port or meets its
// pipeline's stages, printed; the exit code says whether a start would get past it.
int CheckConfig(const CloudConfig& config, const std::string& config_path) {
  std::printf("tophat-cloud --check-config %s\n", config_path.c_str());
  auto credentials = AgentsPortCredentials(config);
  if (!credentials.ok()) return Fail(credentials.status());
  if (config.tls.insecure) {
    std::printf("  tls: plaintext (tls.insecure)\n");
  } else {
    auto validity =
        tophat::ReadCertificateValidity(config.tls.certificate_file, "tls.certificate_file");
    if (!validity.ok()) return Fail(validity.status());
    std::printf("  tls: mutual; %s and its key are a pair, valid until %s\n",
                config.tls.certificate_file.c_str(),
                absl::FormatTime("%Y-%m-%d %H:%M UTC", absl::FromUnixSeconds(validity->not_after_s),
                                 absl::UTCTimeZone())
                    .c_str());
  }
  // Who may connect: what a reload (SIGHUP) would apply, checked here before one.
  const std::vector<std::string>& revoked = config.tls.revoked_devices;
  std::printf("  access: %s; %zu revoked device(s)%s%s\n",
              config.tls.device_tokens.empty()
                  ? "no device tokens (a certificate names its device)"
                  : absl::StrCat(config.tls.device_tokens.size(), " device token(s)").c_str(),
              revoked.size(), revoked.empty() ? "" : ": ", absl::StrJoin(revoked, ", ").c_str());
  auto access = AccessOf(config);
  if (!access.ok()) return Fail(access.status());
  if (const tophat::RevokedCertificates* crl = access->revoked_certificates.get()) {
    std::printf("  crl: %s: %lld revoked certificate(s) in %d CRL(s)%s\n",
                config.tls.crl_file.c_str(), static_cast<long long>(crl->certificates), crl->crls,
                crl->next_update_s
                    ? absl::StrCat(", due for renewal at ",
                                   absl::FormatTime("%Y-%m-%d %H:%M UTC",
                                                    absl::FromUnixSeconds(*crl->next_update_s),
                                                    absl::UTCTimeZone()),
                                   crl->stale_issuers.empty() ? "" : " (stale)")
                          .c_str()
                    : "");
  }
  auto dtype = tophat::ParseTorchDtypeName(config.dtype, "dtype");
  if (!dtype.ok()) return Fail(dtype.status());
  if (auto gemm = tophat::ParseSmallBatchGemm(config.small_batch_gemm, "small_batch_gemm");
      !gemm.ok()) {
    return Fail(gemm.status());
  }
  auto bundle = tophat::InspectBundle(config.bundle, tophat::BundleKind::kCloud);
  if (!bundle.ok()) return Fail(bundle.status());
  if (absl::Status fingerprint = CheckFingerprint(config, bundle->manifest); !fingerprint.ok()) {
    return Fail(fingerprint);
  }
  const tophat::LayerRange middle = bundle->manifest.middle_layers;
  std::printf("  bundle: %s: %s, middle layers [%lld, %lld) of %lld, fingerprint %s\n",
              config.bundle.c_str(), bundle->manifest.source_architecture.c_str(),
              static_cast<long long>(middle.begin), static_cast<long long>(middle.end),
              static_cast<long long>(bundle->manifest.num_hidden_layers),
              bundle->manifest.model_fingerprint.c_str());
  // Each stage's layers and device, where the config fixes them (planned_stages decides
  // them at start-up from timings).
  struct Stage {
    tophat::LayerRange layers;
    std::string device;
  };
  std::vector<Stage> stages;
  if (config.pipeline.stages() > 1 && config.pipeline.planned_stages == 0) {
    for (int rank = 0; rank < config.pipeline.stages(); ++rank) {
      auto plan = tophat::PlanStage(config, rank, middle);
      if (!plan.ok()) return Fail(plan.status());
      stages.push_back({plan->layers, plan->device});
    }
  } else if (config.pipeline.stages() <= 1) {
    stages.push_back({middle, config.device});
  } else {
    std::printf("  pipeline: %lld stages, their layers planned at start-up (planned_stages)\n",
                static_cast<long long>(config.pipeline.stages()));
  }
  // Stage 0 sizes the pool, in blocks, from its own layers; the later stages take its
  // number of blocks (cloud_stages.cc), each over its own layers.
  std::optional<int64_t> num_blocks;
  for (size_t rank = 0; rank < stages.size(); ++rank) {
    const Stage& stage = stages[rank];
    const at::Device device(stage.device);
    if (absl::Status on_host = tophat::CheckDeviceOnHost(device); !on_host.ok()) {
      return Fail(on_host);
    }
    const int64_t block_bytes = tophat::KvBlockPool::BytesPerBlock(
        bundle->config, stage.layers.size(), config.kv_cache.block_size, *dtype);
    if (rank == 0 && !(config.kv_cache.memory_fraction > 0 && device.is_cuda())) {
      auto blocks = KvBlocks(config, block_bytes, device.is_cuda(), std::nullopt);
      if (!blocks.ok()) return Fail(blocks.status());
      num_blocks = *blocks;
    }
    const std::string kv =
        num_blocks ? absl::StrCat("KV pool ", *num_blocks, " blocks x ",
                                  config.kv_cache.block_size, " positions (",
                                  (*num_blocks * block_bytes) >> 20, " MiB here)")
                   : absl::StrCat("KV pool ", config.kv_cache.memory_fraction,
                                  " of stage 0's memory free after its weights load (sized at "
                                  "start-up), ", block_bytes, " bytes a block here");
    std::printf("  stage %zu: layers [%lld, %lld) on %s, %s\n", rank,
                static_cast<long long>(stage.layers.begin),
                static_cast<long long>(stage.layers.end), stage.device.c_str(), kv.c_str());
  }
  if (absl::Status fits = CheckChunkFitsMessage(config, bundle->config, *dtype); !fits.ok()) {
    return Fail(fits);
  }
  for (const std::string& line :
       tophat::DescribeListenPorts({{"listen_address", config.listen_address},
                                    {"metrics_address", config.metrics_address}},
                                   "tophat-cloud")) {
    std::printf("  %s\n", line.c_str());
  }
  std::printf("ok: a start would load the weights next (not loaded, no port bound)\n");
  return 0;
}

using ConfigSource = tophat::ConfigSource<CloudConfig>;

// limits.max_kv_fraction_per_device of a pool of `num_blocks`, as the engine's quota (0: none).
int64_t KvBlocksPerDevice(double fraction, int64_t num_blocks) {
  if (fraction >= 1) return 0;
  return std::max<int64_t>(1, static_cast<int64_t>(fraction * static_cast<double>(num_blocks)));
}

// What a reload applies while the daemon serves (kCloudReloadedKeys): who may hold a stream,
// open ones included; the per-device quotas, for sessions opened from then on; the per-device
// message and refusal rates and the fair share (weights, decode step stretch), for connected
// devices too; and the log level. The rest waits for a restart, and is listed.
absl::StatusOr<tophat::ConfigReloader::Applied> ApplyReloadedConfig(
    const ConfigSource& source, const std::map<std::string, std::string>& started_values,
    tophat::CloudServiceImpl& service, tophat::Engine& engine, int64_t kv_num_blocks) {
  std::map<std::string, std::string> values;
  auto reloaded = source.read(&values);
  if (!reloaded.ok()) return reloaded.status();
  auto access = AccessOf(*reloaded);
  if (!access.ok()) return access.status();
  const std::string crl = CrlSummary(*access);
  const int ended = service.UpdateAccess(*std::move(access));
  const tophat::CloudConfig::Limits& limits = reloaded->limits;
  const int64_t kv_blocks_per_device =
      KvBlocksPerDevice(limits.max_kv_fraction_per_device, kv_num_blocks);
  engine.UpdateDeviceLimits({.max_sessions = limits.max_sessions_per_device,
                             .max_waiting = limits.max_waiting_sessions_per_device,
                             .max_kv_blocks = kv_blocks_per_device,
                             .weights = reloaded->scheduler.device_weights},
                            reloaded->scheduler.decode_step_stretch);
  service.UpdateRates(limits.max_messages_per_second_per_device,
                      limits.max_refusals_per_second_per_device);
  const std::string log_level =
      tophat::ReloadLogLevel(reloaded->log_level, source.log_level_from_flag);
  return tophat::ConfigReloader::Applied{
      .summary = absl::StrCat(
          reloaded->tls.device_tokens.size(), " device token(s), ",
          reloaded->tls.revoked_devices.size(), " revoked device(s), ", crl, "per device at most ",
          limits.max_sessions_per_device, " session(s) (", limits.max_waiting_sessions_per_device,
          " waiting) and ", kv_blocks_per_device, " KV block(s) (0: no limit), ",
          limits.max_messages_per_second_per_device, " message(s) and ",
          limits.max_refusals_per_second_per_device, " refusal(s) a second (0: no limit), ",
          reloaded->scheduler.device_weights.size(), " device weight(s), decode step stretch ",
          reloaded->scheduler.decode_step_stretch, ", ", log_level, "; ", ended,
          " open stream(s) no longer admitted were ended"),
      .awaiting_restart =
          tophat::KeysAwaitingRestart(started_values, values, tophat::kCloudReloadedKeys)};
}

// The engine, while it exists, for the metrics port's /devices (which starts before it).
struct ReportingEngine {
  std::mutex mutex;
  tophat::Engine* engine = nullptr;  // under mutex
};

// Sets the engine for /devices, and takes it away again before the engine goes.
class ReportingEngineScope {
 public:
  ReportingEngineScope(ReportingEngine& reporting, tophat::Engine* engine) : reporting_(reporting) {
    std::lock_guard<std::mutex> lock(reporting_.mutex);
    reporting_.engine = engine;
  }
  ~ReportingEngineScope() {
    std::lock_guard<std::mutex> lock(reporting_.mutex);
    reporting_.engine = nullptr;
  }
  ReportingEngineScope(const ReportingEngineScope&) = delete;
  ReportingEngineScope& operator=(const ReportingEngineScope&) = delete;

 private:
  ReportingEngine& reporting_;
};

tophat::HttpReply JsonError(int status, const std::string& message) {
  return {.status = status, .body = nlohmann::json{{"error", message}}.dump()};
}

// GET /devices[?limit=N]: the devices holding the most KV on this cloud (Engine::Devices), as
// JSON, for an operator asking who fills it (docs/operations.md).
tophat::HttpReply DevicesReply(ReportingEngine& reporting,
                               const std::multimap<std::string, std::string>& params) {
  constexpr int64_t kMaxLimit = 1000;
  int64_t limit = 20;
  if (const auto it = params.find("limit"); it != params.end()) {
    if (!absl::SimpleAtoi(it->second, &limit) || limit < 1 || limit > kMaxLimit) {
      return JsonError(400, absl::StrCat("limit: expected a whole number in [1, ", kMaxLimit,
                                         "], got \"", it->second, "\""));
    }
  }
  absl::StatusOr<tophat::DevicesReport> report =
      absl::UnavailableError("the engine is not running");
  {
    std::lock_guard<std::mutex> lock(reporting.mutex);
    if (reporting.engine != nullptr) {
      report = reporting.engine->Devices(
          static_cast<size_t>(limit), std::chrono::steady_clock::now() + std::chrono::seconds(2));
    }
  }
  if (!report.ok()) return JsonError(503, std::string(report.status().message()));
  nlohmann::json top = nlohmann::json::array();
  for (const tophat::DevicesReport::Device& device : report->top) {
    top.push_back({{"device", device.device},
                   {"sessions", device.sessions},
                   {"waiting", device.waiting},
                   {"kv_blocks", device.kv_blocks},
                   {"kv_fraction", report->kv_blocks_total > 0
                                       ? static_cast<double>(device.kv_blocks) /
                                             static_cast<double>(report->kv_blocks_total)
                                       : 0.0},
                   {"streams", device.streams}});
  }
  const nlohmann::json body = {{"devices", report->devices},
                               {"streams", report->streams},
                               {"kv_blocks_total", report->kv_blocks_total},
                               {"kv_blocks_allocated", report->kv_blocks_allocated},
                               {"top", std::move(top)}};
  // Device names may be anything a certificate or token gives: never fail on their bytes.
  return {.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

// `drill_device_loss_after_steps`: --drill-device-loss-after-steps (0: no drill).
int Run(const CloudConfig& written, const std::map<std::string, std::string>& written_values,
        const ConfigSource& source, int64_t drill_device_loss_after_steps) {
  spdlog::set_level(spdlog::level::from_str(written.log_level));
  if (absl::Status threads = tophat::SetComputeThreads(static_cast<int>(
          written.pipeline.StageComputeThreads(0, written.compute_threads)));
      !threads.ok()) {
    return Fail(threads);
  }
  // The agents' port's files are checked before anything loads.
  auto agents_port = AgentsPortCredentials(written);
  if (!agents_port.ok()) return Fail(agents_port.status());
  std::shared_ptr<grpc::ServerCredentials> credentials = *std::move(agents_port);
  auto access = AccessOf(written);
  if (!access.ok()) return Fail(access.status());
  // With a pipeline, stage 0 serves the stages' rendezvous, where (with planned_stages)
  // the layer boundaries are decided before anyone loads its layers.
  std::unique_ptr<tophat::pipeline::Rendezvous> rendezvous;
  CloudConfig config = written;
  if (written.pipeline.stages() > 1) {
    auto joined = tophat::JoinStages(written, 0);
    if (!joined.ok()) return Fail(joined.status());
    rendezvous = std::move(*joined);
    auto decided = tophat::DecideBoundaries(written, 0, *rendezvous);
    if (!decided.ok()) return Fail(decided.status());
    config = *std::move(decided);
  }
  auto dtype = tophat::ParseTorchDtypeName(config.dtype, "dtype");
  if (!dtype.ok()) return Fail(dtype.status());
  auto small_batch_gemm = tophat::ParseSmallBatchGemm(config.small_batch_gemm, "small_batch_gemm");
  if (!small_batch_gemm.ok()) return Fail(small_batch_gemm.status());
  tophat::SubmodelOptions submodel_options{.dtype = *dtype,
                                           .device = at::Device(config.device),
                                           .max_context = config.max_context,
                                           .small_batch_gemm = *small_batch_gemm,
                                           .verification_as_decode_rows =
                                               config.verification_as_decode_rows};
  // Before the load: the small-batch GEMM's timings and the decode graphs' capture launch
  // the kernels as steps will.
  tophat::kernels::SetOverlapKernelLaunches(config.overlap_kernel_launches);
  tophat::kernels::SetFusedSplitMerge(config.fused_split_merge);
  spdlog::info("loading cloud bundle {}", config.bundle);
  // With a pipeline, this process is stage 0 and loads only its own layers.
  std::optional<tophat::LayerRange> stage_layers;
  if (config.pipeline.stages() > 1) {
    auto manifest = tophat::BundleManifest::Load(config.bundle);
    if (!manifest.ok()) return Fail(manifest.status());
    auto plan = tophat::PlanStage(config, 0, manifest->middle_layers);
    if (!plan.ok()) return Fail(plan.status());
    stage_layers = plan->layers;
    submodel_options.device = at::Device(plan->device);
  }
  auto bundle = tophat::CloudBundle::Load(config.bundle, submodel_options, stage_layers);
  if (!bundle.ok()) return Fail(bundle.status());
  if (absl::Status fingerprint = CheckFingerprint(config, bundle->manifest); !fingerprint.ok()) {
    return Fail(fingerprint);
  }
  std::shared_ptr<const tophat::Submodel> middle = std::move(bundle->middle);
  const tophat::LayerRange layers = middle->spec().layers;

  // Sized after the weights are loaded, so that on a GPU what they took is not counted free.
  const at::Device device = submodel_options.device;
  std::optional<int64_t> device_free_bytes;
  if (device.is_cuda()) {
    if (auto memory = tophat::kernels::QueryCudaMemory(device.has_index() ? device.index() : 0)) {
      device_free_bytes = memory->free_bytes;
      spdlog::info("{}: {} MiB free of {} MiB after loading the weights", config.device,
                   memory->free_bytes >> 20, memory->total_bytes >> 20);
    }
    spdlog::info("overlap_kernel_launches: {}", config.overlap_kernel_launches
                     ? "true (tophat's kernels overlap their predecessors on GPUs of compute "
                       "capability 9.0 or later)"
                     : "false (tophat's kernels are serialized)");
    spdlog::info("fused_split_merge: {}", config.fused_split_merge
                     ? "true (split decode attention merges in the attention kernel)"
                     : "false (split decode attention merges in a second kernel)");
    spdlog::info("verification_as_decode_rows: {}",
                 config.verification_as_decode_rows
                     ? "true (verification chunks attend as decode rows, in decode graphs too)"
                     : "false (verification chunks attend as prompt chunks)");
  }
  const int64_t block_bytes = tophat::KvBlockPool::BytesPerBlock(
      middle->config(), layers.size(), config.kv_cache.block_size, *dtype);
  auto kv_blocks = KvBlocks(config, block_bytes, device.is_cuda(), device_free_bytes);
  if (!kv_blocks.ok()) return Fail(kv_blocks.status());
  const int64_t num_blocks = *kv_blocks;
  if (absl::Status fits = CheckChunkFitsMessage(config, middle->config(), *dtype); !fits.ok()) {
    return Fail(fits);
  }

  auto registry = std::make_shared<prometheus::Registry>();
  tophat::CloudMetrics metrics(*registry);
  ReportingEngine reporting;
  auto metrics_server = tophat::StartConfiguredMetricsServer(
      config.metrics_address, registry,
      {{"/devices", [&reporting](const std::multimap<std::string, std::string>& params) {
          return DevicesReply(reporting, params);
        }}});
  if (!metrics_server.ok()) return Fail(metrics_server.status());
  // When the agents' port's certificates end (alerts TophatCertificateExpires*), re-read as
  // they rotate.
  std::vector<tophat::CertificateExpiryMetrics::File> certificates;
  if (!config.tls.insecure) {
    certificates = {{.key = "tls.certificate_file", .path = config.tls.certificate_file},
                    {.key = "tls.client_ca_file", .path = config.tls.client_ca_file}};
  }
  tophat::CertificateExpiryMetrics certificate_expiry(*registry, std::move(certificates));

  tophat::EngineOptions engine_options{
      .model_id = absl::StrCat(bundle->manifest.source_architecture, " ",
                               bundle->manifest.num_hidden_layers, " layers"),
      .model_fingerprint = bundle->manifest.model_fingerprint,
      .kv_block_size = config.kv_cache.block_size,
      .kv_num_blocks = num_blocks,
      .max_batch_tokens = config.scheduler.max_batch_tokens,
      .max_running_sessions = config.scheduler.max_running_sessions,
      .max_waiting_sessions = config.scheduler.max_waiting_sessions,
      .max_chunk_tokens = config.limits.max_chunk_tokens,
      .cuda_graph_max_batch = config.cuda_graph_max_batch,
      .session_timeout_s = config.limits.session_timeout_s,
      .max_session_timeout_s = config.limits.max_session_timeout_s,
      .max_parked_session_s = config.limits.max_parked_session_s,
      .max_sessions_per_device = config.limits.max_sessions_per_device,
      .max_waiting_sessions_per_device = config.limits.max_waiting_sessions_per_device,
      .max_kv_blocks_per_device =
          KvBlocksPerDevice(config.limits.max_kv_fraction_per_device, num_blocks)};
  engine_options.control.set_prompt_chunk_size(
      static_cast<uint32_t>(config.scheduler.prompt_chunk_size));
  engine_options.control.set_draft_steps(static_cast<uint32_t>(config.scheduler.draft_steps));
  engine_options.adaptive = config.scheduler.adaptive;
  engine_options.min_prompt_chunk = config.scheduler.min_prompt_chunk_size;
  engine_options.max_step_seconds = config.scheduler.max_step_seconds;
  engine_options.max_draft_steps = config.scheduler.max_draft_steps;
  engine_options.decode_step_stretch = config.scheduler.decode_step_stretch;
  engine_options.device_weights = config.scheduler.device_weights;
  for (const std::string& name : config.scheduler.wire_dtypes) {
    // Validated with the config (CheckWireDtypeChoice).
    if (auto dtype = tophat::ParseWireDtypeName(name); dtype.ok()) {
      engine_options.wire_dtypes.push_back(*dtype);
    }
  }
  std::unique_ptr<tophat::pipeline::Downstream> downstream;
  if (config.pipeline.stages() > 1) {
    auto connected = tophat::ConnectStages(config, *bundle, *dtype, num_blocks, *rendezvous);
    if (!connected.ok()) return Fail(connected.status());
    downstream = std::move(*connected);
    engine_options.downstream = downstream.get();
    // A lost stage leaves the links in an unknown state: stop serving (agents replay on the
    // successor) and exit non-zero so that the supervisor restarts the pipeline.
    engine_options.on_pipeline_lost = [](const absl::Status& status) {
      spdlog::error("pipeline: lost a stage ({}); shutting down for a restart",
                    status.ToString());
      tophat::ServiceNotify(absl::StrCat("STATUS=lost a pipeline stage: ", status.message()));
      serving_lost.store(true);
      tophat::RequestShutdown();
    };
  }
  // A lost GPU context fails every later call on it: stop serving (the engine has failed
  // every session with UNAVAILABLE, and agents replay them on another cloud) and exit
  // non-zero, so that systemd restarts the service on a working device, or its start-up
  // fails naming the device that is gone.
  engine_options.on_device_lost = [](const absl::Status& status) {
    spdlog::error("{}; shutting down for a restart", std::string(status.message()));
    tophat::ServiceNotify(absl::StrCat("STATUS=", status.message()));
    device_lost.store(true);
    serving_lost.store(true);
    tophat::RequestShutdown();
  };
  engine_options.drill_device_loss_after_steps = drill_device_loss_after_steps;
  if (drill_device_loss_after_steps > 0) {
    spdlog::warn("failover drill: after {} step(s) this cloud acts as if its device were lost, "
                 "fails every session with UNAVAILABLE and exits 1",
                 drill_device_loss_after_steps);
  }
  auto engine = tophat::Engine::Create(engine_options, middle, &metrics);
  if (!engine.ok()) return Fail(engine.status());
  const ReportingEngineScope reporting_scope(reporting, engine->get());
  spdlog::info("middle layers [{}, {}), KV pool {} blocks x {} positions ({} MiB)", layers.begin,
               layers.end, num_blocks, config.kv_cache.block_size,
               num_blocks * block_bytes >> 20);

  tophat::CloudServiceImpl service(
      engine->get(),
      {.max_inflight_bytes_per_stream = config.limits.max_inflight_bytes_per_stream,
       .max_queued_bytes_per_stream = config.limits.max_queued_bytes_per_stream,
       .max_queued_bytes_total = config.limits.max_queued_bytes_total,
       .unread_timeout_s = config.limits.unread_stream_timeout_s,
       .max_messages_per_second_per_device = config.limits.max_messages_per_second_per_device,
       .max_refusals_per_second_per_device = config.limits.max_refusals_per_second_per_device,
       .access = *std::move(access),
       .metrics = &metrics});
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // Without this, gRPC sets SO_REUSEPORT and a second daemon on the same port would start
  // and share the traffic instead of failing.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Keepalives: agents ping (reconnect.keepalive_s) to notice a frozen cloud; accept their
  // pings down to one a second, with or without a call, instead of gRPC's default 5 minutes
  // (which would answer them with GOAWAY "too_many_pings"). And ping agents too, so that a
  // vanished device's stream (and its KV) is released in about a minute, not at its
  // sessions' deadlines.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  if (absl::Status can = tophat::CheckCanListen(config.listen_address, "listen_address");
      !can.ok()) {
    return Fail(can);
  }
  int bound_port = 0;
  builder.AddListeningPort(config.listen_address, credentials, &bound_port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.limits.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(config.limits.max_message_bytes));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    return Fail(absl::UnavailableError(
        absl::StrCat("listen_address: cannot listen on ", config.listen_address)));
  }
  (*engine)->Start();
  server->GetHealthCheckService()->SetServingStatus(true);
  spdlog::info("tophat-cloud serving on {} (metrics: {})", config.listen_address,
               config.metrics_address.empty() ? "off" : config.metrics_address);
  tophat::ServiceNotify(absl::StrCat("READY=1\nSTATUS=serving on ", config.listen_address));
  // systemd's watchdog (WatchdogSec=), fed only while the engine loop turns: a wedged engine
  // (a hung kernel, a deadlock) stops the pings and systemd restarts the service. A step
  // longer than the interval reads as wedged too: keep WatchdogSec above the longest step.
  std::mutex watchdog_mutex;
  std::condition_variable watchdog_cv;
  bool watchdog_stop = false;  // under watchdog_mutex
  std::thread watchdog;
  if (const auto interval = tophat::ServiceWatchdogInterval()) {
    watchdog = std::thread([&, interval = *interval] {
      bool warned = false;
      std::unique_lock<std::mutex> lock(watchdog_mutex);
      while (!watchdog_stop) {
        const auto age = std::chrono::steady_clock::now() - (*engine)->last_turn();
        if (age < interval) {
          tophat::ServiceNotify("WATCHDOG=1");
          warned = false;
        } else if (!warned) {
          spdlog::error("the engine loop has not turned for {:.1f} s; no longer feeding "
                        "systemd's watchdog",
                        std::chrono::duration<double>(age).count());
          warned = true;
        }
        watchdog_cv.wait_for(lock, interval / 4, [&] { return watchdog_stop; });
      }
    });
  }

  // SIGHUP (systemctl reload): who may connect and the log level change at once; the rest
  // of the file waits for a restart, and the reload says which keys.
  tophat::ConfigReloader reloader(
      *registry, {.daemon = "tophat-cloud", .config_path = source.path, .apply = [&] {
                    return ApplyReloadedConfig(source, written_values, service, **engine,
                                               num_blocks);
                  }});
  const char* signal_name = tophat::WaitForShutdownSignal([&] { reloader.Reload(); });
  // After a loss, STATUS keeps saying what was lost (systemctl status shows it).
  tophat::ServiceNotify(serving_lost.load() ? "STOPPING=1" : "STOPPING=1\nSTATUS=draining");
  // Without its stages or its GPU nothing in flight can finish: no grace period.
  const double grace_s = serving_lost.load() ? 0 : config.drain_grace_period_s;
  spdlog::info("{}: draining (grace period {:.0f}s)", signal_name, grace_s);

  server->GetHealthCheckService()->SetServingStatus(false);
  (*engine)->BeginDrain();
  const auto grace_end = std::chrono::steady_clock::now() +
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(grace_s));
  if (!(*engine)->WaitForNoSessions(grace_end)) {
    const tophat::EngineStats left = (*engine)->stats();
    spdlog::warn("grace period over: cancelling {} session(s)",
                 left.sessions_running + left.sessions_waiting);
    (*engine)->CancelAll(absl::UnavailableError("the cloud shut down before the session ended"));
  }
  // The cancellations reach the agents before the streams close: the engine has sent them
  // once no session is left, and gRPC has them once nothing is queued (at most 1 s each).
  const auto flushed_by = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  (*engine)->WaitForNoSessions(flushed_by);
  while (service.outgoing_queued_bytes() > 0 && std::chrono::steady_clock::now() < flushed_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  (*engine)->Stop();
  {
    std::lock_guard<std::mutex> lock(watchdog_mutex);
    watchdog_stop = true;
  }
  watchdog_cv.notify_one();
  if (watchdog.joinable()) watchdog.join();
  if (device_lost.load()) {
    // The driver reclaims the process's GPU memory when it exits. The later stages, if
    // any, find the pipeline broken and exit too.
    spdlog::error("tophat-cloud stopped after losing its GPU; exiting without releasing it");
    spdlog::shutdown();
    std::_Exit(1);
  }
  if (downstream != nullptr) downstream->Shutdown();
  spdlog::info("tophat-cloud stopped");
  return serving_lost.load() ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  tophat::ConfigureAllocatorForPayloads();

  CLI::App app{
      "tophat-cloud: the cloud daemon of tophat. Hosts the middle submodel and serves device "
      "agents over gRPC with continuous batching, chunked prefill and a paged KV cache."};
  std::string config_path;
  std::string bundle;
  std::string listen;
  std::string metrics;
  std::string log_level;
  app.add_option("-c,--config", config_path, "YAML config (see configs/cloud.yaml)")
      ->check(CLI::ExistingFile);
  app.add_option("--bundle", bundle, "Cloud bundle directory (overrides `bundle`)");
  app.add_option("--listen", listen, "host:port for agents (overrides `listen_address`)");
  app.add_option("--metrics", metrics,
                 "host:port for Prometheus, or \"\" to disable (overrides `metrics_address`)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  int stage = 0;
  app.add_option("--stage", stage,
                 "Run as stage N > 0 of the config's pipeline (pipeline.layer_boundaries): a "
                 "worker that serves its layers for stage 0, which is this program without "
                 "--stage")
      ->check(CLI::NonNegativeNumber);
  bool check_config = false;
  app.add_flag("--check-config", check_config,
               "Check the config and what it names (TLS files, bundle, devices, KV pool, "
               "ports) as far as a start gets before it loads the weights, print what it found, "
               "and exit: 0 when a start would get that far. Run it before a restart");
  int64_t drill_device_loss_after_steps = 0;
  app.add_option("--drill-device-loss-after-steps", drill_device_loss_after_steps,
                 "A failover drill: serve N engine steps, then act exactly as on a lost GPU "
                 "(every session fails with UNAVAILABLE and its agent replays it on another "
                 "cloud; the daemon exits 1). Nothing is broken. Run it outside the systemd "
                 "unit, whose Restart= would restart the drill (docs/operations.md)")
      ->check(tophat::PositiveNumber())
      ->group("Drills");
  CLI11_PARSE(app, argc, argv);

  const bool metrics_from_flag = app.count("--metrics") > 0;
  const ConfigSource source{
      .path = config_path,
      .read = [&](std::map<std::string, std::string>* values) -> absl::StatusOr<CloudConfig> {
        CloudConfig config;
        if (!config_path.empty()) {
          auto loaded = tophat::LoadCloudConfig(config_path, values);
          if (!loaded.ok()) return loaded.status();
          config = *std::move(loaded);
        }
        if (!bundle.empty()) config.bundle = bundle;
        if (!listen.empty()) config.listen_address = listen;
        if (metrics_from_flag) config.metrics_address = metrics;
        if (!log_level.empty()) config.log_level = log_level;
        if (absl::Status valid = tophat::ValidateCloudConfig(config); !valid.ok()) return valid;
        return config;
      },
      .log_level_from_flag = !log_level.empty()};
  std::map<std::string, std::string> values;
  auto read = source.read(&values);
  if (!read.ok()) return Fail(read.status());
  const CloudConfig config = *std::move(read);
  if (check_config) return CheckConfig(config, config_path.empty() ? "(no --config)" : config_path);
  // A later stage keeps no sessions and has nothing to drain: SIGTERM simply ends it. Nor has
  // it anything to reload (who may connect is stage 0's): SIGHUP, say a `pkill -HUP
  // tophat-cloud` meant for stage 0, must not end it and with it the pipeline.
  if (stage > 0) {
    if (drill_device_loss_after_steps > 0) {
      return Fail(absl::InvalidArgumentError(
          "--drill-device-loss-after-steps: a drill runs on stage 0, not on a later stage"));
    }
    std::signal(SIGHUP, SIG_IGN);
    return tophat::RunLaterStage(config, stage);
  }
  // No thread exists yet (parsing started none): every thread to come inherits the mask.
  tophat::BlockShutdownSignals();
  return Run(config, values, source, drill_device_loss_after_steps);
}
