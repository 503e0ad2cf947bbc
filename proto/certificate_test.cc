#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/test_util.h"
#include "proto/certificate_expiry.h"
#include "proto/channel_security.h"
#include "proto/openssl_util.h"

namespace tophat {
namespace {

constexpr int64_t kDay = 86400;

struct PkeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using Key = std::unique_ptr<EVP_PKEY, PkeyFree>;

Key NewKey() { return Key(EVP_EC_gen("P-256")); }

std::string KeyPem(EVP_PKEY* key) {
  BIO* bio = BIO_new(BIO_s_mem());
  REQUIRE(PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr) == 1);
  return openssl::TakeMemoryBio(bio);
}

// A self-signed certificate of `key`, valid from now + `begins_s` to now + `ends_s`.
std::string CertificatePem(EVP_PKEY* key, int64_t begins_s, int64_t ends_s) {
  X509* certificate = X509_new();
  X509_set_version(certificate, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(certificate), 1);
  X509_gmtime_adj(X509_getm_notBefore(certificate), static_cast<long>(begins_s));
  X509_gmtime_adj(X509_getm_notAfter(certificate), static_cast<long>(ends_s));
  X509_set_pubkey(certificate, key);
  X509_NAME* name = X509_get_subject_name(certificate);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("tophat-test"), -1, -1, 0);
  X509_set_issuer_name(certificate, name);
  REQUIRE(X509_sign(certificate, key, EVP_sha256()) > 0);
  BIO* bio = BIO_new(BIO_s_mem());
  REQUIRE(PEM_write_bio_X509(bio, certificate) == 1);
  X509_free(certificate);
  return openssl::TakeMemoryBio(bio);
}

std::string Write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
  return path.string();
}

int64_t Now() { return absl::ToUnixSeconds(absl::Now()); }

TEST_CASE("A certificate file's validity is its certificates' latest start and earliest end",
          "[tls]") {
  const testing::TempDir dir;
  Key key = NewKey();
  REQUIRE(key != nullptr);
  const int64_t now = Now();
  // Leaf first, then a CA that ends sooner and began later: the chain is as good as the CA.
  const std::string chain = Write(dir.path() / "chain.crt",
                                  CertificatePem(key.get(), -10 * kDay, 90 * kDay) +
                                      CertificatePem(key.get(), -2 * kDay, 30 * kDay));
  auto validity = ReadCertificateValidity(chain, "tls.certificate_file");
  REQUIRE(validity.ok());
  CHECK(validity->certificates == 2);
  // X509_gmtime_adj used the clock a moment after `now`.
  CHECK(std::abs(validity->not_after_s - (now + 30 * kDay)) <= 5);
  CHECK(std::abs(validity->not_before_s - (now - 2 * kDay)) <= 5);

  const auto missing = ReadCertificateValidity((dir.path() / "none.crt").string(), "tls.x");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains("tls.x: cannot read"));
  const std::string key_only = Write(dir.path() / "key.pem", KeyPem(key.get()));
  const auto not_certificate = ReadCertificateValidity(key_only, "tls.certificate_file");
  CHECK_THAT(std::string(not_certificate.status().message()),
             Catch::Contains("key.pem holds no certificate"));
}

TEST_CASE("A private key that is not its certificate's is refused, naming both files, and "
          "mutual TLS credentials are not built with it",
          "[tls]") {
  const testing::TempDir dir;
  Key key = NewKey();
  Key other = NewKey();
  const TlsFiles matching{
      .certificate_file = Write(dir.path() / "cloud.crt", CertificatePem(key.get(), 0, kDay * 400)),
      .private_key_file = Write(dir.path() / "cloud.key", KeyPem(key.get())),
      .ca_file = dir.path() / "cloud.crt"};
  CHECK(CheckKeyMatchesCertificate(matching, "tls").ok());
  CHECK(MutualTlsServerCredentials(matching, "tls", "client_ca_file").ok());

  TlsFiles mismatched = matching;
  mismatched.private_key_file = Write(dir.path() / "old.key", KeyPem(other.get()));
  const absl::Status refused = CheckKeyMatchesCertificate(mismatched, "tls");
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(refused.message()),
             Catch::Contains("tls.private_key_file: ") && Catch::Contains("old.key is not the key "
                                                                          "of tls.certificate_file") &&
                 Catch::Contains("cloud.crt"));
  auto server = MutualTlsServerCredentials(mismatched, "tls", "client_ca_file");
  CHECK(server.status().code() == absl::StatusCode::kInvalidArgument);
  auto client = MutualTlsChannelCredentials(mismatched, "cloud_tls");
  CHECK_THAT(std::string(client.status().message()),
             Catch::Contains("cloud_tls.private_key_file"));
  auto app = TlsServerCredentials(mismatched, "app_tls");
  CHECK_THAT(std::string(app.status().message()), Catch::Contains("app_tls.private_key_file"));
}

double GaugeValue(prometheus::Registry& registry, const std::string& key) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != "tophat_tls_certificate_expiry_timestamp_seconds") continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == "key" && label.value == key) return metric.gauge.value;
      }
    }
  }
  return -1;
}

TEST_CASE("The expiry gauge follows a rotated certificate file and keeps its value while the "
          "file cannot be read",
          "[tls]") {
  const testing::TempDir dir;
  Key key = NewKey();
  const std::filesystem::path path = dir.path() / "cloud.crt";
  Write(path, CertificatePem(key.get(), 0, 10 * kDay));
  const int64_t now = Now();
  prometheus::Registry registry;
  // An interval longer than the test: only the explicit refreshes read the file.
  CertificateExpiryMetrics metrics(registry,
                                   {{.key = "tls.certificate_file", .path = path.string()},
                                    {.key = "app_tls.certificate_file", .path = ""}},
                                   std::chrono::hours(1));
  CHECK(std::abs(GaugeValue(registry, "tls.certificate_file") - (now + 10 * kDay)) <= 5);
  CHECK(GaugeValue(registry, "app_tls.certificate_file") == -1);  // not configured: no series

  // Renewed in place (as make-certs.sh's rotation moves a new file over the old one).
  Write(path, CertificatePem(key.get(), 0, 400 * kDay));
  metrics.Refresh();
  CHECK(std::abs(GaugeValue(registry, "tls.certificate_file") - (now + 400 * kDay)) <= 5);
  std::filesystem::remove(path);
  metrics.Refresh();
  CHECK(std::abs(GaugeValue(registry, "tls.certificate_file") - (now + 400 * kDay)) <= 5);
}

}  // namespace
}  // namespace tophat
