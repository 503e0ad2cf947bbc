#include "telemetry/config_reload.h"

#include <prometheus/family.h>
#include <spdlog/spdlog.h>

#include <utility>

#include "absl/strings/str_join.h"
#include "base/service_notify.h"
#include "telemetry/metric_builders.h"

namespace tophat {
namespace {

prometheus::Family<prometheus::Counter>& ReloadsFamily(prometheus::Registry& registry) {
  return prometheus::BuildCounter()
      .Name("tophat_config_reloads_total")
      .Help("Config reloads (SIGHUP): applied, or failed and changed nothing")
      .Register(registry);
}

}  // namespace

ConfigReloader::ConfigReloader(prometheus::Registry& registry, Options options)
    : options_(std::move(options)),
      reloads_(ReloadsFamily(registry)),
      applied_(reloads_.Add({{"result", "applied"}})),
      failed_(reloads_.Add({{"result", "failed"}})),
      awaiting_restart_(AddGauge(registry, "tophat_config_keys_awaiting_restart",
                                 "Config keys changed since start-up that only a restart "
                                 "applies (as of the last reload)")) {}

std::string ReloadLogLevel(const std::string& log_level, bool from_flag) {
  if (from_flag) return "log_level kept from --log-level";
  spdlog::set_level(spdlog::level::from_str(log_level));
  return "log_level " + log_level;
}

void ConfigReloader::Reload() {
  if (options_.config_path.empty()) {
    spdlog::warn("SIGHUP: {} was started without --config; nothing to reload", options_.daemon);
    failed_.Increment();
    return;
  }
  ServiceNotify("RELOADING=1");
  spdlog::info("SIGHUP: reloading {}", options_.config_path);
  auto applied = options_.apply();
  // The counters move last: a reload counted is one whose log lines and gauge are all out,
  // which is what a watcher waiting on the counter (an operator's script, a test) reads next.
  if (!applied.ok()) {
    spdlog::error("SIGHUP: {} not reloaded; {} serves on with the config it had: {}",
                  options_.config_path, options_.daemon, std::string(applied.status().message()));
    ServiceNotify("READY=1");
    failed_.Increment();
    return;
  }
  awaiting_restart_.Set(static_cast<double>(applied->awaiting_restart.size()));
  spdlog::info("SIGHUP: reloaded {}: {}", options_.config_path, applied->summary);
  if (!applied->awaiting_restart.empty()) {
    spdlog::warn("SIGHUP: {} changed since start-up and take effect only at a restart: {}",
                 applied->awaiting_restart.size() == 1 ? "one key has" : "these keys have",
                 absl::StrJoin(applied->awaiting_restart, ", "));
  }
  ServiceNotify("READY=1");
  applied_.Increment();
}

}  // namespace tophat
