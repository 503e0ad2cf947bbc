// For tests of "no allocation in the step" (STYLE.md) on the CPU: counts the tensor storages
// LibTorch allocates while installed: every at::empty, every op's result, every temporary an
// op makes through c10's CPU allocator. Shared by the submodel's step-buffer tests and the
// engine's.
#pragma once

#include <atomic>
#include <cstdint>

#include <c10/core/CPUAllocator.h>

namespace tophat::testing {

// Installed with a higher priority than LibTorch's default (c10::SetCPUAllocator), and never
// uninstalled (storages it handed out are freed through their own deleters, so it only
// forwards).
class CountingCpuAllocator final : public c10::Allocator {
 public:
  static CountingCpuAllocator& Installed() {
    static CountingCpuAllocator* const counting = [] {
      auto* allocator = new CountingCpuAllocator(c10::GetCPUAllocator());
      c10::SetCPUAllocator(allocator, /*priority=*/100);
      return allocator;
    }();
    return *counting;
  }
  int64_t count() const { return count_.load(); }

  c10::DataPtr allocate(size_t bytes) override {
    if (bytes > 0) count_.fetch_add(1);
    return base_->allocate(bytes);
  }
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }

 private:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}
  c10::Allocator* base_;
  std::atomic<int64_t> count_{0};
};

// Storages allocated while `step` runs (on any thread).
template <typename Step>
int64_t AllocationsDuring(Step&& step) {
  CountingCpuAllocator& counting = CountingCpuAllocator::Installed();
  const int64_t before = counting.count();
  step();
  return counting.count() - before;
}

}  // namespace tophat::testing
