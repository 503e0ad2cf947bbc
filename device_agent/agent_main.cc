// tophat-agent: the device agent. Holds the input and output submodels of a device bundle,
// serves apps on the local AgentService, and keeps one stream to tophat-cloud (reconnecting
// and replaying when it drops). SIGTERM stops it cleanly; SIGHUP (systemctl reload) reloads
// the app tokens, the log level and the cloud link's CRLs (ApplyReloadedConfig).
#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/cli_checks.h"
#include "base/program.h"
#include "base/service_notify.h"
#include "configs/agent_config.h"
#include "configs/config_checks.h"
#include "configs/yaml_reader.h"
#include "device_agent/agent.h"
#include "device_agent/agent_service.h"
#include "device_agent/kept_files.h"
#include "device_agent/openai_server.h"
#include "models/runtime/compute_threads.h"
#include "proto/certificate_expiry.h"
#include "proto/certificate_revocation.h"
#include "proto/channel_security.h"
#include "proto/hidden_states.h"
#include "telemetry/config_reload.h"
#include "telemetry/metrics_http_server.h"
#include "telemetry/shutdown_signals.h"

using tophat::Fail;

namespace {

// Set when the agent's GPU is lost (Agent::OnDeviceLost): it stops at once, exits 1 for
// systemd to restart it, and touches the GPU no more on the way out (frees on a lost context
// fail, some by throwing from destructors; the driver reclaims the memory at exit).
std::atomic<bool> device_lost{false};

// The app port: TLS with app_tls's certificate, else plaintext.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> AppPortCredentials(
    const tophat::AgentConfig& config) {
  if (config.app_tls.certificate_file.empty()) return grpc::InsecureServerCredentials();
  return tophat::TlsServerCredentials({.certificate_file = config.app_tls.certificate_file,
                                       .private_key_file = config.app_tls.private_key_file},
                                      "app_tls");
}

// --check-config: what a start checks before it loads the bundle's weights or binds a port,
// printed; the exit code says whether a start would get past it.
int CheckConfig(const tophat::AgentConfig& config, const std::string& config_path) {
  std::printf("tophat-agent --check-config %s\n", config_path.c_str());
  auto bundle = tophat::Agent::CheckConfig(config);
  if (!bundle.ok()) return Fail(bundle.status());
  if (auto app_port = AppPortCredentials(config); !app_port.ok()) return Fail(app_port.status());
  std::printf("  cloud link: %s, to %s\n",
              config.cloud_tls.insecure ? "plaintext (cloud_tls.insecure)"
                                        : "mutual TLS; certificate and key are a pair",
              absl::StrJoin(config.clouds(), ", ").c_str());
  if (!config.cloud_tls.crl_file.empty()) {
    // Agent::CheckConfig read it already; read again for what it says.
    auto crl = tophat::LoadRevocationLists(config.cloud_tls.crl_file, "cloud_tls.crl_file",
                                           config.cloud_tls.ca_file, "cloud_tls.ca_file");
    if (!crl.ok()) return Fail(crl.status());
    std::printf("  cloud link crl: %s: %lld revoked certificate(s) in %d CRL(s)%s\n",
                config.cloud_tls.crl_file.c_str(), static_cast<long long>(crl->certificates),
                crl->crls, crl->stale_issuers.empty() ? "" : " (past its nextUpdate: renew it)");
  }
  std::printf("  app port: %s\n", config.app_tls.certificate_file.empty()
                                       ? "plaintext"
                                       : "TLS; certificate and key are a pair");
  if (!config.openai.address.empty() && !config.openai.store_dir.empty()) {
    const std::filesystem::path store = config.openai.store_dir;
    std::string kept;
    for (const char* kind : {"responses", "conversations"}) {
      auto files = tophat::KeptFiles::Check(store / kind);
      if (!files.ok()) {
        return Fail(absl::Status(files.status().code(),
                                 absl::StrCat("openai.store_dir: ", files.status().message())));
      }
      absl::StrAppend(&kept, kept.empty() ? "" : " and ", *files, " kept ", kind);
    }
    std::printf("  openai.store_dir: %s: %s (files), writable\n", store.c_str(), kept.c_str());
  }
  const tophat::BundleManifest& manifest = bundle->manifest;
  std::printf("  bundle: %s: %s, layers [%lld, %lld) and [%lld, %lld) of %lld on %s, weights "
              "%s, %s, fingerprint %s\n",
              config.bundle.c_str(), manifest.source_architecture.c_str(),
              static_cast<long long>(manifest.input_layers.begin),
              static_cast<long long>(manifest.input_layers.end),
              static_cast<long long>(manifest.output_layers.begin),
              static_cast<long long>(manifest.output_layers.end),
              static_cast<long long>(manifest.num_hidden_layers), config.device.c_str(),
              manifest.weights.empty() ? manifest.dtype.c_str() : manifest.weights.c_str(),
              manifest.adapter ? "an adapter (speculative decoding)" : "no adapter",
              manifest.model_fingerprint.empty() ? "none (clouds will refuse it)"
                                                 : manifest.model_fingerprint.c_str());
  for (const std::string& line :
       tophat::DescribeListenPorts({{"listen_address", config.listen_address},
                                    {"metrics_address", config.metrics_address},
                                    {"openai.address", config.openai.address}},
                                   "tophat-agent")) {
    std::printf("  %s\n", line.c_str());
  }
  std::printf("ok: a start would load the weights next (not loaded, no port bound)\n");
  return 0;
}

