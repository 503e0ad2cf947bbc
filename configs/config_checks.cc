#include "configs/config_checks.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/strings.h"

namespace tophat {
namespace {

// Debian builds Abseil with its own string_view type, so std::string_view needs a bridge.
bool ParseDecimal(std::string_view text, int64_t* out) {
  if (text.empty() || !std::all_of(text.begin(), text.end(), absl::ascii_isdigit)) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

absl::Status NotOneOf(std::string_view value, std::string_view choices) {
  return absl::InvalidArgumentError(
      absl::StrCat("expected one of ", Sv(choices), ", got \"", Sv(value), "\""));
}

}  // namespace

bool IsUnixSocketAddress(std::string_view address) {
  return address.substr(0, 5) == "unix:";
}

bool IsLoopbackAddress(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return false;
  const std::string_view host = address.substr(0, colon);
  return host == "localhost" || host == "[::1]" || host.substr(0, 4) == "127.";
}

std::optional<HostPort> SplitHostPort(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  int64_t port = 0;
  if (!ParseDecimal(address.substr(colon + 1), &port) || port > 65535) return std::nullopt;
  std::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return HostPort{.host = std::string(host), .port = static_cast<int>(port)};
}

absl::Status CheckCanListen(std::string_view address, std::string_view key) {
  if (IsUnixSocketAddress(address)) return absl::OkStatus();
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return absl::OkStatus();  // CheckHostPort's to report
  std::string host(address.substr(0, colon));
  const std::string port(address.substr(colon + 1));
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return absl::OkStatus();  // gRPC resolves it its own way and reports what fails
  }
  std::string reason;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const bool bound = bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!bound) reason = std::strerror(errno);
    close(fd);
    if (bound) {
      freeaddrinfo(found);
      return absl::OkStatus();
    }
  }
  freeaddrinfo(found);
  if (reason.empty()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(Sv(key), ": cannot listen on ", Sv(address), ": ", reason));
}

std::vector<std::string> DescribeListenPorts(
    std::initializer_list<std::pair<std::string_view, std::string_view>> ports,
    std::string_view daemon) {
  std::vector<std::string> lines;
  for (const auto& [key, address] : ports) {
    if (address.empty() || IsUnixSocketAddress(address)) continue;
    const absl::Status can = CheckCanListen(address, key);
    lines.push_back(absl::StrCat(Sv(key), " ", Sv(address), ": ",
                                 can.ok() ? "free"
                                          : absl::StrCat(can.message(), " (a running ",
                                                         Sv(daemon), "'s?)")));
  }
  return lines;
}

absl::Status CheckHostPort(std::string_view address, bool allow_port_zero) {
  auto invalid = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected host:port such as \"127.0.0.1:7100\" or \"[::1]:7100\", got \"",
                     Sv(address), "\" (", Sv(why), ")"));
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return invalid("no port");
  const std::string_view host = address.substr(0, colon);
  const std::string_view port_text = address.substr(colon + 1);
  if (host.empty()) return invalid("no host");
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return invalid("unclosed '['");
    // An IPv6 address, optionally with a zone ("fe80::1%eth0").
    const std::string_view ip6 = host.substr(1, host.size() - 2);
    const size_t percent = ip6.find('%');
    const std::string_view zone =
        percent == std::string_view::npos ? std::string_view() : ip6.substr(percent + 1);
    if (percent != std::string_view::npos && zone.empty()) return invalid("empty IPv6 zone");
    for (char c : ip6.substr(0, percent)) {
      if (!absl::ascii_isxdigit(c) && c != ':' && c != '.') return invalid("bad IPv6 address");
    }
    for (char c : zone) {
      if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.') {
        return invalid("bad IPv6 zone");
      }
    }
  } else {
    for (char c : host) {
      // An unbracketed ':' would make the port ambiguous (IPv6 needs brackets).
      if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '_') {
        return invalid(c == ':' ? "IPv6 addresses need brackets" : "bad host name");
      }
    }
  }
  int64_t port = 0;
  if (!ParseDecimal(port_text, &port) || port > 65535) return invalid("port is not 0-65535");
  if (port == 0 && !allow_port_zero) return invalid("port 0 cannot be connected to");
  return absl::OkStatus();
}

absl::Status CheckDtype(std::string_view dtype) {
  if (dtype == "float32" || dtype == "float16" || dtype == "bfloat16") return absl::OkStatus();
  return NotOneOf(dtype, "float32, float16, bfloat16");
}

