// A deadline for an HTTP client to send its whole request, for cpp-httplib servers.
//
// httplib's read timeout is per read: a client that sends a byte a second (a slow-loris)
// never trips it and holds one of the server's workers for as long as it likes; a few such
// clients take them all. httplib gives no hook on the connection before a handler runs, so
// this watches the server's connections from outside: every `check_every` it lists the
// process's sockets whose local port is the server's (Linux, /proc/self/fd), and shuts the
// reading side of any that has been waiting for its request (headers and body) longer than `deadline`. The
// handlers say when a request is in (RequestRead) and the server's logger when its response
// is out (ResponseDone), from which the next request's deadline runs. A connection being
// answered, a stream included, is never touched.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace tophat {

class HttpRequestDeadline {
 public:
  using Clock = std::chrono::steady_clock;

  // `name` prefixes the log line of a closed connection.
  HttpRequestDeadline(std::string name, Clock::duration deadline, Clock::duration check_every);
  ~HttpRequestDeadline();  // stops watching

  // Starts watching the connections of the server listening on `port` (once it listens; the
  // handlers may call the methods below before).
  void Watch(int port);
  HttpRequestDeadline(const HttpRequestDeadline&) = delete;
  HttpRequestDeadline& operator=(const HttpRequestDeadline&) = delete;

  // The request from this peer (httplib::Request's remote_addr and remote_port) is read: its
  // connection is being answered. Call first thing in every handler.
  void RequestRead(const std::string& remote_addr, int remote_port);
  // Its response is written: the deadline for the connection's next request starts now.
  void ResponseDone(const std::string& remote_addr, int remote_port);
  // The connection is to be closed once its current answer is written (a refusal whose
  // request body was not read: what follows on the connection is not a request).
  void CloseAfterAnswer(const std::string& remote_addr, int remote_port);

  // Connections closed for taking too long, since the start.
  int64_t closed() const;

 private:
  struct Connection {
    bool answering = false;
    // When `answering` last changed: while false, since when its next request is awaited.
    Clock::time_point since;
    bool close_after_answer = false;
  };
  void WatchLoop();

  const std::string name_;
  int port_ = 0;
  const Clock::duration deadline_;
  const Clock::duration check_every_;
  mutable std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::map<std::string, Connection> connections_;  // by peer, "addr:port"
  int64_t closed_ = 0;
  Clock::time_point last_logged_{};
  int64_t unlogged_ = 0;
  std::thread thread_;
};

}  // namespace tophat
