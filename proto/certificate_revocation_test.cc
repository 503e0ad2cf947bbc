#include "proto/certificate_revocation.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/test_util.h"
#include "proto/openssl_util.h"
#include "proto/revocation_metrics.h"

namespace tophat {
namespace {

namespace fs = std::filesystem;
using openssl::CrlPtr;
using openssl::PkeyPtr;
using openssl::X509Ptr;

constexpr int64_t kDay = 86400;

X509_NAME* CommonName(const std::string& name) {
  X509_NAME* subject = X509_NAME_new();
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0);
  return subject;
}

// A CA: its name and key, and its self-signed certificate.
struct Ca {
  std::string name;
  PkeyPtr key{EVP_EC_gen("P-256")};
  X509Ptr certificate{X509_new()};

  explicit Ca(std::string ca_name) : name(std::move(ca_name)) {
    X509_set_version(certificate.get(), 2);
    ASN1_INTEGER_set(X509_get_serialNumber(certificate.get()), 1);
    X509_gmtime_adj(X509_getm_notBefore(certificate.get()), 0);
    X509_gmtime_adj(X509_getm_notAfter(certificate.get()), 30 * kDay);
    X509_set_pubkey(certificate.get(), key.get());
    X509_NAME* subject = CommonName(name);
    X509_set_subject_name(certificate.get(), subject);
    X509_set_issuer_name(certificate.get(), subject);
    X509_NAME_free(subject);
    REQUIRE(X509_sign(certificate.get(), key.get(), EVP_sha256()) > 0);
  }

  std::string Pem() const {
    BIO* bio = BIO_new(BIO_s_mem());
    REQUIRE(PEM_write_bio_X509(bio, certificate.get()) == 1);
    return openssl::TakeMemoryBio(bio);
  }

  // A device certificate with `serial`, signed by this CA.
  std::string Issue(const std::string& device, long serial) const {
    X509Ptr leaf(X509_new());
    PkeyPtr leaf_key(EVP_EC_gen("P-256"));
    X509_set_version(leaf.get(), 2);
    ASN1_INTEGER_set(X509_get_serialNumber(leaf.get()), serial);
    X509_gmtime_adj(X509_getm_notBefore(leaf.get()), 0);
    X509_gmtime_adj(X509_getm_notAfter(leaf.get()), 30 * kDay);
    X509_set_pubkey(leaf.get(), leaf_key.get());
    X509_NAME* subject = CommonName(device);
    X509_set_subject_name(leaf.get(), subject);
    X509_NAME_free(subject);
    X509_set_issuer_name(leaf.get(), X509_get_subject_name(certificate.get()));
    REQUIRE(X509_sign(leaf.get(), key.get(), EVP_sha256()) > 0);
    BIO* bio = BIO_new(BIO_s_mem());
    REQUIRE(PEM_write_bio_X509(bio, leaf.get()) == 1);
    return openssl::TakeMemoryBio(bio);
  }

