// Serves a Prometheus registry as text on GET /metrics. Built on cpp-httplib rather than
// prometheus-cpp's civetweb Exposer: in processes that also load gRPC and LibTorch, Debian's
// civetweb fails to start after binding (mg_start returns null), while httplib works and
// reports bind errors clearly.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include <prometheus/registry.h>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace tophat {

class MetricsHttpServer {
 public:
  // Listens on `address` ("host:port"; port 0 picks a free one) and serves in a thread.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsHttpServer();

  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::thread thread_;
  int port_ = 0;
};

// A daemon's `metrics_address` setting: empty disables metrics (returns nullptr); an error
// names the key. Adds process_start_time_seconds to `registry`.
absl::StatusOr<std::unique_ptr<MetricsHttpServer>> StartConfiguredMetricsServer(
    const std::string& metrics_address, std::shared_ptr<prometheus::Registry> registry);

}  // namespace tophat
