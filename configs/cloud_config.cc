#include "configs/cloud_config.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "configs/config_checks.h"
#include "configs/yaml_reader.h"
#include "base/status_macros.h"

namespace tophat {
namespace {

// The checks shared by the loader (which reports through the reader, adding file:line) and
// ValidateCloudConfig. `report(key, message, related_key)` is called once per problem;
// `related_key` names the other key of a conflict between two ("" for none).
template <typename Report>
void CheckCloudConfig(const CloudConfig& config, bool require_bundle, Report&& report) {
  auto check = [&](std::string_view key, const absl::Status& status) {
    if (!status.ok()) report(key, std::string(status.message()), "");
  };
  if (require_bundle && config.bundle.empty()) {
    report("bundle", "required (set it in the config or on the command line)", "");
  }
  if (auto problem = TlsSectionProblem({.prefix = "tls",
                                         .insecure = config.tls.insecure,
                                         .certificate_file = config.tls.certificate_file,
                                         .private_key_file = config.tls.private_key_file,
                                         .ca_file = config.tls.client_ca_file,
                                         .ca_field = "client_ca_file",
                                         .purpose = "agents connect to the cloud"},
                                        require_bundle)) {
    report(problem->first, problem->second, "");
  }
  check("listen_address", CheckHostPort(config.listen_address, /*allow_port_zero=*/true));
  check("dtype", CheckDtype(config.dtype));
  check("device", CheckDevice(config.device));
  if (CheckDtype(config.dtype).ok() && CheckDevice(config.device).ok()) {
    check("dtype", CheckDtypeOnDevice(config.dtype, config.device));
  }
  check("compute_threads", CheckAtLeast(config.compute_threads, 0));
  if (config.small_batch_gemm != "measured" && config.small_batch_gemm != "always" &&
      config.small_batch_gemm != "never") {
    report("small_batch_gemm",
           absl::StrCat("\"", config.small_batch_gemm,
                        "\" is none of \"measured\", \"always\", \"never\""),
           "");
  }
  check("max_context", CheckAtLeast(config.max_context, 1));
  check("kv_cache.block_size", CheckAtLeast(config.kv_cache.block_size, 1));
  check("kv_cache.memory_bytes", CheckAtLeast(config.kv_cache.memory_bytes, 1));
  if (config.kv_cache.memory_fraction < 0 || config.kv_cache.memory_fraction >= 1) {
    report("kv_cache.memory_fraction",
           absl::StrCat(config.kv_cache.memory_fraction,
                        " is outside [0, 1): 0 uses kv_cache.memory_bytes, and the weights' "
                        "activations need some of the free memory"),
           "");
  } else if (config.kv_cache.memory_fraction > 0 && config.device == "cpu") {
    report("kv_cache.memory_fraction",
           "sizes the pool from free GPU memory, but device is cpu; set kv_cache.memory_bytes",
           "device");
  }
  // The pool is allocated up front (no allocation in the step), so a size the machine
  // cannot hold would only fail later, at load, or push the host into swap. On a GPU the
  // real bound is device memory, which only the engine can query; host memory still
  // catches a misplaced unit ("256GiB" for "256MiB").
  if (const int64_t physical = PhysicalMemoryBytes();
      physical > 0 && config.kv_cache.memory_bytes > physical) {
    report("kv_cache.memory_bytes",
           absl::StrCat(FormatByteSize(config.kv_cache.memory_bytes),
                        " is more than this machine's physical memory (", FormatByteSize(physical),
                        ")"),
           "");
  }
  check("scheduler.max_batch_tokens", CheckAtLeast(config.scheduler.max_batch_tokens, 1));
  check("scheduler.max_running_sessions", CheckAtLeast(config.scheduler.max_running_sessions, 1));
  check("scheduler.max_waiting_sessions", CheckAtLeast(config.scheduler.max_waiting_sessions, 0));
  check("scheduler.prompt_chunk_size", CheckAtLeast(config.scheduler.prompt_chunk_size, 1));
  check("scheduler.draft_steps", CheckAtLeast(config.scheduler.draft_steps, 0));
  check("scheduler.min_prompt_chunk_size", CheckAtLeast(config.scheduler.min_prompt_chunk_size, 1));
  check("scheduler.max_step_seconds",
        CheckAtLeast(config.scheduler.max_step_seconds, 0, /*inclusive=*/true));
  check("scheduler.max_draft_steps", CheckAtLeast(config.scheduler.max_draft_steps, 0));
  check("scheduler.decode_step_stretch",
        config.scheduler.decode_step_stretch == 0 || config.scheduler.decode_step_stretch >= 1
            ? absl::OkStatus()
            : absl::InvalidArgumentError(absl::StrCat(
                  "is ", config.scheduler.decode_step_stretch,
                  "; it must be 0 (no cap) or at least 1 (a step's decode work alone)")));
  for (size_t i = 0; i < config.scheduler.wire_dtypes.size(); ++i) {
    const std::string& dtype = config.scheduler.wire_dtypes[i];
    const std::string key = absl::StrCat("scheduler.wire_dtypes[", i, "]");
    check(key, CheckWireDtypeChoice(dtype));
    if (std::find(config.scheduler.wire_dtypes.begin(), config.scheduler.wire_dtypes.begin() + i,
                  dtype) != config.scheduler.wire_dtypes.begin() + i) {
      report(key, absl::StrCat("\"", dtype, "\" is listed twice"), "");
    }
  }
  check("limits.max_message_bytes", CheckAtLeast(config.limits.max_message_bytes, 1));
  check("limits.max_chunk_tokens", CheckAtLeast(config.limits.max_chunk_tokens, 1));
  check("limits.session_timeout_s",
        CheckAtLeast(config.limits.session_timeout_s, 0, /*inclusive=*/false));
  check("limits.max_parked_session_s",
        CheckAtLeast(config.limits.max_parked_session_s, 0, /*inclusive=*/true));
  check("limits.max_session_timeout_s",
        CheckAtLeast(config.limits.max_session_timeout_s, 0, /*inclusive=*/true));
  check("limits.max_sessions_per_device", CheckAtLeast(config.limits.max_sessions_per_device, 0));
  check("limits.max_waiting_sessions_per_device",
        CheckAtLeast(config.limits.max_waiting_sessions_per_device, 0));
  if (!(config.limits.max_kv_fraction_per_device > 0 &&
        config.limits.max_kv_fraction_per_device <= 1)) {
    report("limits.max_kv_fraction_per_device",
           absl::StrCat(config.limits.max_kv_fraction_per_device, " is not in (0, 1]"), "");
  }
  check("limits.max_messages_per_second_per_device",
        CheckAtLeast(config.limits.max_messages_per_second_per_device, 0, /*inclusive=*/true));
  check("limits.max_refusals_per_second_per_device",
        CheckAtLeast(config.limits.max_refusals_per_second_per_device, 0, /*inclusive=*/true));
  check("limits.max_queued_bytes_per_stream",
        CheckAtLeast(config.limits.max_queued_bytes_per_stream, 1));
  check("limits.max_inflight_bytes_per_stream",
        CheckAtLeast(config.limits.max_inflight_bytes_per_stream, 1));
  check("limits.max_queued_bytes_total", CheckAtLeast(config.limits.max_queued_bytes_total, 1));
  check("limits.unread_stream_timeout_s",
        CheckAtLeast(config.limits.unread_stream_timeout_s, 0, /*inclusive=*/false));
  if (config.limits.max_session_timeout_s > 0 &&
      config.limits.session_timeout_s > config.limits.max_session_timeout_s) {
    report("limits.session_timeout_s",
           absl::StrCat(config.limits.session_timeout_s, " is more than limits.max_session_timeout_s (",
                        config.limits.max_session_timeout_s, ")"),
           "limits.max_session_timeout_s");
  }
  check("drain_grace_period_s", CheckAtLeast(config.drain_grace_period_s, 0, /*inclusive=*/true));
  if (!config.metrics_address.empty()) {
    check("metrics_address", CheckHostPort(config.metrics_address, /*allow_port_zero=*/true));
  }
  check("log_level", CheckLogLevel(config.log_level));

  const CloudConfig::Pipeline& pipeline = config.pipeline;
  if (pipeline.planned_stages == 1) {
    report("pipeline.planned_stages", "1 is one stage; use 0 (no pipeline) or 2 and more", "");
  }
  if (pipeline.planned_stages > 0 && !pipeline.layer_boundaries.empty()) {
    report("pipeline.planned_stages",
           "set either planned_stages (the planner chooses the layers) or layer_boundaries, "
           "not both",
           "pipeline.layer_boundaries");
  }
  if (pipeline.planned_stages > 1 && pipeline.rendezvous_address.empty()) {
    report("pipeline.rendezvous_address", "required with pipeline.planned_stages",
           "pipeline.planned_stages");
  }
  if (!pipeline.layer_boundaries.empty()) {
    if (pipeline.layer_boundaries.size() < 3) {
      report("pipeline.layer_boundaries",
             "needs at least 3 layer numbers (two stages); leave it empty for one stage", "");
    }
    for (size_t i = 1; i < pipeline.layer_boundaries.size(); ++i) {
      if (pipeline.layer_boundaries[i] <= pipeline.layer_boundaries[i - 1]) {
        report("pipeline.layer_boundaries",
               absl::StrCat("must increase (stage ", i - 1, " would run layers [",
                            pipeline.layer_boundaries[i - 1], ", ", pipeline.layer_boundaries[i],
                            "))"),
               "");
        break;
      }
    }
    check("pipeline.rendezvous_address",
          pipeline.rendezvous_address.empty()
              ? absl::InvalidArgumentError("required with pipeline.layer_boundaries")
              : CheckHostPort(pipeline.rendezvous_address, /*allow_port_zero=*/false));
  }
  if (!pipeline.devices.empty() &&
      static_cast<int64_t>(pipeline.devices.size()) != pipeline.stages()) {
    report("pipeline.devices",
           absl::StrCat(pipeline.devices.size(), " devices for ", pipeline.stages(),
                        " stages; give one per stage or none"),
           "pipeline.layer_boundaries");
  }
  if (!pipeline.compute_threads.empty() &&
      static_cast<int64_t>(pipeline.compute_threads.size()) != pipeline.stages()) {
    report("pipeline.compute_threads",
           absl::StrCat(pipeline.compute_threads.size(), " thread counts for ", pipeline.stages(),
                        " stages; give one per stage or none"),
           "pipeline.layer_boundaries");
  }
  for (const std::string& device : pipeline.devices) {
    check("pipeline.devices", CheckDevice(device));
  }
  check("pipeline.timeout_s", CheckAtLeast(pipeline.timeout_s, 0, /*inclusive=*/false));
  if (pipeline.backend != "gloo" && pipeline.backend != "nccl") {
    report("pipeline.backend", absl::StrCat("\"", pipeline.backend, "\" is not gloo or nccl"), "");
  } else if (pipeline.backend == "nccl" && pipeline.stages() > 1) {
    // NCCL moves tensors between GPUs only: every stage's device must be one.
    for (int64_t stage = 0; stage < pipeline.stages(); ++stage) {
      const std::string& device =
          pipeline.devices.empty() ? config.device : pipeline.devices[stage];
      if (!absl::StartsWith(device, "cuda")) {
        report("pipeline.backend",
               absl::StrCat("nccl needs every stage on a CUDA device; stage ", stage, " is on ",
                            device, " (use gloo)"),
               pipeline.devices.empty() ? "device" : "pipeline.devices");
        break;
      }
    }
  }

  // Agents send prompt chunks of the announced size and verification chunks of
  // draft_steps + 1 tokens; a limit below either would fail every request.
  if (config.scheduler.min_prompt_chunk_size > config.limits.max_chunk_tokens) {
    report("scheduler.min_prompt_chunk_size",
           absl::StrCat(config.scheduler.min_prompt_chunk_size,
                        " is more than limits.max_chunk_tokens (", config.limits.max_chunk_tokens,
                        ")"),
           "limits.max_chunk_tokens");
  }
  if (config.scheduler.prompt_chunk_size > config.limits.max_chunk_tokens) {
    report(
        "scheduler.prompt_chunk_size",
        absl::StrCat(config.scheduler.prompt_chunk_size, " is more than limits.max_chunk_tokens (",
                     config.limits.max_chunk_tokens, "): every prompt chunk would be rejected"),
        "limits.max_chunk_tokens");
  }
  if (config.scheduler.draft_steps >= config.limits.max_chunk_tokens) {
    report("scheduler.draft_steps",
           absl::StrCat(config.scheduler.draft_steps,
                        " drafting steps plus one do not fit limits.max_chunk_tokens (",
                        config.limits.max_chunk_tokens, ")"),
           "limits.max_chunk_tokens");
  }
}

absl::StatusOr<CloudConfig> ReadCloudConfig(YamlReader& reader) {
  CloudConfig config;
  reader.ReadString("listen_address", &config.listen_address);
  reader.ReadString("bundle", &config.bundle);
  reader.ReadBool("tls.insecure", &config.tls.insecure);
  reader.ReadString("tls.certificate_file", &config.tls.certificate_file);
  reader.ReadString("tls.private_key_file", &config.tls.private_key_file);
  reader.ReadString("tls.client_ca_file", &config.tls.client_ca_file);
  std::vector<std::string> device_tokens;
  reader.ReadStringList("tls.device_tokens", &device_tokens);
  if (auto parsed = ParseBearerTokens(device_tokens, "tls.device_tokens"); parsed.ok()) {
    config.tls.device_tokens = *std::move(parsed);
  } else {
    reader.AddError("tls.device_tokens", std::string(parsed.status().message()));
  }
  reader.ReadStringList("tls.revoked_devices", &config.tls.revoked_devices);
  if (auto checked = CheckDeviceNames(config.tls.revoked_devices, "tls.revoked_devices");
      !checked.ok()) {
    reader.AddError("tls.revoked_devices", std::string(checked.message()));
  }
  reader.ReadString("tls.crl_file", &config.tls.crl_file);
  if (config.tls.insecure && !config.tls.crl_file.empty()) {
    reader.AddError("tls.crl_file",
                    "revokes certificates, and with tls.insecure devices present none",
                    "tls.insecure");
  }
  reader.ReadString("dtype", &config.dtype);
  reader.ReadString("device", &config.device);
  reader.ReadInt("compute_threads", &config.compute_threads, Bound::kNonNegative);
  reader.ReadInt("cuda_graph_max_batch", &config.cuda_graph_max_batch, Bound::kNonNegative);
  reader.ReadString("small_batch_gemm", &config.small_batch_gemm);
  reader.ReadBool("overlap_kernel_launches", &config.overlap_kernel_launches);
  reader.ReadBool("fused_split_merge", &config.fused_split_merge);
  reader.ReadBool("verification_as_decode_rows", &config.verification_as_decode_rows);
  reader.ReadInt("max_context", &config.max_context, Bound::kPositive);
  reader.ReadInt("kv_cache.block_size", &config.kv_cache.block_size, Bound::kPositive);
  reader.ReadByteSize("kv_cache.memory_bytes", &config.kv_cache.memory_bytes, Bound::kPositive);
  reader.ReadDouble("kv_cache.memory_fraction", &config.kv_cache.memory_fraction,
                    Bound::kNonNegative);
  reader.ReadInt("scheduler.max_batch_tokens", &config.scheduler.max_batch_tokens,
                 Bound::kPositive);
  reader.ReadInt("scheduler.max_running_sessions", &config.scheduler.max_running_sessions,
                 Bound::kPositive);
  reader.ReadInt("scheduler.max_waiting_sessions", &config.scheduler.max_waiting_sessions,
                 Bound::kNonNegative);
  reader.ReadInt("scheduler.prompt_chunk_size", &config.scheduler.prompt_chunk_size,
                 Bound::kPositive);
  reader.ReadInt("scheduler.draft_steps", &config.scheduler.draft_steps, Bound::kNonNegative);
  reader.ReadBool("scheduler.adaptive", &config.scheduler.adaptive);
  reader.ReadInt("scheduler.min_prompt_chunk_size", &config.scheduler.min_prompt_chunk_size,
                 Bound::kPositive);
  reader.ReadSeconds("scheduler.max_step_seconds", &config.scheduler.max_step_seconds,
                     Bound::kNonNegative);
  reader.ReadInt("scheduler.max_draft_steps", &config.scheduler.max_draft_steps,
                 Bound::kNonNegative);
  reader.ReadStringList("scheduler.wire_dtypes", &config.scheduler.wire_dtypes);
  reader.ReadDouble("scheduler.decode_step_stretch", &config.scheduler.decode_step_stretch,
                    Bound::kNonNegative);
  std::vector<std::string> device_weights;
  reader.ReadStringList("scheduler.device_weights", &device_weights);
  for (size_t i = 0; i < device_weights.size(); ++i) {
    const std::string& entry = device_weights[i];
    const size_t colon = entry.rfind(':');
    double weight = 0;
    const std::string key = absl::StrCat("scheduler.device_weights[", i, "]");
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtod(entry.substr(colon + 1), &weight) || !(weight > 0) ||
        !std::isfinite(weight)) {
      reader.AddError(key, absl::StrCat("\"", entry,
                                        "\" is not DEVICE:WEIGHT with a positive weight"));
      continue;
    }
    const std::string device = entry.substr(0, colon);
    if (!config.scheduler.device_weights.emplace(device, weight).second) {
      reader.AddError(key, absl::StrCat("device \"", device, "\" is listed twice"));
    }
  }
  reader.ReadByteSize("limits.max_message_bytes", &config.limits.max_message_bytes,
                      Bound::kPositive);
  reader.ReadInt("limits.max_chunk_tokens", &config.limits.max_chunk_tokens, Bound::kPositive);
  std::vector<std::string> boundaries;
  reader.ReadString("pipeline.rendezvous_address", &config.pipeline.rendezvous_address);
  reader.ReadStringList("pipeline.layer_boundaries", &boundaries);
  for (const std::string& text : boundaries) {
    int64_t layer = 0;
    if (!absl::SimpleAtoi(text, &layer) || layer < 0) {
      reader.AddError("pipeline.layer_boundaries",
                      absl::StrCat("\"", text, "\" is not a layer number"));
      break;
    }
    config.pipeline.layer_boundaries.push_back(layer);
  }
  reader.ReadInt("pipeline.planned_stages", &config.pipeline.planned_stages,
                 Bound::kNonNegative);
  reader.ReadStringList("pipeline.devices", &config.pipeline.devices);
  std::vector<std::string> stage_threads;
  reader.ReadStringList("pipeline.compute_threads", &stage_threads);
  for (const std::string& text : stage_threads) {
    int64_t threads = 0;
    if (!absl::SimpleAtoi(text, &threads) || threads < 0) {
      reader.AddError("pipeline.compute_threads",
                      absl::StrCat("\"", text, "\" is not a thread count (0: all cores)"));
      break;
    }
    config.pipeline.compute_threads.push_back(threads);
  }
  reader.ReadString("pipeline.backend", &config.pipeline.backend);
  reader.ReadString("pipeline.interface", &config.pipeline.interface);
  reader.ReadSeconds("pipeline.timeout_s", &config.pipeline.timeout_s, Bound::kPositive);
  reader.ReadSeconds("limits.session_timeout_s", &config.limits.session_timeout_s,
                     Bound::kPositive);
  reader.ReadSeconds("limits.max_parked_session_s", &config.limits.max_parked_session_s,
                     Bound::kNonNegative);
  reader.ReadSeconds("limits.max_session_timeout_s", &config.limits.max_session_timeout_s,
                     Bound::kNonNegative);
  reader.ReadInt("limits.max_sessions_per_device", &config.limits.max_sessions_per_device,
                 Bound::kNonNegative);
  reader.ReadInt("limits.max_waiting_sessions_per_device",
                 &config.limits.max_waiting_sessions_per_device, Bound::kNonNegative);
  reader.ReadDouble("limits.max_kv_fraction_per_device",
                    &config.limits.max_kv_fraction_per_device, Bound::kPositive);
  reader.ReadDouble("limits.max_messages_per_second_per_device",
                    &config.limits.max_messages_per_second_per_device, Bound::kNonNegative);
  reader.ReadDouble("limits.max_refusals_per_second_per_device",
                    &config.limits.max_refusals_per_second_per_device, Bound::kNonNegative);
  reader.ReadByteSize("limits.max_queued_bytes_per_stream",
                      &config.limits.max_queued_bytes_per_stream, Bound::kPositive);
  reader.ReadByteSize("limits.max_inflight_bytes_per_stream",
                      &config.limits.max_inflight_bytes_per_stream, Bound::kPositive);
  reader.ReadSeconds("limits.unread_stream_timeout_s", &config.limits.unread_stream_timeout_s,
                     Bound::kPositive);
  reader.ReadByteSize("limits.max_queued_bytes_total", &config.limits.max_queued_bytes_total,
                      Bound::kPositive);
  reader.ReadSeconds("drain_grace_period_s", &config.drain_grace_period_s, Bound::kNonNegative);
  reader.ReadString("metrics_address", &config.metrics_address);
  reader.ReadString("log_level", &config.log_level);

