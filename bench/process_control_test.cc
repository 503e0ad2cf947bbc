#include "bench/process_control.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <set>
#include <thread>
#include <vector>

namespace tophat::bench {
namespace {

TEST_CASE("Histogram buckets are read from the exposition and summed over label sets",
          "[bench]") {
  const std::string exposition =
      "# HELP h_ratio a histogram\n"
      "# TYPE h_ratio histogram\n"
      "h_ratio_count{stream=\"1\"} 4\n"
      "h_ratio_bucket{stream=\"1\",le=\"0.1\"} 1\n"
      "h_ratio_bucket{stream=\"1\",le=\"0.5\"} 3\n"
      "h_ratio_bucket{stream=\"1\",le=\"+Inf\"} 4\n"
      "h_ratio_bucket{stream=\"2\",le=\"0.1\"} 2\n"
      "h_ratio_bucket{stream=\"2\",le=\"0.5\"} 2\n"
      "h_ratio_bucket{stream=\"2\",le=\"+Inf\"} 5\n"
      "h_ratio_other_bucket{le=\"0.1\"} 9\n";
  const auto buckets = HistogramBuckets(exposition, "h_ratio");
  REQUIRE(buckets.size() == 2);
  CHECK(buckets[0].first == Approx(0.1));
  CHECK(buckets[0].second == 3);
  CHECK(buckets[1].first == Approx(0.5));
  CHECK(buckets[1].second == 5);
  CHECK(HistogramBuckets(exposition, "missing").empty());
}

TEST_CASE("CpuSeconds reads the CPU time a busy child has used", "[bench]") {
  const std::filesystem::path log =
      std::filesystem::temp_directory_path() / ("cpu_seconds_test-" + std::to_string(getpid()));
  ChildProcess busy({"/bin/sh", "-c", "while :; do :; done"}, log);
  REQUIRE(busy.pid() > 0);
  // Waits for the condition, not a time: a spinning shell uses its CPU as it is given it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  double used = 0;
  while ((used = CpuSeconds(busy.pid())) < 0.2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(used >= 0.2);
  CHECK(CpuSeconds(busy.pid()) >= used);  // it only grows
  busy.Signal(SIGKILL);
  busy.Wait(std::chrono::seconds(10));
  CHECK(CpuSeconds(-1) == 0);  // no such process
  std::filesystem::remove(log);
}

TEST_CASE("FreePort never hands out a port another live process holds, and each binds",
          "[bench]") {
  // The parent holds its ports first; a child process then asks for as many while they are
  // held. Nothing listens on the parent's ports, so they all stay bindable: only the claims
  // keep the child off them. 400 of about 12,800 ports each: without the claims the two sets
  // would overlap in all but about 4 runs in a million (exp(-400 * 400 / 12,768)).
  constexpr int kPorts = 400;
  std::set<int> held;
  for (int i = 0; i < kPorts; ++i) held.insert(FreePort());
  REQUIRE(held.size() == kPorts);  // distinct within one process too
  for (const int port : held) {
    INFO("port " << port);
    CHECK(port >= 20000);
    CHECK(port < 32768);  // below the kernel's default ephemeral range
    // Free for the daemon it is meant for: a listener can bind it.
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(listener >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    CHECK(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    close(listener);
  }
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(pipe_fds[0]);
    for (int i = 0; i < kPorts; ++i) {
      const int port = FreePort();
      if (write(pipe_fds[1], &port, sizeof(port)) != sizeof(port)) _exit(1);
    }
    _exit(0);
  }
  close(pipe_fds[1]);
  std::vector<int> theirs;
  int port = 0;
  while (read(pipe_fds[0], &port, sizeof(port)) == sizeof(port)) theirs.push_back(port);
  close(pipe_fds[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  REQUIRE(theirs.size() == kPorts);
  for (const int other : theirs) {
    INFO("the child was given " << other);
    CHECK(held.count(other) == 0);
    CHECK(other > 0);
  }
}

}  // namespace
}  // namespace tophat::bench
