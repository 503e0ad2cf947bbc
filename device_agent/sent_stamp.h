// Where the agent's connection writes when a message it held for the uplink pacer
// (scheduler/uplink_pacer.h) actually went onto the link (steady_clock ticks since its epoch;
// 0 until then): a prompt chunk's link samples and trace start there, not when the request
// handed it over.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace tophat {

using SentStamp = std::shared_ptr<std::atomic<int64_t>>;

}  // namespace tophat