  CheckCloudConfig(
      config, /*require_bundle=*/false,
      [&](std::string_view key, std::string_view message, std::string_view related_key) {
        reader.AddError(key, message, related_key);
      });
  TOPHAT_RETURN_IF_ERROR(reader.Finish());
  config.bundle = ResolveConfigPath(config.bundle, reader.source_name());
  for (std::string* path : {&config.tls.certificate_file, &config.tls.private_key_file,
                            &config.tls.client_ca_file, &config.tls.crl_file}) {
    if (!path->empty()) *path = ResolveConfigPath(*path, reader.source_name());
  }
  return config;
}

}  // namespace

absl::StatusOr<CloudConfig> LoadCloudConfig(const std::filesystem::path& path,
                                            std::map<std::string, std::string>* values) {
  TOPHAT_ASSIGN_OR_RETURN(YamlReader reader, YamlReader::Load(path));
  if (values != nullptr) *values = reader.Values();
  return ReadCloudConfig(reader);
}

absl::StatusOr<CloudConfig> ParseCloudConfig(std::string_view yaml, std::string_view source_name) {
  TOPHAT_ASSIGN_OR_RETURN(YamlReader reader, YamlReader::Parse(yaml, std::string(source_name)));
  return ReadCloudConfig(reader);
}

absl::Status ValidateCloudConfig(const CloudConfig& config) {
  ConfigErrors errors;
  CheckCloudConfig(config, /*require_bundle=*/true,
                   [&](std::string_view key, std::string_view message, std::string_view) {
                     errors.Add(key, /*line=*/0, message);
                   });
  return errors.ToStatus();
}

}  // namespace tophat