absl::Status CheckWireDtype(std::string_view dtype) {
  if (dtype == "cloud" || dtype == "scheduler" || CheckWireDtypeChoice(dtype).ok()) {
    return absl::OkStatus();
  }
  return NotOneOf(dtype, "cloud, scheduler, float32, float16, bfloat16, int8");
}

absl::Status CheckWireDtypeChoice(std::string_view dtype) {
  if (dtype == "int8" || CheckDtype(dtype).ok()) return absl::OkStatus();
  return NotOneOf(dtype, "float32, float16, bfloat16, int8");
}

absl::Status CheckDevice(std::string_view device) {
  if (device == "cpu" || device == "cuda") return absl::OkStatus();
  std::string_view index = device;
  int64_t unused = 0;
  if (index.starts_with("cuda:") && index.size() <= 9 && ParseDecimal(index.substr(5), &unused)) {
    return absl::OkStatus();
  }
  return NotOneOf(device, "cpu, cuda, cuda:N");
}

absl::Status CheckDtypeOnDevice(std::string_view dtype, std::string_view device) {
  if (dtype == "float16" && device == "cpu") {
    return absl::InvalidArgumentError(
        "float16 needs device: cuda (the CPU paths are not tested in float16); on a CPU use "
        "bfloat16 or float32");
  }
  return absl::OkStatus();
}

absl::Status CheckLogLevel(std::string_view level) {
  if (level == "trace" || level == "debug" || level == "info" || level == "warn" ||
      level == "error") {
    return absl::OkStatus();
  }
  return NotOneOf(level, "trace, debug, info, warn, error");
}

absl::Status CheckAtLeast(int64_t value, int64_t min) {
  if (value >= min) return absl::OkStatus();
  if (min == 1) return absl::InvalidArgumentError(absl::StrCat("must be positive, got ", value));
  if (min == 0) {
    return absl::InvalidArgumentError(absl::StrCat("must be non-negative, got ", value));
  }
  return absl::InvalidArgumentError(absl::StrCat("must be at least ", min, ", got ", value));
}

absl::Status CheckAtLeast(double value, double min, bool inclusive) {
  if (std::isfinite(value) && (inclusive ? value >= min : value > min)) return absl::OkStatus();
  if (min == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(inclusive ? "must be non-negative" : "must be positive", ", got ", value));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("must be ", inclusive ? "at least " : "more than ", min, ", got ", value));
}

std::optional<std::pair<std::string, std::string>> TlsSectionProblem(const TlsSection& section,
                                                                     bool require_files) {
  const bool any_file = !section.certificate_file.empty() || !section.private_key_file.empty() ||
                        !section.ca_file.empty();
  if (section.insecure && any_file) {
    return std::pair{absl::StrCat(std::string(section.prefix), ".insecure"),
                     absl::StrCat("true, but ", std::string(section.prefix),
                                  " files are set too: choose TLS or plaintext")};
  }
  if (!require_files || section.insecure) return std::nullopt;  // required keys, as bundle is
  std::vector<std::string> missing;
  if (section.certificate_file.empty()) missing.push_back("certificate_file");
  if (section.private_key_file.empty()) missing.push_back("private_key_file");
  if (section.ca_file.empty()) missing.push_back(std::string(section.ca_field));
  if (missing.empty()) return std::nullopt;
  return std::pair{std::string(section.prefix),
                   absl::StrCat(std::string(section.purpose), " over mutual TLS: set ",
                                absl::StrJoin(missing, ", "), " (or ", std::string(section.prefix),
                                ".insecure: true for plaintext on a trusted network)")};
}

std::string ResolveConfigPath(std::string_view path, std::string_view source_name) {
  const std::filesystem::path relative(path);
  if (path.empty() || relative.is_absolute()) return std::string(path);
  const std::filesystem::path joined = std::filesystem::path(source_name).parent_path() / relative;
  std::error_code ec;
  std::filesystem::path absolute = std::filesystem::absolute(joined, ec);
  // Without a working directory the relative join is still right for this process.
  if (ec) absolute = joined;
  // Lexical, not canonical: the bundle may not exist yet (the demo builds it later), and
  // its loader reports a missing directory better than we could here.
  return absolute.lexically_normal().string();
}

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<int64_t>(pages) * page_size;
}

}  // namespace tophat
