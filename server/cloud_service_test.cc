#include "server/cloud_service.h"

#include <catch2/catch.hpp>
#include <string>

#include "proto/channel_security.h"

namespace tophat {
namespace {

PresentedCredentials Presented(const std::string& certified, const std::string& token) {
  PresentedCredentials presented{.certified = certified};
  if (!token.empty()) presented.token_digest = Sha256Hex(token);
  return presented;
}

TEST_CASE(
    "A stream is admitted as its certificate's or its token's device, and a revoked "
    "device is refused whatever it presents",
    "[tls]") {
  DeviceAccess access;
  // Without tokens: the certificate names the device; plaintext is anonymous.
  CHECK(*AdmitDevice(access, Presented("device-1", "")) == "device-1");
  CHECK(*AdmitDevice(access, Presented("", "")) == "");

  access.device_tokens = {{"device-1", Sha256Hex("secret-1")}, {"device-2", Sha256Hex("secret-2")}};
  CHECK(*AdmitDevice(access, Presented("device-1", "secret-1")) == "device-1");
  CHECK(*AdmitDevice(access, Presented("", "secret-2")) == "device-2");  // TLS ended in front
  const auto refused = [&](const PresentedCredentials& presented, absl::StatusCode code,
                           const std::string& message) {
    auto admitted = AdmitDevice(access, presented);
    INFO(admitted.status().ToString());
    REQUIRE_FALSE(admitted.ok());
    CHECK(admitted.status().code() == code);
    CHECK_THAT(std::string(admitted.status().message()), Catch::Contains(message));
  };
  refused(Presented("device-1", ""), absl::StatusCode::kUnauthenticated, "no bearer token");
  refused(Presented("device-1", "secret-3"), absl::StatusCode::kUnauthenticated,
          "not one configured");
  refused(Presented("device-1", "secret-2"), absl::StatusCode::kUnauthenticated,
          "device-2's, the certificate device-1's");

  // Revoked: by a certificate's name, and by a token's name where the token alone names it.
  access.revoked_devices = {"device-2"};
  CHECK(*AdmitDevice(access, Presented("device-1", "secret-1")) == "device-1");
  refused(Presented("device-2", "secret-2"), absl::StatusCode::kPermissionDenied,
          "device device-2 is revoked (tls.revoked_devices)");
  refused(Presented("", "secret-2"), absl::StatusCode::kPermissionDenied, "device-2 is revoked");
  access.device_tokens.clear();
  refused(Presented("device-2", ""), absl::StatusCode::kPermissionDenied, "device-2 is revoked");
  CHECK(*AdmitDevice(access, Presented("", "")) == "");
}

TEST_CASE(
    "A reload ends the open streams its rules no longer admit, and a stream admitted "
    "by the rules before a reload is checked again as it registers",
    "[tls]") {
  const auto tokens = [](const std::string& secret_1) {
    return std::vector<BearerToken>{{"device-1", Sha256Hex(secret_1)},
                                    {"device-2", Sha256Hex("secret-2")}};
  };
  OpenStreams open(DeviceAccess{.device_tokens = tokens("secret-1")});
  std::vector<std::pair<StreamId, grpc::StatusCode>> ended;
  const auto end_of = [&](StreamId id) {
    return [&ended, id](grpc::Status status) { ended.push_back({id, status.error_code()}); };
  };
  for (StreamId id : {1, 2}) {
    const PresentedCredentials presented =
        Presented("device-" + std::to_string(id), id == 1 ? "secret-1" : "secret-2");
    OpenStreams::Admission admission = open.Admit(presented);
    REQUIRE(admission.device.ok());
    REQUIRE(open.Register(id, presented, *admission.device, admission.generation, end_of(id)).ok());
  }
  CHECK(open.size() == 2);

  // device-1's token rotated: its stream (the old token) ends, device-2's stays.
  std::vector<OpenStreams::Ending> ending =
      open.Replace(DeviceAccess{.device_tokens = tokens("secret-1b")});
  REQUIRE(ending.size() == 1);
  CHECK(ending[0].id == 1);
  CHECK(ending[0].status.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  ending[0].end(ending[0].status);
  CHECK(ended ==
        std::vector<std::pair<StreamId, grpc::StatusCode>>{{1, grpc::StatusCode::UNAUTHENTICATED}});
  CHECK(open.size() == 1);
  open.Unregister(1);  // its call's OnDone: nothing left to forget
  CHECK(open.size() == 1);

  // A stream admitted under the rules before a reload that revokes its device is refused as
  // it registers, and not added.
  const PresentedCredentials late = Presented("device-2", "secret-2");
  OpenStreams::Admission admission = open.Admit(late);
  REQUIRE(admission.device.ok());
  ending = open.Replace(
      DeviceAccess{.device_tokens = tokens("secret-1b"), .revoked_devices = {"device-2"}});
  REQUIRE(ending.size() == 1);  // device-2's open stream
  CHECK(ending[0].status.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  const absl::Status registered =
      open.Register(3, late, *admission.device, admission.generation, end_of(3));
  CHECK(absl::IsPermissionDenied(registered));
  CHECK(open.size() == 0);
  // Admitted and registered under the same rules: no second look needed, and added.
  const PresentedCredentials fresh = Presented("device-1", "secret-1b");
  admission = open.Admit(fresh);
  REQUIRE(admission.device.ok());
  CHECK(open.Register(4, fresh, *admission.device, admission.generation, end_of(4)).ok());
  CHECK(open.size() == 1);
}

TEST_CASE(
    "A certificate a CRL revokes is refused whatever it names, and a reload with a new CRL "
    "ends its open stream",
    "[tls]") {
  const CertificateId device_1{.issuer = "CN=tophat CA", .serial = "2A"};
  const CertificateId device_2{.issuer = "CN=tophat CA", .serial = "2B"};
  const auto with_certificate = [](const std::string& name, const CertificateId& certificate) {
    PresentedCredentials presented = Presented(name, "");
    presented.certificate = certificate;
    return presented;
  };
  const auto crl_of = [](const std::string& issuer, const std::string& serial) {
    auto revoked = std::make_shared<RevokedCertificates>();
    revoked->serials_by_issuer[issuer].insert(serial);
    revoked->crls = 1;
    revoked->certificates = 1;
    return std::shared_ptr<const RevokedCertificates>(std::move(revoked));
  };
  DeviceAccess access{.revoked_certificates = crl_of("CN=tophat CA", "2A")};
  auto refused = AdmitDevice(access, with_certificate("device-1", device_1));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(refused.status().message() ==
        "the certificate of device device-1 (serial 2A, issued by CN=tophat CA) is revoked "
        "(tls.crl_file)");
  CHECK(*AdmitDevice(access, with_certificate("device-2", device_2)) == "device-2");
  // The same serial from another issuer is another certificate.
  CHECK(AdmitDevice(access, with_certificate("device-9", {.issuer = "CN=other CA", .serial = "2A"}))
            .ok());

  OpenStreams open(DeviceAccess{});
  std::vector<StreamId> ended;
  for (StreamId id : {1, 2}) {
    const PresentedCredentials presented =
        with_certificate("device-" + std::to_string(id), id == 1 ? device_1 : device_2);
    OpenStreams::Admission admission = open.Admit(presented);
    REQUIRE(admission.device.ok());
    REQUIRE(open.Register(id, presented, *admission.device, admission.generation,
                          [&ended, id](grpc::Status) { ended.push_back(id); })
                .ok());
  }
  std::vector<OpenStreams::Ending> ending =
      open.Replace(DeviceAccess{.revoked_certificates = crl_of("CN=tophat CA", "2B")});
  REQUIRE(ending.size() == 1);
  CHECK(ending[0].id == 2);
  CHECK(ending[0].status.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  CHECK_THAT(ending[0].status.error_message(), Catch::Contains("serial 2B"));
  CHECK(open.size() == 1);
}

TEST_CASE("A device pacer's rates change for the devices connected, and 0 turns pacing off",
          "[pacing]") {
  const auto none = TokenBucket::Clock::duration::zero();
  DevicePacer pacer(/*per_second=*/0, /*refusals_per_second=*/20);
  pacer.Register("device a");
  // No message limit: nothing waits, refusals neither (they are paced only with messages).
  for (int i = 0; i < 1000; ++i) REQUIRE(pacer.Take("device a") == none);
  for (int i = 0; i < 100; ++i) REQUIRE(pacer.TakeRefusal("device a") == none);
  // A reload sets 2 a second: the connected device gets a burst of 2, then waits (half a
  // second a message: only a stall that long between two calls here could let a third by).
  pacer.SetRates(2, 1);
  int immediate = 0;
  while (pacer.Take("device a") == none && immediate < 1000) ++immediate;
  CHECK(immediate == 2);
  CHECK(pacer.TakeRefusal("device a") == none);
  CHECK(pacer.TakeRefusal("device a") > none);
  // A device connecting later gets the new rate too.
  pacer.Register("device b");
  immediate = 0;
  while (pacer.Take("device b") == none && immediate < 1000) ++immediate;
  CHECK(immediate == 2);
  // Off again.
  pacer.SetRates(0, 2);
  CHECK(pacer.Take("device a") == none);
  CHECK(pacer.TakeRefusal("device a") == none);
}

}  // namespace
}  // namespace tophat