using ConfigSource = tophat::ConfigSource<tophat::AgentConfig>;

// The apps whose calls `after` no longer admits: those whose token it no longer lists as
// theirs, and the anonymous caller ("") when tokens are turned on. None when tokens are
// turned off: every caller may then call.
std::vector<std::string> AppsNoLongerAdmitted(const std::vector<tophat::BearerToken>& before,
                                              const std::vector<tophat::BearerToken>& after) {
  if (after.empty()) return {};
  std::vector<std::string> gone;
  if (before.empty() && !after.empty()) gone.push_back("");
  for (const tophat::BearerToken& token : before) {
    if (std::find(after.begin(), after.end(), token) == after.end()) gone.push_back(token.name);
  }
  return gone;
}

// What a reload applies while the agent serves (kAgentReloadedKeys): the app tokens, for
// calls from now on, and the requests of an app whose token went are cancelled; the log
// level; and cloud_tls.crl_file is read again, ending the streams of clouds it now revokes.
// The rest waits for a restart, and is listed.
absl::StatusOr<tophat::ConfigReloader::Applied> ApplyReloadedConfig(
    const ConfigSource& source, const std::map<std::string, std::string>& started_values,
    tophat::BearerTokenSet& app_tokens, tophat::Agent& agent) {
  std::map<std::string, std::string> values;
  auto reloaded = source.read(&values);
  if (!reloaded.ok()) return reloaded.status();
  // First: a CRL that cannot be read fails the reload before anything changed.
  absl::StatusOr<int> ended = agent.EndStreamsToRevokedClouds();
  if (!ended.ok()) return ended.status();
  const std::vector<std::string> gone =
      AppsNoLongerAdmitted(*app_tokens.Get(), reloaded->app_tokens);
  app_tokens.Replace(reloaded->app_tokens);
  int cancelled = 0;
  for (const std::string& app : gone) {
    const int of_app = agent.CancelCaller(app);
    if (of_app > 0) {
      spdlog::warn(
          "SIGHUP: cancelled {} running request(s) of {}, which the reloaded "
          "app_tokens no longer admit",
          of_app, app.empty() ? std::string("the anonymous caller") : "app " + app);
    }
    cancelled += of_app;
  }
  const std::string log_level =
      tophat::ReloadLogLevel(reloaded->log_level, source.log_level_from_flag);
  return tophat::ConfigReloader::Applied{
      .summary =
          absl::StrCat(reloaded->app_tokens.size(), " app token(s), ", log_level, "; ", cancelled,
                       " running request(s) of apps no longer admitted were cancelled; ", *ended,
                       " stream(s) to clouds whose certificates cloud_tls.crl_file revokes "
                       "were ended"),
      .awaiting_restart =
          tophat::KeysAwaitingRestart(started_values, values, tophat::kAgentReloadedKeys)};
}

