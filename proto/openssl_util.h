// What the TLS helpers of this folder share over OpenSSL's C API: owning pointers, files
// opened as BIOs, and ASN.1 times as seconds since 1970. Internal to tophat_tls.
#pragma once

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/x509.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace tophat::openssl {

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* certificate) const { X509_free(certificate); }
};
struct CrlFree {
  void operator()(X509_CRL* crl) const { X509_CRL_free(crl); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using CrlPtr = std::unique_ptr<X509_CRL, CrlFree>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// `path` opened for reading; null when it cannot be.
inline BioPtr OpenFile(const std::string& path) { return BioPtr(BIO_new_file(path.c_str(), "r")); }

// What a memory BIO holds, as text; the BIO is freed (a PEM written into it, read out).
std::string TakeMemoryBio(BIO* bio);

// Seconds since 1970 of an ASN.1 time (OpenSSL's own arithmetic: no time zone involved).
std::optional<int64_t> UnixSeconds(const ASN1_TIME* time);

// "2026-12-04 22:00:51 UTC".
std::string Utc(int64_t unix_seconds);

// A distinguished name as RFC 2253 writes it ("CN=tophat CA,O=Example").
std::string NameText(const X509_NAME* name);

}  // namespace tophat::openssl
