// One DNS name that stands for several clouds, as a Kubernetes headless Service's name does
// (agent.yaml cloud_address "dns:///HOST:PORT"): the agent keeps a fixed number of streams
// ("slots"), and each slot dials one of the addresses the name resolves to that no other slot
// holds. A slot whose cloud is lost resolves the name again before it reconnects, so a cloud
// that comes back on another address (a rescheduled pod) is found there, and one that comes
// back on the same address is dialled again.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tophat {

inline constexpr std::string_view kDnsScheme = "dns:///";

// Whether an agent's cloud address names a DNS name for several clouds.
inline bool IsDnsCloudTarget(std::string_view address) {
  return address.substr(0, kDnsScheme.size()) == kDnsScheme;
}

// The addresses HOST resolves to, as "IP:PORT" ("[IP6]:PORT"), each once, sorted.
absl::StatusOr<std::vector<std::string>> ResolveHostAddresses(std::string_view host, int port);

class DnsClouds {
 public:
  // `target` is "dns:///HOST:PORT". `slots` streams; 0: as many as the name resolves to now
  // (1 when it does not resolve yet).
  static absl::StatusOr<std::unique_ptr<DnsClouds>> Create(std::string_view target, size_t slots);

  const std::string& host() const { return host_; }
  size_t slots() const { return held_.size(); }

  // The address slot `slot` should dial now: the one it held, while the name still resolves
  // to it, else the first that no other slot holds. UNAVAILABLE naming the host when the name
  // does not resolve, or when every address it resolves to is held by another slot (fewer
  // clouds than slots; the slot tries again later).
  absl::StatusOr<std::string> AddressFor(size_t slot);

 private:
  DnsClouds(std::string host, int port, size_t slots)
      : host_(std::move(host)), port_(port), held_(slots) {}

  const std::string host_;
  const int port_;
  std::mutex mutex_;
  std::vector<std::string> held_;  // by slot; "" when none
};

}  // namespace tophat