// `drill_device_loss_after_requests`: --drill-device-loss-after-requests (0: no drill).
int Run(const tophat::AgentConfig& config, const std::map<std::string, std::string>& values,
        const ConfigSource& source, int64_t drill_device_loss_after_requests) {
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  if (absl::Status threads = tophat::SetComputeThreads(static_cast<int>(config.compute_threads));
      !threads.ok()) {
    return Fail(threads);
  }
  auto registry = std::make_shared<prometheus::Registry>();
  auto metrics_server = tophat::StartConfiguredMetricsServer(config.metrics_address, registry);
  if (!metrics_server.ok()) return Fail(metrics_server.status());
  // When its certificates end (alerts TophatCertificateExpires*), re-read as they rotate.
  std::vector<tophat::CertificateExpiryMetrics::File> certificates = {
      {.key = "app_tls.certificate_file", .path = config.app_tls.certificate_file}};
  if (!config.cloud_tls.insecure) {
    certificates.push_back(
        {.key = "cloud_tls.certificate_file", .path = config.cloud_tls.certificate_file});
    certificates.push_back({.key = "cloud_tls.ca_file", .path = config.cloud_tls.ca_file});
  }
  tophat::CertificateExpiryMetrics certificate_expiry(*registry, std::move(certificates));
  spdlog::info("loading device bundle {}", config.bundle);
  auto agent = tophat::Agent::Create(config, registry.get());
  if (!agent.ok()) return Fail(agent.status());
  (*agent)->OnDeviceLost([](const absl::Status& status) {
    spdlog::error("{}; shutting down for a restart", std::string(status.message()));
    tophat::ServiceNotify(absl::StrCat("STATUS=", status.message()));
    device_lost.store(true);
    tophat::RequestShutdown();
  });
  if (drill_device_loss_after_requests > 0) {
    spdlog::warn("failover drill: after {} request(s) this agent acts as if its device were "
                 "lost, fails every later request with UNAVAILABLE and exits 1",
                 drill_device_loss_after_requests);
    (*agent)->DrillDeviceLoss(drill_device_loss_after_requests);
  }

  // Shared by the app port and the OpenAI endpoint; a reload replaces it.
  auto app_tokens = std::make_shared<tophat::BearerTokenSet>(config.app_tokens);
  tophat::AgentServiceImpl service(agent->get(), app_tokens);
  auto app_port = AppPortCredentials(config);
  if (!app_port.ok()) return Fail(app_port.status());
  std::shared_ptr<grpc::ServerCredentials> app_credentials = *std::move(app_port);
  grpc::ServerBuilder builder;
  // Without this, gRPC sets SO_REUSEPORT and a second daemon on the same port would start
  // and share the traffic instead of failing.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (absl::Status can = tophat::CheckCanListen(config.listen_address, "listen_address");
      !can.ok()) {
    return Fail(can);
  }
  int bound_port = 0;
  builder.AddListeningPort(config.listen_address, app_credentials, &bound_port);
  builder.RegisterService(&service);
  const bool unix_socket = tophat::IsUnixSocketAddress(config.listen_address);
  // A socket is created 0660 from the start, not opened to everyone until the chmod below.
  const mode_t umask_before = unix_socket ? umask(0117) : 0;
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (unix_socket) umask(umask_before);
  if (server == nullptr || (bound_port == 0 && !unix_socket)) {
    return Fail(absl::UnavailableError(
        absl::StrCat("listen_address: cannot listen on ", config.listen_address)));
  }
  if (unix_socket) {
    // Only this user and group may talk to the agent (gRPC creates the socket with the
    // umask's mode).
    const std::string path = config.listen_address.substr(std::string_view("unix:").size());
    if (chmod(path.c_str(), 0660) != 0) {
      return Fail(absl::UnavailableError(absl::StrCat(
          "listen_address: cannot restrict ", path, " to its user and group: ",
          std::strerror(errno))));
    }
  } else if (!tophat::IsLoopbackAddress(config.listen_address) &&
             (config.app_tls.certificate_file.empty() || config.app_tokens.empty())) {
    spdlog::warn("listen_address {} is reachable from other hosts and the app port lacks {} "
                 "(allow_remote_apps: true); any host that reaches it can {}",
                 config.listen_address,
                 config.app_tokens.empty() ? "app_tokens" : "app_tls",
                 config.app_tokens.empty() ? "send prompts and read answers"
                                           : "read the prompts and answers in flight");
  }
  std::unique_ptr<tophat::OpenAiServer> openai;
  if (!config.openai.address.empty()) {
    auto started = tophat::OpenAiServer::Start(
        agent->get(), {.address = config.openai.address,
                       .model_name = config.openai.model_name,
                       .template_dir = config.bundle,
                       .app_tokens = app_tokens,
                       .max_concurrent_requests = config.max_concurrent_requests,
                       .max_body_bytes = 2 * config.max_prompt_bytes + (64 << 10),
                       .request_deadline_s = config.openai.request_deadline_s,
                       .max_stored_response_bytes = config.openai.max_stored_response_bytes,
                       .store_dir = config.openai.store_dir,
                       .thinking_budget_message = config.openai.thinking_budget_message,
                       .reasoning_effort_budgets = config.openai.reasoning_effort_budgets,
                       .registry = registry.get()});
    if (!started.ok()) return Fail(started.status());
    openai = *std::move(started);
  }
  spdlog::info("tophat-agent serving apps on {}, cloud {} (metrics: {}, openai: {})",
               config.listen_address, absl::StrJoin(config.clouds(), ","),
               config.metrics_address.empty() ? "off" : config.metrics_address,
               openai ? absl::StrCat("http://", config.openai.address, "/v1") : "off");

  tophat::ServiceNotify(absl::StrCat("READY=1\nSTATUS=serving apps on ", config.listen_address));
  tophat::ConfigReloader reloader(
      *registry, {.daemon = "tophat-agent", .config_path = source.path, .apply = [&] {
                    return ApplyReloadedConfig(source, values, *app_tokens, **agent);
                  }});
  const char* signal_name = tophat::WaitForShutdownSignal([&] { reloader.Reload(); });
  tophat::ServiceNotify("STOPPING=1");
  spdlog::info("{}: stopping", signal_name);
  // Running requests get a few seconds to finish; then their streams are cancelled. After a
  // lost device nothing can finish, but the requests failed by it still send their error
  // (UNAVAILABLE naming the loss) within a second; with no time at all the app got
  // CANCELLED instead, now and then, for the very request that found the loss.
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::seconds(device_lost.load() ? 1 : 5));
  openai.reset();
  if (device_lost.load()) {
    spdlog::error("tophat-agent stopped after losing its GPU; exiting without releasing it");
    spdlog::shutdown();
    std::_Exit(1);
  }
  agent->reset();
  spdlog::info("tophat-agent stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tophat::ConfigureAllocatorForPayloads();
  tophat::BlockShutdownSignals();

  CLI::App app{
      "tophat-agent: the device agent of tophat. Runs the input and output submodels of a "
      "device bundle, serves apps over gRPC and sends only hidden states to tophat-cloud."};
  std::string config_path;
  std::string bundle;
  std::string listen;
  std::string cloud;
  std::string metrics;
  std::string log_level;
  int64_t chunk = -1;
  app.add_option("-c,--config", config_path, "YAML config (see configs/agent.yaml)")
      ->check(CLI::ExistingFile);
  app.add_option("--bundle", bundle, "Device bundle directory (overrides `bundle`)");
  app.add_option("--listen", listen, "host:port or unix:PATH for apps (overrides `listen_address`)");
  app.add_option("--cloud", cloud,
                 "tophat-cloud host:port, several comma-separated, or dns:///HOST:PORT for "
                 "every address a name resolves to (overrides "
                 "`cloud_address` and `cloud_addresses`)");
  app.add_option("--metrics", metrics,
                 "host:port for Prometheus, or \"\" to disable (overrides `metrics_address`)");
  app.add_option("--prompt-chunk-size", chunk,
                 "Prompt positions per chunk; 0 uses the cloud's (overrides `prompt_chunk_size`)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  bool check_config = false;
  app.add_flag("--check-config", check_config,
               "Check the config and what it names (TLS files, token file, bundle, device, "
               "ports) as far as a start gets before it loads the weights, print what it found, "
               "and exit: 0 when a start would get that far. Run it before a restart");
  int64_t drill_device_loss_after_requests = 0;
  app.add_option("--drill-device-loss-after-requests", drill_device_loss_after_requests,
                 "A failover drill: serve N requests, then act exactly as on a lost GPU (that "
                 "request and every later one fail with UNAVAILABLE, Health reports not "
                 "serving, the daemon exits 1). Nothing is broken. Run it outside the systemd "
                 "unit, whose Restart= would restart the drill (docs/operations.md)")
      ->check(tophat::PositiveNumber())
      ->group("Drills");
  CLI11_PARSE(app, argc, argv);

  const bool metrics_from_flag = app.count("--metrics") > 0;
  const ConfigSource source{
      .path = config_path,
      .read =
          [&](std::map<std::string, std::string>* values) -> absl::StatusOr<tophat::AgentConfig> {
        tophat::AgentConfig config;
        if (!config_path.empty()) {
          auto loaded = tophat::LoadAgentConfig(config_path, values);
          if (!loaded.ok()) return loaded.status();
          config = *std::move(loaded);
        }
        if (!bundle.empty()) config.bundle = bundle;
        if (!listen.empty()) config.listen_address = listen;
        if (!cloud.empty()) {
          std::vector<std::string> clouds = absl::StrSplit(cloud, ',');
          config.cloud_address = clouds.front();
          config.cloud_addresses = clouds.size() > 1 ? clouds : std::vector<std::string>{};
        }
        if (metrics_from_flag) config.metrics_address = metrics;
        if (chunk >= 0) config.prompt_chunk_size = chunk;
        if (!log_level.empty()) config.log_level = log_level;
        if (absl::Status valid = tophat::ValidateAgentConfig(config); !valid.ok()) return valid;
        return config;
      },
      .log_level_from_flag = !log_level.empty()};
  std::map<std::string, std::string> values;
  auto read = source.read(&values);
  if (!read.ok()) return Fail(read.status());
  const tophat::AgentConfig config = *std::move(read);
  if (check_config) return CheckConfig(config, config_path.empty() ? "(no --config)" : config_path);
  return Run(config, values, source, drill_device_loss_after_requests);
}
