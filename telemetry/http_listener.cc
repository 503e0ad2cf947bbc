#include "telemetry/http_listener.h"

#include <httplib.h>

#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "configs/config_checks.h"

namespace tophat {

absl::StatusOr<int> ListenOnThread(httplib::Server& server, const std::string& address,
                                   std::thread& thread) {
  const std::optional<HostPort> split = SplitHostPort(address);
  if (!split.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", address, "\" is not host:port"));
  }
  const std::string& host = split->host;
  const int port = split->port;
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would let a second
  // daemon bind the same port silently.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof(yes));
  });
  int bound = -1;
  if (port == 0) {
    bound = server.bind_to_any_port(host.c_str());
  } else if (server.bind_to_port(host.c_str(), port)) {
    bound = port;
  }
  if (bound <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, " (in use, or not a local address)"));
  }
  httplib::Server* raw = &server;
  thread = std::thread([raw] { raw->listen_after_bind(); });
  // httplib's stop() does nothing until the listening thread has marked itself running, so a
  // daemon that failed right after this (a bundle that does not load) would join a thread
  // that never ends and hang instead of exiting. Wait for it (it takes microseconds).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!raw->is_running() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return bound;
}

}  // namespace tophat
