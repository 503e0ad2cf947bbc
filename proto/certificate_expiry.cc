#include "proto/certificate_expiry.h"

#include <utility>

#include <spdlog/spdlog.h>

#include "proto/channel_security.h"

namespace tophat {

CertificateExpiryMetrics::CertificateExpiryMetrics(prometheus::Registry& registry,
                                                   std::vector<File> files,
                                                   std::chrono::milliseconds interval) {
  auto& family = prometheus::BuildGauge()
                     .Name("tophat_tls_certificate_expiry_timestamp_seconds")
                     .Help("When each TLS certificate file the daemon uses expires: the "
                           "earliest notAfter of its certificates, in seconds since 1970 "
                           "(re-read every minute, as the file may rotate)")
                     .Register(registry);
  for (File& file : files) {
    if (file.path.empty()) continue;
    prometheus::Gauge* gauge = &family.Add({{"key", file.key}});
    watched_.push_back({.file = std::move(file), .gauge = gauge});
  }
  Refresh();
  if (watched_.empty()) return;
  thread_ = std::thread([this, interval] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_cv_.wait_for(lock, interval, [this] { return stop_; })) {
      lock.unlock();
      Refresh();
      lock.lock();
    }
  });
}

CertificateExpiryMetrics::~CertificateExpiryMetrics() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void CertificateExpiryMetrics::Refresh() {
  // Called by the constructor and then only by the thread (or a test, without the thread).
  for (Watched& watched : watched_) {
    auto validity = ReadCertificateValidity(watched.file.path, watched.file.key);
    if (!validity.ok()) {
      if (!watched.failing) {
        spdlog::warn("{}; its expiry metric keeps the last value read",
                     std::string(validity.status().message()));
      }
      watched.failing = true;
      continue;
    }
    if (watched.failing) spdlog::info("{}: {} reads again", watched.file.key, watched.file.path);
    watched.failing = false;
    watched.gauge->Set(static_cast<double>(validity->not_after_s));
  }
}

}  // namespace tophat
