#include "device_agent/dns_clouds.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/strings.h"

namespace tophat {

absl::StatusOr<std::vector<std::string>> ResolveHostAddresses(std::string_view host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string name(host);
  const int error = getaddrinfo(name.c_str(), nullptr, &hints, &found);
  if (error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve \"", name, "\": ", gai_strerror(error)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owned(found, &freeaddrinfo);
  std::vector<std::string> addresses;
  for (const addrinfo* entry = found; entry != nullptr; entry = entry->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (entry->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(entry->ai_addr)->sin_addr, text,
                sizeof(text));
      addresses.push_back(absl::StrCat(text, ":", port));
    } else if (entry->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(entry->ai_addr)->sin6_addr,
                text, sizeof(text));
      addresses.push_back(absl::StrCat("[", text, "]:", port));
    }
  }
  std::sort(addresses.begin(), addresses.end());
  addresses.erase(std::unique(addresses.begin(), addresses.end()), addresses.end());
  if (addresses.empty()) {
    return absl::UnavailableError(absl::StrCat("\"", name, "\" resolves to no address"));
  }
  return addresses;
}

absl::StatusOr<std::unique_ptr<DnsClouds>> DnsClouds::Create(std::string_view target,
                                                             size_t slots) {
  if (!IsDnsCloudTarget(target)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", Sv(target), "\" is not of the form dns:///HOST:PORT"));
  }
  const std::string_view host_port = target.substr(kDnsScheme.size());
  const size_t colon = host_port.rfind(':');
  int port = 0;
  if (colon == std::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(Sv(host_port.substr(colon + 1)), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", Sv(target), "\" is not of the form dns:///HOST:PORT"));
  }
  std::string host(host_port.substr(0, colon));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // an IPv6 literal
  }
  if (slots == 0) {
    absl::StatusOr<std::vector<std::string>> resolved = ResolveHostAddresses(host, port);
    slots = resolved.ok() ? resolved->size() : 1;
  }
  return std::unique_ptr<DnsClouds>(new DnsClouds(std::move(host), port, std::max<size_t>(1, slots)));
}

absl::StatusOr<std::string> DnsClouds::AddressFor(size_t slot) {
  absl::StatusOr<std::vector<std::string>> resolved = ResolveHostAddresses(host_, port_);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!resolved.ok()) {
    held_[slot].clear();
    return resolved.status();
  }
  auto held_by_other = [&](const std::string& address) {
    for (size_t i = 0; i < held_.size(); ++i) {
      if (i != slot && held_[i] == address) return true;
    }
    return false;
  };
  const std::string& previous = held_[slot];
  if (!previous.empty() &&
      std::find(resolved->begin(), resolved->end(), previous) != resolved->end() &&
      !held_by_other(previous)) {
    return previous;
  }
  for (const std::string& address : *resolved) {
    if (!held_by_other(address)) {
      held_[slot] = address;
      return address;
    }
  }
  held_[slot].clear();
  return absl::UnavailableError(absl::StrCat(
      "\"", host_, "\" resolves to ", resolved->size(),
      " address(es), each held by another of this agent's ", held_.size(), " streams"));
}

}  // namespace tophat
