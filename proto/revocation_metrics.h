// What a daemon's CRL file revokes, as Prometheus gauges: the cloud's tls.crl_file (device
// certificates) or an agent's cloud_tls.crl_file (clouds' certificates). A CRL past its
// nextUpdate still revokes what it lists but not what was revoked since; the alert
// TophatCrlStale (deploy/prometheus-alerts.yml) reads the second gauge.
#pragma once

#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <string>

#include "proto/certificate_revocation.h"

namespace tophat {

class RevocationListMetrics {
 public:
  // Registers tophat_crl_revoked_certificates and tophat_crl_next_update_timestamp_seconds;
  // `key` names the file in their help ("tls.crl_file"). Both read 0 until Report.
  RevocationListMetrics(prometheus::Registry& registry, const std::string& key);

  // The CRLs as last read; null: none.
  void Report(const RevokedCertificates* revoked);

 private:
  prometheus::Gauge& revoked_certificates_;
  prometheus::Gauge& next_update_;
};

}  // namespace tophat
