// How tophat's gRPC links are secured: TLS from certificate files that are re-read while the
// daemons run (gRPC's FileWatcherCertificateProvider: a rotated certificate is picked up
// without a restart), mutual on the cloud link, and the identity a peer's certificate names.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/security/auth_context.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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

// A server's credentials: its certificate, and clients must present a certificate that
// `ca_file` signed (mutual TLS; the handshake fails otherwise).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MutualTlsServerCredentials(
    const TlsFiles& files, absl::string_view key_prefix, absl::string_view ca_field = "ca_file");

// A client's credentials: it presents its certificate and accepts only a server whose
// certificate `ca_file` signed, for the host it dialled (or the name the caller overrides
// with grpc.ssl_target_name_override).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MutualTlsChannelCredentials(
    const TlsFiles& files, absl::string_view key_prefix, absl::string_view ca_field = "ca_file");

// Who the peer of a call is: the first DNS name of its certificate's subject alternative
// names, else its subject's common name; "" without a verified certificate (plaintext).
std::string PeerIdentity(const grpc::AuthContext& context);

}  // namespace tophat
