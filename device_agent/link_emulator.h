// An emulated network link for one direction of the cloud stream: messages leave in order,
// each occupying the link for bytes / bandwidth, and arrive one_way_delay later. Used by the
// agent (configs: link_emulation) so that loopback benchmarks see the communication cost of
// a real edge link; the network-namespace shaper of deploy/ is the system-level version.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace tophat {

// The bytes a gRPC message of `message_bytes` (its serialized protobuf) occupies on a TCP
// link: gRPC's 5-byte length prefix; per 16 KiB, an HTTP/2 frame header (9) and a TLS 1.3
// record's overhead (22); per 1,448-byte segment, TCP/IPv4 headers with timestamps (52) and
// Ethernet's (14). A model (small writes in quick succession may share a segment, and a
// plaintext stream has no TLS records), but the part that matters is right: a one-position
// int8 decode message of ~220 bytes occupies ~320, and counting only the hidden states
// (196) made a link look a third slower on small messages than on prompt chunks.
size_t OnWireBytes(size_t message_bytes);

class DelayLine {
 public:
  // bytes_per_second 0 is unlimited bandwidth.
  DelayLine(double one_way_delay_s, double bytes_per_second, std::string thread_name);
  ~DelayLine();  // stops; what has not arrived yet is dropped, as on a link that goes down
  DelayLine(const DelayLine&) = delete;
  DelayLine& operator=(const DelayLine&) = delete;

  // Runs `arrive` on the line's thread when a message occupying `bytes` of the link
  // (OnWireBytes), sent now, would arrive.
  void Push(size_t bytes, std::function<void()> arrive);

 private:
  using Clock = std::chrono::steady_clock;
  struct Item {
    Clock::time_point due;
    std::function<void()> arrive;
  };
  void Run();

  const Clock::duration delay_;
  const double bytes_per_second_;
  const std::string thread_name_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  Clock::time_point link_free_;  // when the last message finishes serialising
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tophat
