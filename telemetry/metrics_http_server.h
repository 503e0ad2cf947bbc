// Serves a Prometheus registry as text on GET /metrics. Built on cpp-httplib rather than
// prometheus-cpp's civetweb Exposer: in processes that also load gRPC and LibTorch, Debian's
// civetweb fails to start after binding (mg_start returns null), while httplib works and
// reports bind errors clearly.
#pragma once

#include <prometheus/registry.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace tophat {

// A GET route served beside /metrics (the cloud's /devices): the handler gets the query's
// parameters and says what to answer. Called on the server's thread.
struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};
using HttpRoutes =
    std::map<std::string,
             std::function<HttpReply(const std::multimap<std::string, std::string>& params)>>;

class MetricsHttpServer {
 public:
  // Listens on `address` ("host:port"; port 0 picks a free one) and serves in a thread:
  // /metrics, and `routes`.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry,
      HttpRoutes routes = {});
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
    const std::string& metrics_address, std::shared_ptr<prometheus::Registry> registry,
    HttpRoutes routes = {});

}  // namespace tophat
