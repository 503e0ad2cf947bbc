#include "telemetry/http_request_deadline.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <httplib.h>

#include "telemetry/http_listener.h"

#include <catch2/catch.hpp>

namespace tophat {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A connected TCP socket to 127.0.0.1:`port`, closed with the object.
class RawConnection {
 public:
  explicit RawConnection(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    REQUIRE(fd_ >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  }
  ~RawConnection() { close(fd_); }
  // False once the server has closed its side (a send then fails).
  bool Send(const std::string& bytes) {
    return send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // Whether the server has closed the connection: the stream's end (or a reset) is readable.
  bool ClosedByServer() {
    pollfd ready{.fd = fd_, .events = POLLIN};
    if (poll(&ready, 1, 0) <= 0) return false;
    char byte;
    const ssize_t got = recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return got <= 0;
  }
  // Everything the server sends until it closes or `timeout` passes.
  std::string ReadAll(std::chrono::milliseconds timeout) {
    std::string all;
    const auto until = Clock::now() + timeout;
    while (Clock::now() < until) {
      pollfd ready{.fd = fd_, .events = POLLIN};
      if (poll(&ready, 1, 50) <= 0) continue;
      char buffer[4096];
      const ssize_t got = recv(fd_, buffer, sizeof(buffer), 0);
      if (got <= 0) break;
      all.append(buffer, static_cast<size_t>(got));
    }
    return all;
  }

 private:
  int fd_;
};

bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  while (Clock::now() < until) {
    if (condition()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return condition();
}

// An httplib server with httplib's own timeouts far above the deadline, so that only the
// deadline can close a connection in these tests.
struct Server {
  explicit Server(Clock::duration deadline)
      : watch(std::make_unique<HttpRequestDeadline>("test", deadline, 50ms)) {
    http.set_read_timeout(60, 0);
    http.set_keep_alive_timeout(60);
    http.Get("/hello", [this](const httplib::Request& req, httplib::Response& res) {
      watch->RequestRead(req.remote_addr, req.remote_port);
      res.set_content("hello", "text/plain");
    });
    // Streams 10 pieces 100 ms apart: an answer that outlasts the deadline.
    http.Get("/stream", [this](const httplib::Request& req, httplib::Response& res) {
      watch->RequestRead(req.remote_addr, req.remote_port);
      res.set_chunked_content_provider("text/plain", [](size_t offset, httplib::DataSink& sink) {
        if (offset >= 10) {
          sink.done();
          return true;
        }
        std::this_thread::sleep_for(100ms);
        sink.write("x", 1);
        return true;
      });
    });
    http.set_logger([this](const httplib::Request& req, const httplib::Response&) {
      watch->ResponseDone(req.remote_addr, req.remote_port);
    });
    auto listening = ListenOnThread(http, "127.0.0.1:0", thread);
    REQUIRE(listening.ok());
    port = *listening;
    watch->Watch(port);
  }
  ~Server() {
    http.stop();
    thread.join();
  }
  std::unique_ptr<HttpRequestDeadline> watch;
  httplib::Server http;
  std::thread thread;
  int port = 0;
};

TEST_CASE("A client that sends its request a byte at a time is cut off at the deadline",
          "[http]") {
  Server server(500ms);
  RawConnection slow(server.port);
  const auto started = Clock::now();
  REQUIRE(slow.Send("GET /hello HTTP/1.1\r\nHost: x\r\nX-Slow: "));
  // A byte every 50 ms: no read ever waits long, so only a deadline on the whole request
  // can end it. The deadline (500 ms) plus a check period (50 ms) is when it should end;
  // dribbling on for 10 s without being cut off would be the failure.
  bool closed = false;
  while (Clock::now() - started < 10s) {
    if (slow.ClosedByServer() || !slow.Send("a")) {
      closed = true;
      break;
    }
    std::this_thread::sleep_for(50ms);
  }
  const double after_s = std::chrono::duration<double>(Clock::now() - started).count();
  INFO("closed after " << after_s << " s");
  CHECK(closed);
  CHECK(after_s >= 0.5);
  CHECK(server.watch->closed() == 1);
}

TEST_CASE("A connection idle after its answer is cut off at the deadline, and answers are not",
          "[http]") {
  Server server(500ms);
  RawConnection connection(server.port);
  const auto started = Clock::now();
  // A streamed answer of ~1 s, twice the deadline, arrives whole.
  REQUIRE(connection.Send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string received;
  REQUIRE(WaitFor(
      [&] {
        received += connection.ReadAll(50ms);
        return received.find("\r\n0\r\n\r\n") != std::string::npos;
      },
      10s));
  CHECK(std::chrono::duration<double>(Clock::now() - started).count() >= 1.0);
  CHECK(server.watch->closed() == 0);
  // Kept alive with nothing more asked: closed once the deadline passes from the answer.
  CHECK(WaitFor([&] { return connection.ClosedByServer(); }, 10s));
  CHECK(server.watch->closed() == 1);
  // The server still answers a client that sends its request at once.
  httplib::Client client("127.0.0.1", server.port);
  auto answer = client.Get("/hello");
  REQUIRE(answer);
  CHECK(answer->status == 200);
  CHECK(answer->body == "hello");
}

}  // namespace
}  // namespace tophat
