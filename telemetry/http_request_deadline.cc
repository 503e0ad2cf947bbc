#include "telemetry/http_request_deadline.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <array>
#include <cstdlib>
#include <set>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tophat {
namespace {

// The port of a socket address, or -1 for another family.
int PortOf(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  }
  return -1;
}

// "addr:port" as httplib spells a request's remote_addr and remote_port (numeric host from
// getnameinfo), so that the two sides name a connection alike.
std::string PeerKey(const std::string& addr, int port) { return absl::StrCat(addr, ":", port); }

struct ServerConnection {
  int fd;
  std::string peer;
};

// The process's accepted TCP connections on local port `port`: sockets bound to it that have
// a peer (the listening socket has none).
std::vector<ServerConnection> ConnectionsOnPort(int port) {
  std::vector<ServerConnection> found;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return found;
  const int own = dirfd(dir);
  while (const dirent* entry = readdir(dir)) {
    int fd = 0;
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == own) continue;
    struct stat info {};
    if (fstat(fd, &info) != 0 || !S_ISSOCK(info.st_mode)) continue;
    sockaddr_storage local{};
    socklen_t local_size = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_size) != 0 ||
        PortOf(local) != port) {
      continue;
    }
    sockaddr_storage remote{};
    socklen_t remote_size = sizeof(remote);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &remote_size) != 0) continue;
    std::array<char, NI_MAXHOST> host{};
    if (getnameinfo(reinterpret_cast<const sockaddr*>(&remote), remote_size, host.data(),
                    static_cast<socklen_t>(host.size()), nullptr, 0, NI_NUMERICHOST) != 0) {
      continue;
    }
    found.push_back({fd, PeerKey(host.data(), PortOf(remote))});
  }
  closedir(dir);
  return found;
}

}  // namespace

HttpRequestDeadline::HttpRequestDeadline(std::string name, Clock::duration deadline,
                                         Clock::duration check_every)
    : name_(std::move(name)), deadline_(deadline), check_every_(check_every) {}

void HttpRequestDeadline::Watch(int port) {
  port_ = port;
  thread_ = std::thread([this] { WatchLoop(); });
}

HttpRequestDeadline::~HttpRequestDeadline() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HttpRequestDeadline::RequestRead(const std::string& remote_addr, int remote_port) {
  std::lock_guard<std::mutex> lock(mutex_);
  connections_[PeerKey(remote_addr, remote_port)] = {.answering = true, .since = Clock::now()};
}

void HttpRequestDeadline::ResponseDone(const std::string& remote_addr, int remote_port) {
  std::lock_guard<std::mutex> lock(mutex_);
  Connection& connection = connections_[PeerKey(remote_addr, remote_port)];
  connection.answering = false;
  connection.since = Clock::now();
}

void HttpRequestDeadline::CloseAfterAnswer(const std::string& remote_addr, int remote_port) {
  std::lock_guard<std::mutex> lock(mutex_);
  connections_[PeerKey(remote_addr, remote_port)].close_after_answer = true;
}

int64_t HttpRequestDeadline::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

void HttpRequestDeadline::WatchLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_cv_.wait_for(lock, check_every_, [this] { return stop_; })) {
    lock.unlock();
    // Listed without the lock: a handler marking its request read must not wait on /proc.
    std::vector<ServerConnection> open = ConnectionsOnPort(port_);
    lock.lock();
    const Clock::time_point now = Clock::now();
    std::set<std::string> seen;
    for (const ServerConnection& socket : open) {
      seen.insert(socket.peer);
      // First seen: its request is awaited from now (at most check_every_ late).
      auto [it, first_seen] = connections_.try_emplace(socket.peer);
      if (first_seen) it->second.since = now;
      Connection& connection = it->second;
      if (connection.answering) continue;
      const bool refused = connection.close_after_answer;
      if (!refused && now - connection.since <= deadline_) continue;
      // The worker reading from it sees the end of the stream and lets the connection go.
      // Only the reading side: what the server still has to say (a 413 for a body it was
      // discarding, a 400) can be written before it closes. The fd was this peer's an
      // instant ago; a close and a reuse of the number by a new connection from the same
      // peer port in between is not a practical concern.
      shutdown(socket.fd, SHUT_RD);
      connections_.erase(it);
      if (refused) continue;
      ++closed_;
      // One line per second at most: a client opening slow connections must not flood the log.
      if (now - last_logged_ >= std::chrono::seconds(1)) {
        spdlog::warn("{}: closed the connection from {}: its request took longer than {} s to "
                     "arrive{}",
                     name_, socket.peer,
                     std::chrono::duration<double>(deadline_).count(),
                     unlogged_ > 0 ? absl::StrCat(" (", unlogged_, " more since)") : "");
        last_logged_ = now;
        unlogged_ = 0;
      } else {
        ++unlogged_;
      }
    }
    // Connections gone: forget them (a handler may have marked one after the listing: those
    // marked within the last period stay until the next).
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (!seen.contains(it->first) && it->second.since < now - check_every_) {
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

}  // namespace tophat
