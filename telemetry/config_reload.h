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
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tophat {

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
