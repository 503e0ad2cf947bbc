#include "proto/certificate_revocation.h"

#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/openssl_util.h"

namespace tophat {
namespace {

using openssl::BioPtr;
using openssl::CrlPtr;
using openssl::NameText;
using openssl::UnixSeconds;
using openssl::X509Ptr;

struct BignumFree {
  void operator()(BIGNUM* number) const { BN_free(number); }
};

// Upper-case hex without leading zeros, "0" for zero (as `openssl x509 -serial` and
// `openssl crl -text` print serials, less their leading zero byte).
std::string SerialHex(const ASN1_INTEGER* serial) {
  std::unique_ptr<BIGNUM, BignumFree> number(ASN1_INTEGER_to_BN(serial, nullptr));
  if (number == nullptr) return "";
  char* hex = BN_bn2hex(number.get());
  if (hex == nullptr) return "";
  std::string text(hex);
  OPENSSL_free(hex);
  const size_t first = text.find_first_not_of('0');
  return first == std::string::npos ? "0" : text.substr(first);
}

CertificateId IdOf(const X509* certificate) {
  return {.issuer = NameText(X509_get_issuer_name(certificate)),
          .serial = SerialHex(X509_get0_serialNumber(certificate))};
}

// OpenSSL's last error, for a message; and the queue cleared (a later read must not find it).
std::string TakeOpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no detail from OpenSSL";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

}  // namespace

absl::StatusOr<CertificateId> CertificateIdOfPem(absl::string_view pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return absl::ResourceExhaustedError("cannot allocate a BIO");
  X509Ptr certificate(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (certificate == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("no PEM certificate OpenSSL can read: ", TakeOpenSslError()));
  }
  return IdOf(certificate.get());
}

std::optional<CertificateId> PeerCertificateId(const grpc::AuthContext& context) {
  if (!context.IsPeerAuthenticated()) return std::nullopt;
  for (const grpc::string_ref& pem : context.FindPropertyValues("x509_pem_cert")) {
    auto id = CertificateIdOfPem(absl::string_view(pem.data(), pem.size()));
    if (id.ok()) return *std::move(id);
  }
  return std::nullopt;
}

bool RevokedCertificates::Revoked(const CertificateId& certificate) const {
  const auto issuer = serials_by_issuer.find(certificate.issuer);
  return issuer != serials_by_issuer.end() && issuer->second.contains(certificate.serial);
}

absl::StatusOr<RevokedCertificates> LoadRevocationLists(const std::string& crl_file,
                                                        absl::string_view crl_key,
                                                        const std::string& ca_file,
                                                        absl::string_view ca_key) {
  // The CAs a CRL may come from.
  BioPtr cas_in = openssl::OpenFile(ca_file);
  if (cas_in == nullptr) {
    return absl::NotFoundError(absl::StrCat(ca_key, ": cannot read ", ca_file,
                                            " (the CA whose CRLs ", crl_key, " holds)"));
  }
  std::vector<X509Ptr> cas;
  while (X509Ptr ca{PEM_read_bio_X509(cas_in.get(), nullptr, nullptr, nullptr)}) {
    cas.push_back(std::move(ca));
  }
  ERR_clear_error();  // the read past the last certificate
  if (cas.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ca_key, ": ", ca_file, " holds no certificate (PEM \"CERTIFICATE\" block)"));
  }

  BioPtr crls_in = openssl::OpenFile(crl_file);
  if (crls_in == nullptr) {
    return absl::NotFoundError(absl::StrCat(crl_key, ": cannot read ", crl_file));
  }
  RevokedCertificates revoked;
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  while (CrlPtr crl{PEM_read_bio_X509_CRL(crls_in.get(), nullptr, nullptr, nullptr)}) {
    const int nth = ++revoked.crls;
    const std::string issuer = NameText(X509_CRL_get_issuer(crl.get()));
    const auto ca = std::find_if(cas.begin(), cas.end(), [&](const X509Ptr& candidate) {
      return X509_NAME_cmp(X509_get_subject_name(candidate.get()),
                           X509_CRL_get_issuer(crl.get())) == 0;
    });
    if (ca == cas.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(crl_key, ": ", crl_file, ": CRL ", nth, " is issued by \"", issuer,
                       "\", which is not a CA of ", ca_key, " (", ca_file,
                       "): it could revoke nothing the cloud accepts"));
    }
    EVP_PKEY* ca_key_material = X509_get0_pubkey(ca->get());
    if (ca_key_material == nullptr || X509_CRL_verify(crl.get(), ca_key_material) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(crl_key, ": ", crl_file, ": CRL ", nth, " names \"", issuer,
                       "\" as its issuer but is not signed by that CA's key (", ca_key, ": ",
                       ca_file, "): ", TakeOpenSslError()));
    }
    std::unordered_set<std::string>& serials = revoked.serials_by_issuer[issuer];
    const STACK_OF(X509_REVOKED)* entries = X509_CRL_get_REVOKED(crl.get());
    for (int i = 0; i < sk_X509_REVOKED_num(entries); ++i) {
      const X509_REVOKED* entry = sk_X509_REVOKED_value(entries, i);
      if (serials.insert(SerialHex(X509_REVOKED_get0_serialNumber(entry))).second) {
        ++revoked.certificates;
      }
    }
    if (const ASN1_TIME* next = X509_CRL_get0_nextUpdate(crl.get()); next != nullptr) {
      const std::optional<int64_t> due = UnixSeconds(next);
      if (!due) {
        return absl::InvalidArgumentError(absl::StrCat(crl_key, ": ", crl_file, ": CRL ", nth,
                                                       " (\"", issuer,
                                                       "\") has a nextUpdate OpenSSL cannot read"));
      }
      revoked.next_update_s = revoked.next_update_s ? std::min(*revoked.next_update_s, *due) : *due;
      if (*due <= now) revoked.stale_issuers[issuer] = *due;
    }
  }
  // The read past the last CRL fails for want of a start line; any other failure is a block
  // that does not parse, which must not pass for the end of the file (what follows it would
  // be dropped without a word).
  if (const unsigned long error = ERR_peek_last_error();
      error != 0 &&
      !(ERR_GET_LIB(error) == ERR_LIB_PEM && ERR_GET_REASON(error) == PEM_R_NO_START_LINE)) {
    return absl::InvalidArgumentError(absl::StrCat(crl_key, ": ", crl_file, ": CRL ",
                                                   revoked.crls + 1,
                                                   " cannot be read: ", TakeOpenSslError()));
  }
  ERR_clear_error();
  if (revoked.crls == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        crl_key, ": ", crl_file, " holds no CRL (PEM \"X509 CRL\" block; `openssl crl -in ",
        crl_file, " -text` shows what it holds)"));
  }
  return revoked;
}

void WarnOfStaleRevocationLists(const RevokedCertificates& revoked, absl::string_view key,
                                absl::string_view path, absl::string_view renew) {
  for (const auto& [issuer, due] : revoked.stale_issuers) {
    spdlog::warn(
        "{}: {}: the CRL of \"{}\" was due for renewal at {}: certificates it revoked "
        "since are not in it; {}",
        std::string(key), std::string(path), issuer, openssl::Utc(due), std::string(renew));
  }
}

}  // namespace tophat
