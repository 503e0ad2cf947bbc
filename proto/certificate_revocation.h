// Certificate revocation lists (CRLs) as tophat-cloud applies them to devices: read from a
// PEM file (tls.crl_file) at start-up and at every reload, each CRL checked against the CA
// that must have signed it, and looked up by the cloud itself when a stream is admitted and
// when a reload checks the open streams again. Not gRPC's CRL directory: that one fails open
// on a missing CRL, is read only when a connection is made (a stream open before the CRL
// changed would live on), and reports nothing an operator could see.
#pragma once

#include <grpcpp/security/auth_context.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_set>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tophat {

// Which certificate: its issuer's name as RFC 2253 writes it, and its serial number in
// upper-case hex without leading zeros (as `openssl x509 -serial` prints it).
struct CertificateId {
  std::string issuer;
  std::string serial;
  bool operator==(const CertificateId&) const = default;
};

// The certificate a PEM block holds (the first of several); errors say what is wrong.
absl::StatusOr<CertificateId> CertificateIdOfPem(absl::string_view pem);

// The certificate the peer of a call presented, as gRPC hands it over (its x509_pem_cert
// property); nullopt without one (plaintext) or when it cannot be read.
std::optional<CertificateId> PeerCertificateId(const grpc::AuthContext& context);

// What the CRLs of one file revoke.
struct RevokedCertificates {
  // By issuer, the serial numbers revoked.
  std::map<std::string, std::unordered_set<std::string>> serials_by_issuer;
  int crls = 0;
  int64_t certificates = 0;  // revoked, over all CRLs
  // The earliest nextUpdate over the CRLs (seconds since 1970): past it, certificates
  // revoked since are missing from the file. nullopt when no CRL says.
  std::optional<int64_t> next_update_s;
  // The issuers whose CRL is past its nextUpdate now, each with when it was due.
  std::map<std::string, int64_t> stale_issuers;

  bool Revoked(const CertificateId& certificate) const;
};

// Reads every PEM CRL in `crl_file`. Each must be issued by a CA of `ca_file` (by name) and
// carry that CA's valid signature; a CRL past its nextUpdate still applies (what it revokes
// stays revoked) and is listed in stale_issuers. Errors name `crl_key` (and `ca_key` when the
// CA is at fault), the paths, and which CRL: a file that cannot be read or holds no CRL, a
// CRL from an issuer not in `ca_file`, a signature that does not verify.
absl::StatusOr<RevokedCertificates> LoadRevocationLists(const std::string& crl_file,
                                                        absl::string_view crl_key,
                                                        const std::string& ca_file,
                                                        absl::string_view ca_key);

// Logs a warning for each CRL of `revoked` past its nextUpdate: it still applies, but what its
// CA revoked since is not in it. `key` and `path` name the file; `renew` says how to renew it.
void WarnOfStaleRevocationLists(const RevokedCertificates& revoked, absl::string_view key,
                                absl::string_view path, absl::string_view renew);

}  // namespace tophat
