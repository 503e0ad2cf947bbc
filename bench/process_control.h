// Starting and watching real tophat processes: used by `tophat bench --ablation`, which runs
// a cloud and its agents per configuration, and by the integration tests.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tophat::bench {

// A child process with stdout+stderr going to a log file. The destructor kills it, and so
// does the parent's death: a crashed bench or test must not leave daemons behind.
class ChildProcess {
 public:
  ChildProcess(std::vector<std::string> argv, std::filesystem::path log_path);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  void Signal(int signal);
  // Exit code, or nullopt if still running after `timeout` (then it is left running).
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  std::string Log() const;
  const std::filesystem::path& log_path() const { return log_path_; }

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::filesystem::path log_path_;
};

// Starts a tophat daemon: writes `config_yaml` to `dir`/`name`.yaml, runs `binary` with
// --config on it (its log in `dir`/`name`.log) and waits up to `timeout` for it to listen on
// 127.0.0.1:`port`. UNAVAILABLE with its log when it does not (the process is then killed).
absl::StatusOr<std::unique_ptr<ChildProcess>> StartDaemon(const std::filesystem::path& binary,
                                                          const std::string& config_yaml,
                                                          const std::filesystem::path& dir,
                                                          const std::string& name, int port,
                                                          std::chrono::milliseconds timeout);

// CPU seconds a process has used so far (user + system), from /proc; 0 if unreadable.
double CpuSeconds(pid_t pid);

// A TCP port on 127.0.0.1 that was free a moment ago and that no other tophat process (test
// or benchmark) will hand out while this one lives; below the ephemeral range, so no bind(0)
// or outgoing connection takes it either.
int FreePort();
// Waits until something accepts connections on host:port (an IPv4 address).
bool WaitForPort(int port, std::chrono::milliseconds timeout,
                 const std::string& host = "127.0.0.1");
// GET http://host:port/path; empty on failure.
std::string HttpGet(int port, const std::string& path, const std::string& host = "127.0.0.1");
// Sum of a Prometheus sample's values over every label set whose text contains `labels`
// (e.g. name "tophat_hidden_state_bytes_total", labels "direction=\"in\""); nullopt if absent.
std::optional<double> MetricValue(const std::string& exposition, const std::string& name,
                                  const std::string& labels = "");
// A histogram's finite buckets as (upper bound, cumulative count), ascending, summed over
// label sets; read from the exposition so callers need not repeat the bucket bounds.
std::vector<std::pair<double, double>> HistogramBuckets(const std::string& exposition,
                                                        const std::string& name);
// Polls `predicate` every 10 ms until it is true or `timeout` passes.
bool WaitUntil(const std::function<bool()>& predicate, std::chrono::milliseconds timeout);

}  // namespace tophat::bench
