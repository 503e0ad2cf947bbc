#include "models/runtime/device_watch.h"

#include <atomic>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace tophat {
namespace {

TEST_CASE("A CPU is never lost, and nothing is asked of it") {
  DeviceWatch watch(c10::Device("cpu"), "the test's");
  bool found = true;
  CHECK(watch.CheckAfterFailure(&found).ok());
  CHECK_FALSE(found);
  CHECK(watch.lost().ok());
}

TEST_CASE("A drill is found lost at the next failure without asking the device, once") {
  int asked = 0;
  DeviceWatch watch(c10::Device("cuda:0"), "the test's", [&] {
    ++asked;
    return absl::OkStatus();
  });
  CHECK(watch.CheckAfterFailure().ok());
  CHECK(asked == 1);
  watch.StartDrill("the test's device (cuda:0) is lost: a failover drill");
  CHECK(watch.lost().ok());  // not before a failure asks
  bool found = false;
  const absl::Status lost = watch.CheckAfterFailure(&found);
  CHECK(found);
  CHECK(lost.code() == absl::StatusCode::kUnavailable);
  CHECK(lost.message() == "the test's device (cuda:0) is lost: a failover drill");
  CHECK(asked == 1);
  CHECK_FALSE(watch.CheckAfterFailure(&found).ok());
  CHECK_FALSE(found);
  // A CPU, which has no check, is lost to a drill too.
  DeviceWatch cpu(c10::Device("cpu"), "the test's");
  cpu.StartDrill("drill");
  CHECK(cpu.CheckAfterFailure().code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("A device is asked after each failure until it is found lost, then never again, and "
          "the loss is UNAVAILABLE whatever the check said") {
  int asked = 0;
  DeviceWatch watch(c10::Device("cuda:0"), "the test's", [&] {
    ++asked;
    return asked < 3 ? absl::OkStatus()
                     : absl::InternalError("the test's GPU (cuda:0) is lost: cudaErrorAssert");
  });
  bool found = true;
  CHECK(watch.CheckAfterFailure(&found).ok());  // a failure of its own: the device computes
  CHECK_FALSE(found);
  CHECK(watch.CheckAfterFailure().ok());
  absl::Status lost = watch.CheckAfterFailure(&found);
  CHECK(found);
  CHECK(lost.code() == absl::StatusCode::kUnavailable);
  CHECK(lost.message() == "the test's GPU (cuda:0) is lost: cudaErrorAssert");
  CHECK(watch.CheckAfterFailure(&found).code() == absl::StatusCode::kUnavailable);
  CHECK_FALSE(found);
  CHECK(asked == 3);
  CHECK(watch.lost().code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("Of many threads failing at once on a lost device, exactly one finds the loss") {
  std::atomic<int> asked{0};
  DeviceWatch watch(c10::Device("cuda:0"), "the test's", [&] {
    asked.fetch_add(1);
    return absl::UnavailableError("lost");
  });
  std::atomic<int> found_by{0};
  std::atomic<int> told_ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    // Counted here and checked on the test's thread: Catch's assertions are not thread-safe
    // (ThreadSanitizer saw its counters race).
    threads.emplace_back([&] {
      bool found = false;
      if (watch.CheckAfterFailure(&found).ok()) told_ok.fetch_add(1);
      if (found) found_by.fetch_add(1);
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(told_ok.load() == 0);
  CHECK(found_by.load() == 1);
  CHECK(asked.load() == 1);
}

}  // namespace
}  // namespace tophat
