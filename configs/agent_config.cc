#include "configs/agent_config.h"

#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "configs/config_checks.h"
#include "configs/yaml_reader.h"

namespace tophat {
namespace {

// The checks shared by the loader (which reports through the reader, adding file:line) and
// ValidateAgentConfig. `report(key, message, related_key)` is called once per problem;
// `related_key` names the other key of a conflict between two ("" for none).
template <typename Report>
void CheckAgentConfig(const AgentConfig& config, bool require_bundle, Report&& report) {
  auto check = [&](std::string_view key, const absl::Status& status) {
    if (!status.ok()) report(key, std::string(status.message()), "");
  };
  if (require_bundle && config.bundle.empty()) {
    report("bundle", "required (set it in the config or on the command line)", "");
  }
  if (auto problem = TlsSectionProblem({.prefix = "cloud_tls",
                                         .insecure = config.cloud_tls.insecure,
                                         .certificate_file = config.cloud_tls.certificate_file,
                                         .private_key_file = config.cloud_tls.private_key_file,
                                         .ca_file = config.cloud_tls.ca_file,
                                         .ca_field = "ca_file",
                                         .purpose = "the agent reaches the cloud"},
                                        require_bundle)) {
    report(problem->first, problem->second, "");
  }
  const bool app_tls = !config.app_tls.certificate_file.empty();
  if (app_tls != !config.app_tls.private_key_file.empty()) {
    report(app_tls ? "app_tls.private_key_file" : "app_tls.certificate_file",
           "required with the other: TLS on the app port needs both a certificate and its key",
           app_tls ? "app_tls.certificate_file" : "app_tls.private_key_file");
  }
  if (!IsUnixSocketAddress(config.listen_address)) {
    check("listen_address", CheckHostPort(config.listen_address, /*allow_port_zero=*/true));
    const bool secured = app_tls && !config.app_tokens.empty();
    if (!config.allow_remote_apps && !secured && !IsLoopbackAddress(config.listen_address)) {
      report("listen_address",
             absl::StrCat("\"", config.listen_address,
                          "\" is reachable from other hosts; give the app port app_tls and "
                          "app_tokens, bind it to 127.0.0.1, [::1] or a unix:PATH socket, or "
                          "set allow_remote_apps: true on a network you trust"),
             "allow_remote_apps");
    }
  } else if (config.listen_address.size() <= std::string_view("unix:").size()) {
    report("listen_address", "unix: needs a socket path, e.g. unix:/run/tophat/agent.sock", "");
  }
  constexpr std::string_view kDns = "dns:///";
  if (config.cloud_address.starts_with(kDns)) {
    // One name for several clouds: HOST:PORT after the scheme.
    check("cloud_address", CheckHostPort(std::string_view(config.cloud_address).substr(kDns.size()),
                                         /*allow_port_zero=*/false));
  } else {
    check("cloud_address", CheckHostPort(config.cloud_address, /*allow_port_zero=*/false));
  }
  for (size_t i = 0; i < config.cloud_addresses.size(); ++i) {
    if (config.cloud_addresses[i].starts_with(kDns)) {
      report(absl::StrCat("cloud_addresses[", i, "]"),
             absl::StrCat("\"", config.cloud_addresses[i],
                          "\": a dns:/// name for several clouds goes in cloud_address, alone"),
             "");
      continue;
    }
    check(absl::StrCat("cloud_addresses[", i, "]"),
          CheckHostPort(config.cloud_addresses[i], /*allow_port_zero=*/false));
    for (size_t j = 0; j < i; ++j) {
      if (config.cloud_addresses[j] == config.cloud_addresses[i]) {
        report(absl::StrCat("cloud_addresses[", i, "]"),
               absl::StrCat("\"", config.cloud_addresses[i], "\" is also cloud_addresses[", j,
                            "]"),
               "");
      }
    }
  }
  check("dtype", CheckDtype(config.dtype));
  check("wire_dtype", CheckWireDtype(config.wire_dtype));
  check("device", CheckDevice(config.device));
  if (CheckDtype(config.dtype).ok() && CheckDevice(config.device).ok()) {
    check("dtype", CheckDtypeOnDevice(config.dtype, config.device));
  }
  if (config.bf16_weights && (config.dtype != "float32" || config.device != "cpu")) {
    report("bf16_weights",
           absl::StrCat("keeps weights in bfloat16 under float32 compute on a CPU; this agent "
                        "computes in ", config.dtype, " on ", config.device),
           "dtype");
  }
  if (config.bf16_activations && !config.bf16_weights) {
    report("bf16_activations",
           "rounds a prompt's activations for bfloat16 weights; set bf16_weights: true too",
           "bf16_weights");
  }
  if (config.int8_activations && (config.dtype != "float32" || config.device != "cpu")) {
    report("int8_activations",
           absl::StrCat("is for an int8 bundle computed on a CPU in float32; this agent "
                        "computes in ", config.dtype, " on ", config.device),
           "dtype");
  }
  check("compute_threads", CheckAtLeast(config.compute_threads, 0));
  check("max_context", CheckAtLeast(config.max_context, 1));
  check("prompt_chunk_size", CheckAtLeast(config.prompt_chunk_size, 0));
  if (!config.outline.directive.empty()) {
    // The rest of the template is needed with a directive: the points cannot be found or
    // expanded without it.
    if (config.outline.labels.size() < 2) {
      report("outline.labels", "needs at least two labels to number an outline's points",
             "outline.directive");
    }
    if (config.outline.stop.empty()) {
      report("outline.stop", "is required with outline.directive (the token that ends the "
             "outline and each expansion)", "outline.directive");
    }
    if (config.outline.expand.find("{point}") == std::string::npos) {
      report("outline.expand", absl::StrCat("\"", config.outline.expand,
                                            "\" has no {point} to name the point it expands"),
             "outline.directive");
    }
  }
  check("outline.max_points", CheckAtLeast(config.outline.max_points, 2));
  if (config.prompt_chunk_plan != "equal" && config.prompt_chunk_plan != "jupiter") {
    report("prompt_chunk_plan",
           absl::StrCat("\"", config.prompt_chunk_plan, "\" is neither \"equal\" nor \"jupiter\""),
           "");
  }
  check("max_concurrent_requests", CheckAtLeast(config.max_concurrent_requests, 1));
  check("max_prompt_bytes", CheckAtLeast(config.max_prompt_bytes, 1));
  check("default_max_new_tokens", CheckAtLeast(config.default_max_new_tokens, 1));
  check("request_timeout_s", CheckAtLeast(config.request_timeout_s, 0, /*inclusive=*/false));
  check("reconnect.initial_backoff_s",
        CheckAtLeast(config.reconnect.initial_backoff_s, 0, /*inclusive=*/false));
  check("reconnect.max_backoff_s",
        CheckAtLeast(config.reconnect.max_backoff_s, 0, /*inclusive=*/false));
  check("reconnect.give_up_after_s",
        CheckAtLeast(config.reconnect.give_up_after_s, 0, /*inclusive=*/true));
  check("reconnect.keepalive_s", CheckAtLeast(config.reconnect.keepalive_s, 0, /*inclusive=*/true));
  if (config.reconnect.keepalive_s > 0 && config.reconnect.keepalive_s < 1) {
    // The cloud accepts pings at most once a second (server/cloud_main.cc).
    report("reconnect.keepalive_s",
           absl::StrCat(config.reconnect.keepalive_s, " is below the cloud's 1 s ping minimum"),
           "");
  }
  check("reconnect.keepalive_timeout_s",
        CheckAtLeast(config.reconnect.keepalive_timeout_s, 0, /*inclusive=*/false));
  if (!(config.speculative.eta > 0 && config.speculative.eta <= 1)) {
    report("speculative.eta", absl::StrCat(config.speculative.eta, " is not in (0, 1]"), "");
  }
  check("speculative.max_draft_tokens", CheckAtLeast(config.speculative.max_draft_tokens, 1));
  check("speculative.parallel_top_k", CheckAtLeast(config.speculative.parallel_top_k, 1));
  check("speculative.parallel_steps", CheckAtLeast(config.speculative.parallel_steps, 0));
  if (config.speculative.max_runs_in_flight != 1 && config.speculative.max_runs_in_flight != 2) {
    report("speculative.max_runs_in_flight",
           absl::StrCat(config.speculative.max_runs_in_flight,
                        " is neither 1 (one verification at a time) nor 2 (one run sent ahead "
                        "of it); deeper pipelines are not implemented"),
           "");
  } else if (config.speculative.max_runs_in_flight == 2 && !config.speculative.parallel_drafting) {
    report("speculative.max_runs_in_flight",
           "2 sends a branch drafted ahead, which needs speculative.parallel_drafting: true", "");
  }
  if (!(config.speculative.ahead_min_keep_rate >= 0 &&
        config.speculative.ahead_min_keep_rate <= 1)) {
    report("speculative.ahead_min_keep_rate",
           absl::StrCat(config.speculative.ahead_min_keep_rate, " is not in [0, 1]"), "");
  }
  check("conversation_cache.keep_alive_s",
        CheckAtLeast(config.conversation_cache.keep_alive_s, 0, /*inclusive=*/true));
  check("conversation_cache.min_reuse_tokens",
        CheckAtLeast(static_cast<double>(config.conversation_cache.min_reuse_tokens), 1,
                     /*inclusive=*/true));
  check("uplink_pacing.lead_s",
        CheckAtLeast(config.uplink_pacing.lead_s, 0, /*inclusive=*/true));
  check("link_emulation.one_way_delay_s",
        CheckAtLeast(config.link_emulation.one_way_delay_s, 0, /*inclusive=*/true));
  check("link_emulation.uplink_bytes_per_second",
        CheckAtLeast(config.link_emulation.uplink_bytes_per_second, 0, /*inclusive=*/true));
  check("link_emulation.downlink_bytes_per_second",
        CheckAtLeast(config.link_emulation.downlink_bytes_per_second, 0, /*inclusive=*/true));
  if (!config.metrics_address.empty()) {
    check("metrics_address", CheckHostPort(config.metrics_address, /*allow_port_zero=*/true));
  }
  if (!config.openai.address.empty()) {
    check("openai.address", CheckHostPort(config.openai.address, /*allow_port_zero=*/true));
    if (CheckHostPort(config.openai.address, true).ok() && !config.allow_remote_apps &&
        !IsLoopbackAddress(config.openai.address)) {
      report("openai.address",
             absl::StrCat("\"", config.openai.address,
                          "\" is reachable from other hosts over plain HTTP; bind it to "
                          "127.0.0.1 or [::1], or set allow_remote_apps: true on a network you "
                          "trust"),
             "allow_remote_apps");
    }
  }
  // A sentence or two; the tokens are counted when the endpoint starts (at most 256).
  if (config.openai.thinking_budget_message.size() > kMaxThinkingBudgetMessageBytes) {
    report("openai.thinking_budget_message",
           absl::StrCat(config.openai.thinking_budget_message.size(), " bytes, more than the ",
                        kMaxThinkingBudgetMessageBytes, " allowed"),
           "");
  }
  check("log_level", CheckLogLevel(config.log_level));

  // Backoff doubles from the initial value and is capped at the maximum; a cap below the
  // start is a typo, not a policy.
  if (config.reconnect.initial_backoff_s > config.reconnect.max_backoff_s) {
    report(
        "reconnect.initial_backoff_s",
        absl::StrCat(config.reconnect.initial_backoff_s, " is more than reconnect.max_backoff_s (",
                     config.reconnect.max_backoff_s, ")"),
        "reconnect.max_backoff_s");
  }
  // The prompt and the new tokens share the context; a default that cannot fit would make
  // every request that leaves max_new_tokens unset fail.
  if (config.default_max_new_tokens >= config.max_context) {
    report("default_max_new_tokens",
           absl::StrCat(config.default_max_new_tokens,
                        " leaves no room for a prompt in max_context (", config.max_context, ")"),
           "max_context");
  }
}

absl::StatusOr<AgentConfig> ReadAgentConfig(YamlReader& reader) {
  AgentConfig config;
  reader.ReadString("listen_address", &config.listen_address);
  reader.ReadBool("allow_remote_apps", &config.allow_remote_apps);
  reader.ReadString("app_tls.certificate_file", &config.app_tls.certificate_file);
  reader.ReadString("app_tls.private_key_file", &config.app_tls.private_key_file);
  std::vector<std::string> app_tokens;
  reader.ReadStringList("app_tokens", &app_tokens);
  if (auto parsed = ParseBearerTokens(app_tokens, "app_tokens"); parsed.ok()) {
    config.app_tokens = *std::move(parsed);
  } else {
    reader.AddError("app_tokens", std::string(parsed.status().message()));
  }
  reader.ReadString("cloud_address", &config.cloud_address);
  reader.ReadStringList("cloud_addresses", &config.cloud_addresses);
  reader.ReadInt("cloud_dns_streams", &config.cloud_dns_streams, Bound::kNonNegative);
  reader.ReadString("bundle", &config.bundle);
  reader.ReadBool("cloud_tls.insecure", &config.cloud_tls.insecure);
  reader.ReadString("cloud_tls.certificate_file", &config.cloud_tls.certificate_file);
  reader.ReadString("cloud_tls.private_key_file", &config.cloud_tls.private_key_file);
  reader.ReadString("cloud_tls.ca_file", &config.cloud_tls.ca_file);
  reader.ReadString("cloud_tls.server_name", &config.cloud_tls.server_name);
  reader.ReadString("cloud_tls.token_file", &config.cloud_tls.token_file);
  reader.ReadString("cloud_tls.crl_file", &config.cloud_tls.crl_file);
  if (config.cloud_tls.insecure && !config.cloud_tls.crl_file.empty()) {
    reader.AddError("cloud_tls.crl_file",
                    "revokes certificates, and with cloud_tls.insecure the cloud presents none",
                    "cloud_tls.insecure");
  }
  reader.ReadString("dtype", &config.dtype);
  reader.ReadBool("bf16_weights", &config.bf16_weights);
  reader.ReadBool("int8_activations", &config.int8_activations);
  reader.ReadBool("bf16_activations", &config.bf16_activations);
  reader.ReadString("wire_dtype", &config.wire_dtype);
  reader.ReadString("device", &config.device);
  reader.ReadInt("compute_threads", &config.compute_threads, Bound::kNonNegative);
  reader.ReadInt("max_context", &config.max_context, Bound::kPositive);
  reader.ReadInt("prompt_chunk_size", &config.prompt_chunk_size, Bound::kNonNegative);
  reader.ReadBool("pipeline_prompt_chunks", &config.pipeline_prompt_chunks);
  reader.ReadString("outline.directive", &config.outline.directive);
  reader.ReadStringList("outline.labels", &config.outline.labels);
  reader.ReadString("outline.expand", &config.outline.expand);
  reader.ReadString("outline.stop", &config.outline.stop);
  reader.ReadInt("outline.max_points", &config.outline.max_points, Bound::kPositive);
  reader.ReadInt("outline.max_outline_tokens", &config.outline.max_outline_tokens,
                 Bound::kPositive);
  reader.ReadInt("outline.max_point_tokens", &config.outline.max_point_tokens, Bound::kPositive);
  reader.ReadString("prompt_chunk_plan", &config.prompt_chunk_plan);
  reader.ReadInt("max_concurrent_requests", &config.max_concurrent_requests, Bound::kPositive);
  reader.ReadByteSize("max_prompt_bytes", &config.max_prompt_bytes, Bound::kPositive);
  reader.ReadByteSize("max_outbox_bytes", &config.max_outbox_bytes, Bound::kNonNegative);
  reader.ReadInt("max_outbox_messages", &config.max_outbox_messages, Bound::kNonNegative);
  reader.ReadInt("default_max_new_tokens", &config.default_max_new_tokens, Bound::kPositive);
  reader.ReadSeconds("request_timeout_s", &config.request_timeout_s, Bound::kPositive);
  reader.ReadSeconds("reconnect.initial_backoff_s", &config.reconnect.initial_backoff_s,
                     Bound::kPositive);
  reader.ReadSeconds("reconnect.max_backoff_s", &config.reconnect.max_backoff_s, Bound::kPositive);
  reader.ReadSeconds("reconnect.give_up_after_s", &config.reconnect.give_up_after_s,
                     Bound::kNonNegative);
  reader.ReadSeconds("reconnect.keepalive_s", &config.reconnect.keepalive_s, Bound::kNonNegative);
  reader.ReadSeconds("reconnect.keepalive_timeout_s", &config.reconnect.keepalive_timeout_s,
                     Bound::kPositive);
  reader.ReadBool("speculative.enabled", &config.speculative.enabled);
  reader.ReadDouble("speculative.eta", &config.speculative.eta, Bound::kPositive);
  reader.ReadInt("speculative.max_draft_tokens", &config.speculative.max_draft_tokens,
                 Bound::kPositive);
  reader.ReadBool("speculative.parallel_drafting", &config.speculative.parallel_drafting);
  reader.ReadBool("speculative.adaptive_window", &config.speculative.adaptive_window);
  reader.ReadInt("speculative.parallel_top_k", &config.speculative.parallel_top_k,
                 Bound::kPositive);
  reader.ReadInt("speculative.parallel_steps", &config.speculative.parallel_steps,
                 Bound::kNonNegative);
  reader.ReadBool("speculative.parallel_steps_from_cloud",
                  &config.speculative.parallel_steps_from_cloud);
  reader.ReadInt("speculative.max_runs_in_flight", &config.speculative.max_runs_in_flight,
                 Bound::kPositive);
  reader.ReadDouble("speculative.ahead_min_keep_rate", &config.speculative.ahead_min_keep_rate,
                    Bound::kNonNegative);
  reader.ReadBool("speculative.jump_forward", &config.speculative.jump_forward);
  reader.ReadBool("conversation_cache.enabled", &config.conversation_cache.enabled);
  reader.ReadByteSize("conversation_cache.max_bytes", &config.conversation_cache.max_bytes,
                      Bound::kNonNegative);
  reader.ReadSeconds("conversation_cache.keep_alive_s", &config.conversation_cache.keep_alive_s,
                     Bound::kNonNegative);
  reader.ReadInt("conversation_cache.min_reuse_tokens",
                 &config.conversation_cache.min_reuse_tokens, Bound::kPositive);
  reader.ReadBool("uplink_pacing.enabled", &config.uplink_pacing.enabled);
  reader.ReadSeconds("uplink_pacing.lead_s", &config.uplink_pacing.lead_s, Bound::kNonNegative);
  reader.ReadSeconds("link_emulation.one_way_delay_s", &config.link_emulation.one_way_delay_s,
                     Bound::kNonNegative);
  reader.ReadDouble("link_emulation.uplink_bytes_per_second",
                    &config.link_emulation.uplink_bytes_per_second, Bound::kNonNegative);
  reader.ReadDouble("link_emulation.downlink_bytes_per_second",
                    &config.link_emulation.downlink_bytes_per_second, Bound::kNonNegative);
  reader.ReadString("openai.address", &config.openai.address);
  reader.ReadString("openai.model_name", &config.openai.model_name);
  reader.ReadSeconds("openai.request_deadline_s", &config.openai.request_deadline_s,
                     Bound::kPositive);
  reader.ReadInt("openai.max_stored_response_bytes", &config.openai.max_stored_response_bytes,
                 Bound::kNonNegative);
  reader.ReadString("openai.store_dir", &config.openai.store_dir);
  reader.ReadString("openai.thinking_budget_message", &config.openai.thinking_budget_message);
  for (const std::string_view effort : kOpenAiReasoningEfforts) {
    const std::string key = absl::StrCat("openai.reasoning_effort_budgets.", std::string(effort));
    constexpr int64_t kNotGiven = std::numeric_limits<int64_t>::min();
    int64_t budget = kNotGiven;
    reader.ReadInt(key, &budget);
    if (budget == kNotGiven) continue;
    if (budget < -1) {
      reader.AddError(key, "must be a number of tokens (0 or more), or -1 for no bound", "");
      continue;
    }
    config.openai.reasoning_effort_budgets[std::string(effort)] = budget;
  }
  reader.ReadString("metrics_address", &config.metrics_address);
  reader.ReadString("log_level", &config.log_level);

  CheckAgentConfig(
      config, /*require_bundle=*/false,
      [&](std::string_view key, std::string_view message, std::string_view related_key) {
        reader.AddError(key, message, related_key);
      });
  TOPHAT_RETURN_IF_ERROR(reader.Finish());
  config.bundle = ResolveConfigPath(config.bundle, reader.source_name());
  for (std::string* path : {&config.cloud_tls.certificate_file, &config.cloud_tls.private_key_file,
                            &config.cloud_tls.ca_file, &config.cloud_tls.token_file,
                            &config.cloud_tls.crl_file, &config.app_tls.certificate_file,
                            &config.app_tls.private_key_file, &config.openai.store_dir}) {
    if (!path->empty()) *path = ResolveConfigPath(*path, reader.source_name());
  }
  return config;
}

}  // namespace

absl::StatusOr<AgentConfig> LoadAgentConfig(const std::filesystem::path& path,
                                            std::map<std::string, std::string>* values) {
  TOPHAT_ASSIGN_OR_RETURN(YamlReader reader, YamlReader::Load(path));
  if (values != nullptr) *values = reader.Values();
  return ReadAgentConfig(reader);
}

absl::StatusOr<AgentConfig> ParseAgentConfig(std::string_view yaml, std::string_view source_name) {
  TOPHAT_ASSIGN_OR_RETURN(YamlReader reader, YamlReader::Parse(yaml, std::string(source_name)));
  return ReadAgentConfig(reader);
}

absl::Status ValidateAgentConfig(const AgentConfig& config) {
  ConfigErrors errors;
  CheckAgentConfig(config, /*require_bundle=*/true,
                   [&](std::string_view key, std::string_view message, std::string_view) {
                     errors.Add(key, /*line=*/0, message);
                   });
  return errors.ToStatus();
}

}  // namespace tophat
