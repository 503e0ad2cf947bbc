#include "proto/channel_security.h"

#include <fstream>
#include <tuple>
#include <iterator>
#include <utility>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

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

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsServerCredentials(
    const TlsFiles& files, absl::string_view key_prefix) {
  for (auto [path, field, what] :
       {std::tuple{&files.certificate_file, absl::string_view("certificate_file"),
                   "this end's certificate chain"},
        std::tuple{&files.private_key_file, absl::string_view("private_key_file"),
                   "its private key"}}) {
    if (absl::Status checked = CheckPem(*path, absl::StrCat(key_prefix, ".", field), what);
        !checked.ok()) {
      return checked;
    }
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.private_key_file, files.certificate_file, kCertificateRefreshSeconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsChannelCredentials(
    const std::string& ca_file, absl::string_view ca_key) {
  if (absl::Status checked = CheckPem(ca_file, ca_key, "the CA that signs the server"); !checked.ok()) {
    return checked;
  }
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(
      std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
          ca_file, kCertificateRefreshSeconds));
  options.watch_root_certs();
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

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  // EVP_Digest fails only on allocation failure inside OpenSSL; an empty digest then matches
  // no configured one.
  if (EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr) != 1) return "";
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), length));
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view key) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(key, ": cannot read ", path));
  std::string line;
  std::getline(in, line);
  const std::string token(absl::StripAsciiWhitespace(line));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": ", path, " holds no token on its first line"));
  }
  return token;
}

absl::StatusOr<std::string> AuthenticateBearer(const grpc::ServerContextBase& context,
                                               const std::vector<BearerToken>& tokens) {
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find(kAuthorizationMetadata);
  if (found == metadata.end()) {
    return absl::UnauthenticatedError("no bearer token (authorization metadata) on the call");
  }
  return AuthenticateBearerValue(absl::string_view(found->second.data(), found->second.size()),
                                 tokens);
}

absl::StatusOr<std::string> AuthenticateBearerValue(absl::string_view authorization,
                                                    const std::vector<BearerToken>& tokens) {
  absl::string_view token = authorization;
  if (!absl::ConsumePrefix(&token, "Bearer ") || token.empty()) {
    return absl::UnauthenticatedError("the authorization is not \"Bearer <token>\"");
  }
  const std::string digest = Sha256Hex(token);
  const BearerToken* match = nullptr;
  for (const BearerToken& candidate : tokens) {
    // Every digest is compared, in constant time, so timing tells nothing about which is near.
    if (digest.size() == candidate.sha256_hex.size() &&
        CRYPTO_memcmp(digest.data(), candidate.sha256_hex.data(), digest.size()) == 0) {
      match = &candidate;
    }
  }
  if (match == nullptr) return absl::UnauthenticatedError("the bearer token is not one configured");
  return match->name;
}

std::string BearerMetadataValue(absl::string_view token) { return absl::StrCat("Bearer ", token); }

}  // namespace tophat
