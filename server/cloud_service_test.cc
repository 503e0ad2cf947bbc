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

}  // namespace
}  // namespace tophat