  // A CRL of this CA revoking `serials`, due for renewal `next_update_s` from now, signed
  // with `signer` (this CA's key unless given).
  std::string Crl(const std::vector<long>& serials, int64_t next_update_s = 7 * kDay,
                  EVP_PKEY* signer = nullptr) const {
    CrlPtr crl(X509_CRL_new());
    X509_CRL_set_version(crl.get(), 1);
    X509_CRL_set_issuer_name(crl.get(), X509_get_subject_name(certificate.get()));
    ASN1_TIME* now = X509_gmtime_adj(nullptr, 0);
    ASN1_TIME* next = X509_gmtime_adj(nullptr, static_cast<long>(next_update_s));
    X509_CRL_set1_lastUpdate(crl.get(), now);
    X509_CRL_set1_nextUpdate(crl.get(), next);
    for (const long serial : serials) {
      X509_REVOKED* entry = X509_REVOKED_new();
      ASN1_INTEGER* number = ASN1_INTEGER_new();
      ASN1_INTEGER_set(number, serial);
      X509_REVOKED_set_serialNumber(entry, number);
      X509_REVOKED_set_revocationDate(entry, now);
      ASN1_INTEGER_free(number);
      X509_CRL_add0_revoked(crl.get(), entry);
    }
    ASN1_TIME_free(now);
    ASN1_TIME_free(next);
    X509_CRL_sort(crl.get());
    REQUIRE(X509_CRL_sign(crl.get(), signer != nullptr ? signer : key.get(), EVP_sha256()) > 0);
    BIO* bio = BIO_new(BIO_s_mem());
    REQUIRE(PEM_write_bio_X509_CRL(bio, crl.get()) == 1);
    return openssl::TakeMemoryBio(bio);
  }
};

fs::path Write(const testing::TempDir& dir, const std::string& name, const std::string& text) {
  const fs::path path = dir.path() / name;
  std::ofstream(path) << text;
  return path;
}

TEST_CASE("A CRL revokes the certificates it lists, of its issuer only", "[tls]") {
  testing::TempDir dir;
  const Ca ca("tophat CA");
  const Ca other("another CA");
  const fs::path cas = Write(dir, "ca.crt", ca.Pem() + other.Pem());
  const fs::path crl = Write(dir, "crl.pem", ca.Crl({0x2a, 0x10F2}));

  auto revoked =
      LoadRevocationLists(crl.string(), "tls.crl_file", cas.string(), "tls.client_ca_file");
  REQUIRE(revoked.ok());
  CHECK(revoked->crls == 1);
  CHECK(revoked->certificates == 2);
  CHECK(revoked->stale_issuers.empty());
  REQUIRE(revoked->next_update_s.has_value());
  CHECK(std::abs(*revoked->next_update_s - (absl::ToUnixSeconds(absl::Now()) + 7 * kDay)) < 60);

  auto listed = CertificateIdOfPem(ca.Issue("device-1", 0x2a));
  REQUIRE(listed.ok());
  CHECK(listed->issuer == "CN=tophat CA");
  CHECK(listed->serial == "2A");
  CHECK(revoked->Revoked(*listed));
  auto wide = CertificateIdOfPem(ca.Issue("device-3", 0x10F2));
  REQUIRE(wide.ok());
  CHECK(wide->serial == "10F2");
  CHECK(revoked->Revoked(*wide));
  auto unlisted = CertificateIdOfPem(ca.Issue("device-2", 0x2b));
  REQUIRE(unlisted.ok());
  CHECK_FALSE(revoked->Revoked(*unlisted));
  // The same serial from another CA is another certificate.
  auto same_serial = CertificateIdOfPem(other.Issue("device-9", 0x2a));
  REQUIRE(same_serial.ok());
  CHECK_FALSE(revoked->Revoked(*same_serial));

  // Two CRLs in one file (one per CA) both apply; an empty one revokes nothing.
  const fs::path both = Write(dir, "both.pem", ca.Crl({}) + other.Crl({0x2a}));
  auto two = LoadRevocationLists(both.string(), "tls.crl_file", cas.string(), "tls.client_ca_file");
  REQUIRE(two.ok());
  CHECK(two->crls == 2);
  CHECK(two->certificates == 1);
  CHECK(two->Revoked(*same_serial));
  CHECK_FALSE(two->Revoked(*listed));
}

TEST_CASE("A CRL past its nextUpdate still revokes, and is named as stale", "[tls]") {
  testing::TempDir dir;
  const Ca ca("tophat CA");
  const fs::path cas = Write(dir, "ca.crt", ca.Pem());
  const fs::path crl = Write(dir, "crl.pem", ca.Crl({7}, -kDay));
  auto revoked =
      LoadRevocationLists(crl.string(), "tls.crl_file", cas.string(), "tls.client_ca_file");
  REQUIRE(revoked.ok());
  auto id = CertificateIdOfPem(ca.Issue("device-1", 7));
  REQUIRE(id.ok());
  CHECK(revoked->Revoked(*id));
  REQUIRE(revoked->stale_issuers.size() == 1);
  CHECK(revoked->stale_issuers.begin()->first == "CN=tophat CA");
  CHECK(revoked->stale_issuers.begin()->second == *revoked->next_update_s);
}

TEST_CASE("CRL files that must not be trusted or cannot be read are refused, naming the key",
          "[tls]") {
  testing::TempDir dir;
  const Ca ca("tophat CA");
  const fs::path cas = Write(dir, "ca.crt", ca.Pem());
  const auto load = [&](const fs::path& crl) {
    return LoadRevocationLists(crl.string(), "tls.crl_file", cas.string(), "tls.client_ca_file");
  };

  SECTION("signed by another key under the CA's name") {
    const Ca impostor("tophat CA");
    auto loaded = load(Write(dir, "forged.pem", ca.Crl({1}, 7 * kDay, impostor.key.get())));
    REQUIRE_FALSE(loaded.ok());
    CHECK_THAT(std::string(loaded.status().message()),
               Catch::Contains("tls.crl_file: ") &&
                   Catch::Contains("CRL 1 names \"CN=tophat CA\" as its issuer but is not signed "
                                   "by that CA's key (tls.client_ca_file: "));
  }
  SECTION("from a CA the cloud does not trust") {
    const Ca stranger("stranger CA");
    auto loaded = load(Write(dir, "stranger.pem", ca.Crl({}) + stranger.Crl({1})));
    REQUIRE_FALSE(loaded.ok());
    CHECK_THAT(std::string(loaded.status().message()),
               Catch::Contains("CRL 2 is issued by \"CN=stranger CA\", which is not a CA of "
                               "tls.client_ca_file"));
  }
  SECTION("no CRL in it") {
    auto loaded = load(Write(dir, "ca-copy.pem", ca.Pem()));
    REQUIRE_FALSE(loaded.ok());
    CHECK_THAT(std::string(loaded.status().message()),
               Catch::Contains("holds no CRL (PEM \"X509 CRL\" block"));
  }
  SECTION("a damaged second CRL") {
    std::string damaged = ca.Crl({});
    std::string second = ca.Crl({5});
    second[second.size() / 2] = second[second.size() / 2] == 'A' ? 'B' : 'A';
    second.insert(second.size() / 2, "!!");
    auto loaded = load(Write(dir, "damaged.pem", damaged + second));
    REQUIRE_FALSE(loaded.ok());
    CHECK_THAT(std::string(loaded.status().message()), Catch::Contains("CRL 2 cannot be read"));
  }
  SECTION("missing") {
    auto loaded = load(dir.path() / "nowhere.pem");
    REQUIRE_FALSE(loaded.ok());
    CHECK(loaded.status().code() == absl::StatusCode::kNotFound);
    CHECK_THAT(std::string(loaded.status().message()),
               Catch::StartsWith("tls.crl_file: cannot read ") && Catch::Contains("nowhere.pem"));
  }
}

TEST_CASE("A certificate's id is read from PEM, and junk is refused", "[tls]") {
  CHECK_FALSE(CertificateIdOfPem("-----BEGIN CERTIFICATE-----\nnot base64\n").ok());
  CHECK_FALSE(CertificateIdOfPem("").ok());
}

TEST_CASE("The CRL gauges say what the CRLs last read revoke, and 0 without any", "[tls]") {
  prometheus::Registry registry;
  RevocationListMetrics metrics(registry, "cloud_tls.crl_file");
  const auto gauge = [&](const std::string& name) {
    for (const prometheus::MetricFamily& family : registry.Collect()) {
      if (family.name != name) continue;
      CHECK_THAT(family.help, Catch::Contains("cloud_tls.crl_file"));
      return family.metric.at(0).gauge.value;
    }
    return -1.0;
  };
  CHECK(gauge("tophat_crl_revoked_certificates") == 0);
  CHECK(gauge("tophat_crl_next_update_timestamp_seconds") == 0);
  RevokedCertificates revoked;
  revoked.crls = 2;
  revoked.certificates = 3;
  revoked.next_update_s = 1'800'000'000;
  metrics.Report(&revoked);
  CHECK(gauge("tophat_crl_revoked_certificates") == 3);
  CHECK(gauge("tophat_crl_next_update_timestamp_seconds") == 1'800'000'000);
  revoked.next_update_s.reset();  // a CRL without nextUpdate: none due
  metrics.Report(&revoked);
  CHECK(gauge("tophat_crl_next_update_timestamp_seconds") == 0);
  metrics.Report(nullptr);
  CHECK(gauge("tophat_crl_revoked_certificates") == 0);
}

}  // namespace
}  // namespace tophat
