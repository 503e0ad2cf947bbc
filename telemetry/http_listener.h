// Serving a cpp-httplib server on a thread, as both daemons' HTTP endpoints do (Prometheus
// metrics; the agent's OpenAI endpoint).
#pragma once

#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace tophat {

// Binds `server` (routes already set) to `address` ("host:port" or "[v6]:port"; port 0 picks a
// free one) with SO_REUSEADDR only, then serves it on `thread` and returns once it listens.
// Returns the port. Errors say what is wrong with `address` (not host:port; in use or not a
// local address); the caller prefixes the setting's name.
absl::StatusOr<int> ListenOnThread(httplib::Server& server, const std::string& address,
                                   std::thread& thread);

}  // namespace tophat
