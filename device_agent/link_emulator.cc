#include "device_agent/link_emulator.h"

#include <pthread.h>

#include <algorithm>

namespace tophat {

DelayLine::DelayLine(double one_way_delay_s, double bytes_per_second, std::string thread_name)
    : delay_(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(one_way_delay_s))),
      bytes_per_second_(bytes_per_second),
      thread_name_(std::move(thread_name)),
      link_free_(Clock::now()) {
  thread_ = std::thread([this] { Run(); });
}

DelayLine::~DelayLine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DelayLine::Push(size_t bytes, std::function<void()> arrive) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const Clock::time_point now = Clock::now();
    Clock::time_point departs = std::max(now, link_free_);
    if (bytes_per_second_ > 0) {
      departs += std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(static_cast<double>(bytes) / bytes_per_second_));
    }
    link_free_ = departs;
    items_.push_back({departs + delay_, std::move(arrive)});
  }
  cv_.notify_all();
}

void DelayLine::Run() {
  pthread_setname_np(pthread_self(), thread_name_.substr(0, 15).c_str());
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !items_.empty(); });
    if (stopping_) return;
    const Clock::time_point due = items_.front().due;
    if (cv_.wait_until(lock, due, [&] { return stopping_; })) return;
    // Due times never decrease (FIFO), so the front is still the next to arrive.
    Item item = std::move(items_.front());
    items_.pop_front();
    lock.unlock();
    item.arrive();
    lock.lock();
  }
}

}  // namespace tophat
