#include "bench/process_control.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <httplib.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tophat::bench {

ChildProcess::ChildProcess(std::vector<std::string> argv, std::filesystem::path log_path)
    : log_path_(std::move(log_path)) {
  pid_ = fork();
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    // The child must not inherit the test's blocked signals.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    std::vector<char*> args;
    for (std::string& arg : argv) args.push_back(arg.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
}

ChildProcess::~ChildProcess() {
  if (running()) {
    kill(pid_, SIGKILL);
    Wait(std::chrono::milliseconds(5000));
  }
}

bool ChildProcess::running() {
  if (pid_ <= 0 || exit_code_) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return true;
}

void ChildProcess::Signal(int signal) {
  if (running()) kill(pid_, signal);
}

std::optional<int> ChildProcess::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exit_code_;
}

std::string ChildProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

namespace {

// Claims `port` for this process: binds an abstract Unix socket named after it, which the
// kernel frees when the process exits (no file is left behind) and no child inherits. Other
// tophat processes, of any user on this network namespace, skip a claimed port.
bool ClaimPort(int port) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string name = absl::StrCat("tophat-port-", port);
  // A leading NUL byte puts the name in the abstract namespace.
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0) {
    close(fd);
    return false;
  }
  return true;  // the socket stays open: the claim lasts as long as the process
}

bool Bindable(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return bound;
}

}  // namespace

int FreePort() {
  // Not bind(0)'s choice: that comes from the kernel's ephemeral range (32768 and up by
  // default), where every outgoing connection and every other process's bind(0) also take
  // theirs, and a port only checked free is up for grabs until the daemon it is meant for
  // binds it, seconds later: test processes running side by side (CTest -j) could hand out
  // the same port. Ports here lie below the ephemeral range, and each is claimed for the life
  // of the process that asked (ClaimPort), so two tophat processes never hand out the same
  // one.
  constexpr int kFirst = 20000, kLast = 32767;
  static std::mutex mutex;
  static std::mt19937 random(std::random_device{}());
  std::lock_guard<std::mutex> lock(mutex);
  const int start = std::uniform_int_distribution<int>(kFirst, kLast)(random);
  for (int i = 0; i <= kLast - kFirst; ++i) {
    const int port = kFirst + (start - kFirst + i) % (kLast - kFirst + 1);
    if (Bindable(port) && ClaimPort(port)) return port;
  }
  return 0;  // every port in the range taken: no daemon is reachable on port 0, so the
             // caller's wait for its daemon fails
}

absl::StatusOr<std::unique_ptr<ChildProcess>> StartDaemon(const std::filesystem::path& binary,
                                                          const std::string& config_yaml,
                                                          const std::filesystem::path& dir,
                                                          const std::string& name, int port,
                                                          std::chrono::milliseconds timeout) {
  const std::filesystem::path config = dir / (name + ".yaml");
  {
    std::ofstream out(config);
    out << config_yaml;
    if (!out) return absl::UnavailableError(absl::StrCat(config.string(), ": cannot write"));
  }
  auto process = std::make_unique<ChildProcess>(
      std::vector<std::string>{binary.string(), "--config", config.string()},
      dir / (name + ".log"));
  if (!WaitForPort(port, timeout)) {
    return absl::UnavailableError(absl::StrCat(binary.filename().string(), " (", name,
                                               ") did not start:\n", process->Log()));
  }
  return process;
}

bool WaitForPort(int port, std::chrono::milliseconds timeout, const std::string& host) {
  return WaitUntil(
      [&] {
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
          close(fd);
          return false;
        }
        address.sin_port = htons(static_cast<uint16_t>(port));
        const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
        close(fd);
        return ok;
      },
      timeout);
}

std::string HttpGet(int port, const std::string& path, const std::string& host) {
  httplib::Client client(host, port);
  client.set_connection_timeout(2);
  auto response = client.Get(path.c_str());
  if (!response || response->status != 200) return "";
  return response->body;
}

std::optional<double> MetricValue(const std::string& exposition, const std::string& name,
                                  const std::string& labels) {
  std::istringstream lines(exposition);
  std::string line;
  std::optional<double> total;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.compare(0, name.size(), name) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    if (!labels.empty() && line.find(labels) == std::string::npos) continue;
    const size_t space = line.rfind(' ');
    total = total.value_or(0) + std::stod(line.substr(space + 1));
  }
  return total;
}

std::vector<std::pair<double, double>> HistogramBuckets(const std::string& exposition,
                                                        const std::string& name) {
  std::map<double, double> buckets;
  std::istringstream lines(exposition);
  std::string line;
  const std::string prefix = name + "_bucket{";
  while (std::getline(lines, line)) {
    if (line.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t le = line.find("le=\"", prefix.size());
    if (le == std::string::npos) continue;
    const size_t close = line.find('"', le + 4);
    if (close == std::string::npos) continue;
    const std::string bound = line.substr(le + 4, close - le - 4);
    if (bound == "+Inf") continue;
    buckets[std::stod(bound)] += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return {buckets.begin(), buckets.end()};
}

bool WaitUntil(const std::function<bool()>& predicate, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!predicate()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace tophat::bench
