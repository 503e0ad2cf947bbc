// Value checks and path handling shared by the cloud and agent config loaders. Each check
// returns OK or InvalidArgument whose message says what is wrong with the value; callers
// attach the key (and, when loading a file, the line).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace tophat {

// "host:port" as gRPC takes it: a host name or IPv4 address, or a bracketed IPv6 address
// ("[::1]:7100"), then a decimal port. Port 0 (the OS picks one) only when `allow_port_zero`:
// fine for a listening socket, meaningless for an address to connect to.
// gRPC's Unix-domain socket address ("unix:/run/tophat/agent.sock").
bool IsUnixSocketAddress(std::string_view address);
// Whether host:port names this host only: 127.0.0.0/8, localhost or [::1].
bool IsLoopbackAddress(std::string_view address);

absl::Status CheckHostPort(std::string_view address, bool allow_port_zero);

// "host:port" taken apart for a socket: the host without an IPv6 address's brackets, and the
// port; nullopt without a colon or with a port that is not a decimal in [0, 65535]. Checks
// nothing of the host (CheckHostPort does).
struct HostPort {
  std::string host;
  int port = 0;
};
std::optional<HostPort> SplitHostPort(std::string_view address);

// Binds and closes a TCP socket at `address` (host:port, as CheckHostPort takes) the way gRPC
// will (SO_REUSEADDR, no SO_REUSEPORT), so that a daemon can say why it cannot listen, e.g.
// "127.0.0.1:7200: Address already in use", before gRPC tries and logs its own dump.
// Unavailable naming `key`, the address and the system's reason; ok for unix: addresses.
absl::Status CheckCanListen(std::string_view address, std::string_view key);

// --check-config's report on the ports a daemon would bind, a line each: "key address: free",
// or CheckCanListen's reason followed by " (a running `daemon`'s?)": a port in use is what a
// running daemon's look like, so it is said, not refused. Empty addresses and Unix sockets
// are left out. Pairs of (key, address).
std::vector<std::string> DescribeListenPorts(
    std::initializer_list<std::pair<std::string_view, std::string_view>> ports,
    std::string_view daemon);

// float32 | float16 | bfloat16.
absl::Status CheckDtype(std::string_view dtype);
// A hidden-state wire dtype as the agent config names it: cloud, scheduler, float32, float16,
// bfloat16, int8.
absl::Status CheckWireDtype(std::string_view dtype);
// One wire dtype by name: float32, float16, bfloat16 or int8 (scheduler.wire_dtypes).
absl::Status CheckWireDtypeChoice(std::string_view dtype);

// cpu | cuda | cuda:N.
absl::Status CheckDevice(std::string_view device);

// A compute dtype the device runs: float16 needs CUDA. LibTorch 1.13's CPU GEMMs had no
// float16 kernel; 2.11's have, but nothing tests tophat's CPU paths in float16 yet, so it
// stays refused rather than untested. Both already checked alone.
absl::Status CheckDtypeOnDevice(std::string_view dtype, std::string_view device);

// trace | debug | info | warn | error.
absl::Status CheckLogLevel(std::string_view level);

// `value` >= `min` (0 or 1 in practice), phrased as "must be positive" / "non-negative".
absl::Status CheckAtLeast(int64_t value, int64_t min);
absl::Status CheckAtLeast(double value, double min, bool inclusive);

// Resolves a relative path in a config against the directory of the config file named by
// `source_name` (the working directory when it has none) and makes it absolute and
// lexically normal, so a daemon finds it whatever its working directory. An absolute path
// is returned unchanged; so is "".
// The problem with a config's TLS section, if any: `insecure` and certificate files
// together, or (when `require_files`, i.e. at validation) a file missing without `insecure`.
// Returns the key to report and the message; `purpose` says what the TLS is for.
struct TlsSection {
  std::string_view prefix;  // "tls" or "cloud_tls"
  bool insecure = false;
  std::string_view certificate_file, private_key_file, ca_file;
  std::string_view ca_field;  // the CA file's key: "ca_file" or "client_ca_file"
  std::string_view purpose;   // e.g. "agents connect to the cloud"
};
std::optional<std::pair<std::string, std::string>> TlsSectionProblem(const TlsSection& section,
                                                                     bool require_files);

std::string ResolveConfigPath(std::string_view path, std::string_view source_name);

// This machine's physical memory in bytes, or 0 when the system will not say.
int64_t PhysicalMemoryBytes();

}  // namespace tophat
