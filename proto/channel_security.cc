#include "proto/channel_security.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/openssl_util.h"

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

using openssl::BioPtr;
using openssl::OpenFile;
using openssl::PkeyPtr;
using openssl::UnixSeconds;
using openssl::Utc;
using openssl::X509Ptr;

// At start-up, a certificate in use that has ended, has not begun, or ends within
// kCertificateWarningDays is logged: peers refuse it, or soon will. Not refused here: a
// device's clock (a Jetson without a battery-backed clock) may be wrong, and the peer's is
// the one that decides.
void WarnOfValidity(const std::string& path, const std::string& key) {
  auto validity = ReadCertificateValidity(path, key);
  if (!validity.ok()) return;  // gRPC's own reading reports it
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  if (validity->not_after_s <= now) {
    spdlog::error("{}: {} expired at {} (this host's clock says {}); peers refuse it until it "
                  "is renewed", key, path, Utc(validity->not_after_s), Utc(now));
  } else if (validity->not_before_s > now) {
    spdlog::error("{}: {} is valid only from {} (this host's clock says {}: is it wrong?)", key,
                  path, Utc(validity->not_before_s), Utc(now));
  } else if (validity->not_after_s - now < kCertificateWarningDays * 86400) {
    spdlog::warn("{}: {} expires at {}, in {:.1f} days; renew it (the new file is picked up "
                 "without a restart)", key, path, Utc(validity->not_after_s),
                 static_cast<double>(validity->not_after_s - now) / 86400);
  }
}

std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> Provider(const TlsFiles& files) {
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.private_key_file, files.certificate_file, files.ca_file, kCertificateRefreshSeconds);
}

}  // namespace

absl::StatusOr<CertificateValidity> ReadCertificateValidity(const std::string& path,
                                                            absl::string_view key) {
  BioPtr file = OpenFile(path);
  if (file == nullptr) return absl::NotFoundError(absl::StrCat(key, ": cannot read ", path));
  CertificateValidity validity;
  while (X509Ptr certificate{PEM_read_bio_X509(file.get(), nullptr, nullptr, nullptr)}) {
    const std::optional<int64_t> begins = UnixSeconds(X509_get0_notBefore(certificate.get()));
    const std::optional<int64_t> ends = UnixSeconds(X509_get0_notAfter(certificate.get()));
    if (!begins || !ends) {
      return absl::InvalidArgumentError(absl::StrCat(
          key, ": ", path, ": certificate ", validity.certificates + 1,
          " has a validity period OpenSSL cannot read"));
    }
    validity.not_before_s =
        validity.certificates == 0 ? *begins : std::max(validity.not_before_s, *begins);
    validity.not_after_s =
        validity.certificates == 0 ? *ends : std::min(validity.not_after_s, *ends);
    ++validity.certificates;
  }
  if (validity.certificates == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": ", path, " holds no certificate (PEM \"CERTIFICATE\" block)"));
  }
  return validity;
}

absl::Status CheckKeyMatchesCertificate(const TlsFiles& files, absl::string_view key_prefix) {
  const std::string certificate_key = absl::StrCat(key_prefix, ".certificate_file");
  const std::string private_key_key = absl::StrCat(key_prefix, ".private_key_file");
  BioPtr certificate_file = OpenFile(files.certificate_file);
  if (certificate_file == nullptr) {
    return absl::NotFoundError(absl::StrCat(certificate_key, ": cannot read ",
                                            files.certificate_file));
  }
  X509Ptr certificate{PEM_read_bio_X509(certificate_file.get(), nullptr, nullptr, nullptr)};
  if (certificate == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        certificate_key, ": ", files.certificate_file,
        " holds no certificate (PEM \"CERTIFICATE\" block)"));
  }
  BioPtr key_file = OpenFile(files.private_key_file);
  if (key_file == nullptr) {
    return absl::NotFoundError(absl::StrCat(private_key_key, ": cannot read ",
                                            files.private_key_file));
  }
  // No passphrase callback: gRPC reads keys unencrypted too.
  PkeyPtr key{PEM_read_bio_PrivateKey(key_file.get(), nullptr,
                                      [](char*, int, int, void*) { return 0; }, nullptr)};
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        private_key_key, ": ", files.private_key_file,
        " holds no unencrypted private key OpenSSL can read"));
  }
  if (X509_check_private_key(certificate.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        private_key_key, ": ", files.private_key_file, " is not the key of ", certificate_key,
        " (", files.certificate_file, "): every TLS handshake would fail; deploy the key the "
        "certificate was issued for"));
  }
  return absl::OkStatus();
}

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
  if (absl::Status checked = CheckKeyMatchesCertificate(files, key_prefix); !checked.ok()) {
    return checked;
  }
  WarnOfValidity(files.certificate_file, absl::StrCat(key_prefix, ".certificate_file"));
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
  if (absl::Status checked = CheckKeyMatchesCertificate(files, key_prefix); !checked.ok()) {
    return checked;
  }
  WarnOfValidity(files.certificate_file, absl::StrCat(key_prefix, ".certificate_file"));
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
  if (absl::Status checked = CheckKeyMatchesCertificate(files, key_prefix); !checked.ok()) {
    return checked;
  }
  WarnOfValidity(files.certificate_file, absl::StrCat(key_prefix, ".certificate_file"));
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
  auto digest = BearerDigest(authorization);
  if (!digest.ok()) return digest.status();
  return MatchBearerDigest(*digest, tokens);
}

absl::StatusOr<std::string> BearerDigest(absl::string_view authorization) {
  absl::string_view token = authorization;
  if (!absl::ConsumePrefix(&token, "Bearer ") || token.empty()) {
    return absl::UnauthenticatedError("the authorization is not \"Bearer <token>\"");
  }
  return Sha256Hex(token);
}

absl::StatusOr<std::string> MatchBearerDigest(absl::string_view digest,
                                              const std::vector<BearerToken>& tokens) {
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

namespace openssl {

std::optional<int64_t> UnixSeconds(const ASN1_TIME* time) {
  ASN1_TIME* epoch = ASN1_TIME_set(nullptr, 0);
  if (epoch == nullptr) return std::nullopt;
  int days = 0;
  int seconds = 0;
  const bool ok = ASN1_TIME_diff(&days, &seconds, epoch, time) == 1;
  ASN1_TIME_free(epoch);
  if (!ok) return std::nullopt;
  return int64_t{days} * 86400 + seconds;
}

std::string Utc(int64_t unix_seconds) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixSeconds(unix_seconds),
                          absl::UTCTimeZone());
}

std::string TakeMemoryBio(BIO* bio) {
  BioPtr owned(bio);
  char* data = nullptr;
  const long size = BIO_get_mem_data(owned.get(), &data);
  return size > 0 ? std::string(data, static_cast<size_t>(size)) : std::string();
}

std::string NameText(const X509_NAME* name) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || X509_NAME_print_ex(bio.get(), name, 0, XN_FLAG_RFC2253) < 0) return "";
  return TakeMemoryBio(bio.release());
}

}  // namespace openssl
}  // namespace tophat
