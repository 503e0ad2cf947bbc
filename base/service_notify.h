// systemd's service notification protocol (sd_notify(3)), spoken directly: one datagram of
// "KEY=VALUE" lines to the AF_UNIX socket named by $NOTIFY_SOCKET. The daemons say READY=1
// once they serve, STOPPING=1 when they begin to drain, and WATCHDOG=1 while their work loop
// turns (Type=notify and WatchdogSec= in deploy/*.service). Outside systemd (no
// $NOTIFY_SOCKET) every call does nothing. The protocol is small and stable; speaking it here
// spares the daemons a libsystemd they would need only for this.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace tophat {

// Sends `state` (e.g. "READY=1\nSTATUS=serving") to $NOTIFY_SOCKET. True when it was sent;
// false without $NOTIFY_SOCKET or when the socket refuses (nothing else to do then: the
// daemon runs on, and systemd's timeouts say what went wrong).
inline bool ServiceNotify(std::string_view state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return false;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const size_t length = std::strlen(path);
  if (length >= sizeof(address.sun_path)) return false;
  std::memcpy(address.sun_path, path, length);
  if (path[0] == '@') address.sun_path[0] = '\0';  // an abstract socket
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const auto address_length =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + length);
  const ssize_t sent = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                                reinterpret_cast<const sockaddr*>(&address), address_length);
  ::close(fd);
  return sent == static_cast<ssize_t>(state.size());
}

// The watchdog interval systemd expects WATCHDOG=1 within ($WATCHDOG_USEC, when
// $WATCHDOG_PID is unset or this process), or nullopt when no watchdog is asked for.
inline std::optional<std::chrono::microseconds> ServiceWatchdogInterval() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  if (usec == nullptr) return std::nullopt;
  if (const char* pid = std::getenv("WATCHDOG_PID");
      pid != nullptr && std::string(pid) != std::to_string(::getpid())) {
    return std::nullopt;
  }
  char* end = nullptr;
  const long long value = std::strtoll(usec, &end, 10);
  if (end == usec || *end != '\0' || value <= 0) return std::nullopt;
  return std::chrono::microseconds(value);
}

}  // namespace tophat
