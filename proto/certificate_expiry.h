// When the TLS certificates a daemon uses expire, as a Prometheus gauge, re-read from their
// files every minute: the links pick up a rotated file without a restart (channel_security.h),
// so the gauge follows the rotation too. An expired certificate is a whole fleet's outage at
// once (every handshake fails); the alerts TophatCertificateExpiresSoon and
// TophatCertificateExpiring (deploy/prometheus-alerts.yml) read this gauge weeks and days
// before.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

namespace tophat {

class CertificateExpiryMetrics {
 public:
  struct File {
    std::string key;   // the config key naming it, e.g. "tls.certificate_file": the label
    std::string path;
  };
  // Registers tophat_tls_certificate_expiry_timestamp_seconds{key} for each file with a path,
  // reads them now and then every `interval` on a thread of its own.
  CertificateExpiryMetrics(prometheus::Registry& registry, std::vector<File> files,
                           std::chrono::milliseconds interval = std::chrono::minutes(1));
  ~CertificateExpiryMetrics();  // stops the thread
  CertificateExpiryMetrics(const CertificateExpiryMetrics&) = delete;
  CertificateExpiryMetrics& operator=(const CertificateExpiryMetrics&) = delete;

  // Reads every file again. One that cannot be read keeps its last value (gRPC keeps using
  // what it last read too) and is logged once until it reads again.
  void Refresh();

 private:
  struct Watched {
    File file;
    prometheus::Gauge* gauge;
    bool failing = false;
  };
  std::vector<Watched> watched_;
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;  // under mutex_
  std::thread thread_;
};

}  // namespace tophat
