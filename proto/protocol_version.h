// The version of the agent-cloud protocol (tophat/v1/cloud.proto) this build speaks. Bump it
// when a change makes one side misread the other; the cloud announces it in Hello and an
// agent of another version refuses that cloud, naming both.
#pragma once

#include <cstdint>

namespace tophat {

inline constexpr uint32_t kCloudProtocolVersion = 1;

}  // namespace tophat
