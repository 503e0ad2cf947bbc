// absl::Status -> grpc::Status for the services' handlers: the codes are the same numbers
// (both follow google.rpc.Code), and the message is kept.
#pragma once

#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace tophat {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace tophat
