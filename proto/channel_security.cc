#include "proto/channel_security.h"

#include <fstream>
#include <tuple>
#include <iterator>
#include <utility>

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tophat {
namespace {

absl::Status CheckPem(const std::string& path, absl::string_view key, absl::string_view what) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(key, ": required (", what, ")"));
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(key, ": cannot read ", path, " (", what, ")"));
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!absl::StrContains(text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": ", path, " is not PEM (no -----BEGIN line; ", what, ")"));
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> Provider(const TlsFiles& files) {
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.private_key_file, files.certificate_file, files.ca_file, kCertificateRefreshSeconds);
}

}  // namespace

absl::Status CheckTlsFiles(const TlsFiles& files, absl::string_view key_prefix,
                           absl::string_view ca_field) {
  for (auto [path, field, what] :
       {std::tuple{&files.certificate_file, absl::string_view("certificate_file"),
                   "this end's certificate chain"},
        std::tuple{&files.private_key_file, absl::string_view("private_key_file"), "its private key"},
        std::tuple{&files.ca_file, ca_field, "the CA that signs the other end"}}) {
    if (absl::Status checked = CheckPem(*path, absl::StrCat(key_prefix, ".", field), what);
        !checked.ok()) {
      return checked;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MutualTlsServerCredentials(
    const TlsFiles& files, absl::string_view key_prefix, absl::string_view ca_field) {
  if (absl::Status checked = CheckTlsFiles(files, key_prefix, ca_field); !checked.ok()) {
    return checked;
  }
  grpc::experimental::TlsServerCredentialsOptions options(Provider(files));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MutualTlsChannelCredentials(
    const TlsFiles& files, absl::string_view key_prefix, absl::string_view ca_field) {
  if (absl::Status checked = CheckTlsFiles(files, key_prefix, ca_field); !checked.ok()) {
    return checked;
  }
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(Provider(files));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(options);
}

std::string PeerIdentity(const grpc::AuthContext& context) {
  if (!context.IsPeerAuthenticated()) return "";
  for (const char* property : {"x509_subject_alternative_name", "x509_common_name"}) {
    for (const grpc::string_ref& value : context.FindPropertyValues(property)) {
      if (value.size() > 0) return std::string(value.data(), value.size());
    }
  }
  return "";
}

}  // namespace tophat
