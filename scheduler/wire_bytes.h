// What a message occupies on a link: the agent's link emulator and estimator count it, and
// `tophat simulate` charges its simulated links the same.
#pragma once

#include <cstddef>

namespace tophat {

// The bytes a gRPC message of `message_bytes` (its serialized protobuf) occupies on a TCP
// link: gRPC's 5-byte length prefix; per 16 KiB, an HTTP/2 frame header (9) and a TLS 1.3
// record's overhead (22); per 1,448-byte segment, TCP/IPv4 headers with timestamps (52) and
// Ethernet's (14). A model (small writes in quick succession may share a segment, and a
// plaintext stream has no TLS records), but the part that matters is right: a one-position
// int8 decode message of ~220 bytes occupies ~320, and counting only the hidden states
// (196) made a link look a third slower on small messages than on prompt chunks.
size_t OnWireBytes(size_t message_bytes);

}  // namespace tophat
