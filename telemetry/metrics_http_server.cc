#include "telemetry/metrics_http_server.h"

#include <chrono>
#include <thread>

#include <httplib.h>
#include <prometheus/text_serializer.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tophat {

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", address, "\" is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  auto server = std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer());
  server->registry_ = std::move(registry);
  server->server_ = std::make_unique<httplib::Server>();
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would let a second
  // daemon bind the same metrics port silently.
  server->server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof(yes));
  });
  prometheus::Registry* collectable = server->registry_.get();
  server->server_->Get("/metrics", [collectable](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus::TextSerializer().Serialize(collectable->Collect()),
                    "text/plain; version=0.0.4");
  });
  if (port == 0) {
    server->port_ = server->server_->bind_to_any_port(host.c_str());
  } else if (server->server_->bind_to_port(host.c_str(), port)) {
    server->port_ = port;
  } else {
    server->port_ = -1;
  }
  if (server->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address,
                                               " (in use, or not a local address)"));
  }
  httplib::Server* raw = server->server_.get();
  server->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  // httplib's stop() does nothing until the listening thread has marked itself running, so a
  // daemon that failed right after this (a bundle that does not load) would join a thread
  // that never ends and hang instead of exiting. Wait for it (it takes microseconds).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!raw->is_running() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return server;
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> StartConfiguredMetricsServer(
    const std::string& metrics_address, std::shared_ptr<prometheus::Registry> registry) {
  if (metrics_address.empty()) return std::unique_ptr<MetricsHttpServer>();
  auto started = MetricsHttpServer::Start(metrics_address, std::move(registry));
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
