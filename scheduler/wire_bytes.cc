#include "scheduler/wire_bytes.h"

namespace tophat {

size_t OnWireBytes(size_t message_bytes) {
  constexpr size_t kGrpcPrefix = 5;
  constexpr size_t kFrame = 16384;
  constexpr size_t kPerFrame = 9 + 22;  // HTTP/2 frame header, TLS 1.3 record overhead
  constexpr size_t kSegment = 1448;
  constexpr size_t kPerSegment = 52 + 14;  // TCP/IPv4 with timestamps, Ethernet
  const size_t prefixed = message_bytes + kGrpcPrefix;
  const size_t framed = prefixed + (prefixed + kFrame - 1) / kFrame * kPerFrame;
  return framed + (framed + kSegment - 1) / kSegment * kPerSegment;
}

}  // namespace tophat
