#include "base/service_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace tophat {
namespace {

TEST_CASE("ServiceNotify sends its state to $NOTIFY_SOCKET, and nothing without it",
          "[service_notify]") {
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("tophat_notify_" + std::to_string(::getpid()) + ".sock")).string();
  ::unlink(path.c_str());
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0);

  ::unsetenv("NOTIFY_SOCKET");
  CHECK_FALSE(ServiceNotify("READY=1"));
  ::setenv("NOTIFY_SOCKET", path.c_str(), 1);
  CHECK(ServiceNotify("READY=1\nSTATUS=serving"));
  char buffer[256] = {};
  const ssize_t got = ::recv(fd, buffer, sizeof(buffer) - 1, MSG_DONTWAIT);
  REQUIRE(got > 0);
  CHECK(std::string(buffer, static_cast<size_t>(got)) == "READY=1\nSTATUS=serving");
  ::unsetenv("NOTIFY_SOCKET");
  ::close(fd);
  ::unlink(path.c_str());
}

TEST_CASE("The watchdog interval is systemd's, for this process only", "[service_notify]") {
  ::unsetenv("WATCHDOG_USEC");
  ::unsetenv("WATCHDOG_PID");
  CHECK_FALSE(ServiceWatchdogInterval().has_value());
  ::setenv("WATCHDOG_USEC", "30000000", 1);
  REQUIRE(ServiceWatchdogInterval().has_value());
  CHECK(ServiceWatchdogInterval()->count() == 30000000);
  ::setenv("WATCHDOG_PID", std::to_string(::getpid()).c_str(), 1);
  CHECK(ServiceWatchdogInterval().has_value());
  ::setenv("WATCHDOG_PID", "1", 1);  // another process's watchdog
  CHECK_FALSE(ServiceWatchdogInterval().has_value());
  ::unsetenv("WATCHDOG_PID");
  ::setenv("WATCHDOG_USEC", "soon", 1);
  CHECK_FALSE(ServiceWatchdogInterval().has_value());
  ::unsetenv("WATCHDOG_USEC");
}

}  // namespace
}  // namespace tophat
