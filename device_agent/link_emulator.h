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

#include "scheduler/wire_bytes.h"

namespace tophat {

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
