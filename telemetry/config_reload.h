// What both daemons do on SIGHUP (`systemctl reload`): read the config file again, apply the
// keys they can apply while they serve, and say which other keys changed and wait for a
// restart. A config that does not load changes nothing: the daemon serves on with what it
// has, and the error names the file, line and key. Metrics: tophat_config_reloads_total
// {result="applied"|"failed"} and tophat_config_keys_awaiting_restart.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tophat {

// How a daemon reads its config, at start-up and on each reload: the file (its values by key
// filled in, for telling what a reload changed), then the command line's overrides, validated.
template <typename Config>
struct ConfigSource {
  std::string path;  // "": no --config
  std::function<absl::StatusOr<Config>(std::map<std::string, std::string>* values)> read;
  bool log_level_from_flag = false;  // --log-level given: the file's log_level is not applied
};

// Applies a reloaded `log_level` unless the command line set it; says which, for the summary.
std::string ReloadLogLevel(const std::string& log_level, bool from_flag);

class ConfigReloader {
 public:
  struct Applied {
    std::string summary;  // what the reload set, for the log line
    // Keys whose values differ from the ones the daemon started with and that only a
    // restart applies.
    std::vector<std::string> awaiting_restart;
  };
  struct Options {
    std::string daemon;       // "tophat-cloud", in log lines
    std::string config_path;  // "": started without --config, nothing to reload
    // Reads the config again (the file, then the command line's overrides), checks it and
    // applies what may change while serving; an error leaves everything as it was.
    std::function<absl::StatusOr<Applied>()> apply;
  };
  ConfigReloader(prometheus::Registry& registry, Options options);

  // On SIGHUP, on the thread that waits for signals. Tells systemd RELOADING=1, then READY=1.
  void Reload();

 private:
  Options options_;
  prometheus::Family<prometheus::Counter>& reloads_;
  prometheus::Counter& applied_;
  prometheus::Counter& failed_;
  prometheus::Gauge& awaiting_restart_;
};

}  // namespace tophat
