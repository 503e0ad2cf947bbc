#include "proto/revocation_metrics.h"

#include "telemetry/metric_builders.h"

namespace tophat {

RevocationListMetrics::RevocationListMetrics(prometheus::Registry& registry, const std::string& key)
    : revoked_certificates_(
          AddGauge(registry, "tophat_crl_revoked_certificates",
                   "Certificates the CRLs of " + key + " revoke, as last read (0 without one)")),
      next_update_(AddGauge(registry, "tophat_crl_next_update_timestamp_seconds",
                            "Earliest nextUpdate of the CRLs of " + key +
                                ", seconds since 1970 (0: no CRL); past it, revocations "
                                "since are unknown")) {}

void RevocationListMetrics::Report(const RevokedCertificates* revoked) {
  revoked_certificates_.Set(revoked != nullptr ? static_cast<double>(revoked->certificates) : 0);
  next_update_.Set(revoked != nullptr && revoked->next_update_s
                       ? static_cast<double>(*revoked->next_update_s)
                       : 0);
}

}  // namespace tophat
