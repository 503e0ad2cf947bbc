// How tophat's gRPC links are secured: TLS from certificate files that are re-read while the
// daemons run (gRPC's FileWatcherCertificateProvider: a rotated certificate is picked up
// without a restart), mutual on the cloud link, and the identity a peer's certificate names.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/security/auth_context.h>
#include <grpcpp/server_context.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "configs/bearer_tokens.h"

namespace tophat {

// PEM files of one end of a link. Paths as the config gives them.
struct TlsFiles {
  std::string certificate_file;  // this end's certificate chain
  std::string private_key_file;  // its private key
  std::string ca_file;           // the roots that must have signed the other end's certificate
  bool operator==(const TlsFiles&) const = default;
};

// How often rotated certificate files are looked for.
inline constexpr unsigned kCertificateRefreshSeconds = 10;

// Each named file exists and holds PEM. Errors name the config key, `<key_prefix>.<field>`
// (the CA's field as `ca_field`), and the path.
absl::Status CheckTlsFiles(const TlsFiles& files, absl::string_view key_prefix,
                           absl::string_view ca_field = "ca_file");

// When the certificates of a PEM file are valid, in seconds since 1970: a chain only while all
// of it is, so the latest notBefore and the earliest notAfter over its certificates.
struct CertificateValidity {
  int64_t not_before_s = 0;
  int64_t not_after_s = 0;
  int certificates = 0;
};
// Errors name `key` and the path: unreadable, or holding no certificate OpenSSL can parse.
absl::StatusOr<CertificateValidity> ReadCertificateValidity(const std::string& path,
                                                            absl::string_view key);

// That `files.private_key_file` is the key of `files.certificate_file`'s first certificate.
// A mismatched pair (a renewed certificate beside the old key) would otherwise fail every
// handshake, with nothing in the daemon's own log; the error names both keys and paths.
absl::Status CheckKeyMatchesCertificate(const TlsFiles& files, absl::string_view key_prefix);

// Days before its end from which a certificate in use is warned of at start-up (and the
// alert TophatCertificateExpiresSoon fires, deploy/prometheus-alerts.yml).
inline constexpr int64_t kCertificateWarningDays = 14;

// A server's credentials: its certificate, and clients must present a certificate that
// `ca_file` signed (mutual TLS; the handshake fails otherwise).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MutualTlsServerCredentials(
    const TlsFiles& files, absl::string_view key_prefix, absl::string_view ca_field = "ca_file");

// A client's credentials: it presents its certificate and accepts only a server whose
// certificate `ca_file` signed, for the host it dialled (or the name the caller overrides
// with grpc.ssl_target_name_override).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MutualTlsChannelCredentials(
    const TlsFiles& files, absl::string_view key_prefix, absl::string_view ca_field = "ca_file");

// A server's credentials without client certificates (the app port: apps prove who they are
// with bearer tokens). `files.ca_file` is not used.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsServerCredentials(
    const TlsFiles& files, absl::string_view key_prefix);

// A client's credentials that accept only a server whose certificate `ca_file` signed;
// `ca_key` names the setting in errors.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsChannelCredentials(
    const std::string& ca_file, absl::string_view ca_key);

// Who the peer of a call is: the first DNS name of its certificate's subject alternative
// names, else its subject's common name; "" without a verified certificate (plaintext).
std::string PeerIdentity(const grpc::AuthContext& context);

// Bearer tokens: a caller proves who it is with a secret sent on every call as
// `authorization: Bearer <token>` metadata (over TLS, or where TLS ends in front of the
// daemon). Configs hold only each token's SHA-256, so a leaked config grants nothing.
inline constexpr char kAuthorizationMetadata[] = "authorization";

// Lowercase hex SHA-256 of `data` (what `printf %s TOKEN | sha256sum` prints).
std::string Sha256Hex(absl::string_view data);

// Reads a token file: its first line, surrounding whitespace removed; never empty. Errors
// name `key` and the path, never the file's contents.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view key);

// The name of the token a call carries, compared in constant time against every digest.
// Unauthenticated (saying what is missing or wrong, never echoing the token) otherwise.
absl::StatusOr<std::string> AuthenticateBearer(const grpc::ServerContextBase& context,
                                               const std::vector<BearerToken>& tokens);

// The same for an `authorization` value from elsewhere (an HTTP header).
absl::StatusOr<std::string> AuthenticateBearerValue(absl::string_view authorization,
                                                    const std::vector<BearerToken>& tokens);

// AuthenticateBearerValue in two halves, for a caller that checks one call's token again
// later (against a reloaded config) without keeping the token: the SHA-256 of the token an
// `authorization` value carries (Unauthenticated when it is not "Bearer <token>"), and the
// name of the token with that digest, compared in constant time against every one.
absl::StatusOr<std::string> BearerDigest(absl::string_view authorization);
absl::StatusOr<std::string> MatchBearerDigest(absl::string_view digest,
                                              const std::vector<BearerToken>& tokens);

// `authorization` metadata's value for `token`.
std::string BearerMetadataValue(absl::string_view token);

}  // namespace tophat
