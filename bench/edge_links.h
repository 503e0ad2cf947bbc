// Edge links made of network namespaces, veth pairs and tc (deploy/edge-links.sh): one
// namespace per emulated device, so an agent's traffic to the cloud crosses a shaped link
// in the kernel rather than the agent's in-process shaper.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tophat::bench {

class EdgeLinks {
 public:
  // Runs `script check` and `script up devices`; the error carries the script's output, so
  // the caller can say why it falls back to the in-process shaper.
  static absl::StatusOr<std::unique_ptr<EdgeLinks>> Create(const std::filesystem::path& script,
                                                           int devices);
  ~EdgeLinks();  // `script down`
  EdgeLinks(const EdgeLinks&) = delete;
  EdgeLinks& operator=(const EdgeLinks&) = delete;

  // Sets device `index`'s bandwidths and one-way delay. Returns whether the kernel applies
  // the delay (netem); when it does not, the agent must add it in process.
  absl::StatusOr<bool> Shape(int index, double uplink_bytes_per_second,
                             double downlink_bytes_per_second, double one_way_delay_s);

  // Device `index`'s qdisc and TCP counters and link state, as `script stats` prints them (the
  // file a configuration's run leaves beside its logs, for links that misbehave).
  std::string Stats(int index) const;

  int devices() const { return devices_; }
  // The cloud's address as device `index` sees it, and the device's own address.
  static std::string HostAddress(int index);
  static std::string DeviceAddress(int index);
  // Prefix that runs a command inside device `index`'s namespace.
  static std::vector<std::string> ExecPrefix(int index);

 private:
  EdgeLinks(std::filesystem::path script, int devices)
      : script_(std::move(script)), devices_(devices) {}
  std::filesystem::path script_;
  int devices_ = 0;
};

// Runs `argv` (no shell) and returns its exit code and its stdout+stderr.
struct CommandResult {
  int exit_code = -1;
  std::string output;
};
CommandResult RunCommand(const std::vector<std::string>& argv);

}  // namespace tophat::bench
