#include "telemetry/metrics_http_server.h"


#include <httplib.h>
#include <prometheus/text_serializer.h>

#include <chrono>

#include "telemetry/http_listener.h"
#include "telemetry/metric_builders.h"

#include "absl/strings/str_cat.h"

namespace tophat {
namespace {

// When this process started (its static initialization, before main).
const double process_start_seconds =
    std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry, HttpRoutes routes) {
  auto server = std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer());
  server->registry_ = std::move(registry);
  server->server_ = std::make_unique<httplib::Server>();
  prometheus::Registry* collectable = server->registry_.get();
  server->server_->Get("/metrics", [collectable](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus::TextSerializer().Serialize(collectable->Collect()),
                    "text/plain; version=0.0.4");
  });
  for (auto& [path, handler] : routes) {
    server->server_->Get(
        path, [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
          HttpReply reply = handler(req.params);
          res.status = reply.status;
          res.set_content(std::move(reply.body), reply.content_type);
        });
  }
  auto port = ListenOnThread(*server->server_, address, server->thread_);
  if (!port.ok()) return port.status();
  server->port_ = *port;
  return server;
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> StartConfiguredMetricsServer(
    const std::string& metrics_address, std::shared_ptr<prometheus::Registry> registry,
    HttpRoutes routes) {
  if (metrics_address.empty()) return std::unique_ptr<MetricsHttpServer>();
  // The name Prometheus's client libraries give it: an alert counts a daemon's restarts by
  // its changes (deploy/prometheus-alerts.yml), which a scrape interval could miss in `up`.
  AddGauge(*registry, "process_start_time_seconds",
           "Start time of the process since the Unix epoch, in seconds")
      .Set(process_start_seconds);
  auto started = MetricsHttpServer::Start(metrics_address, std::move(registry), std::move(routes));
  if (!started.ok()) {
    return absl::Status(started.status().code(),
                        absl::StrCat("metrics_address: ", started.status().message()));
  }
  return started;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tophat
