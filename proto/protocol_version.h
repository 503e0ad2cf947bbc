// The version of the agent-cloud protocol (tophat/v1/cloud.proto) this build speaks. Bump it
// when a change makes one side misread the other; the cloud announces it in Hello and an
// agent of another version refuses that cloud, naming both.
#pragma once

#include <cstdint>

namespace tophat {

// 2: hidden states travel in any DType both ways (int8 per position added), results in the
// session's OpenSession.result_dtype.
inline constexpr uint32_t kCloudProtocolVersion = 2;

}  // namespace tophat
