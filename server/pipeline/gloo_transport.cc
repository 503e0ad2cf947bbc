// The Gloo backend of StageTransport and the TCPStore behind the rendezvous.
#include <deque>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/pipeline/stage_transport.h"

namespace tophat::pipeline {
namespace {

struct HostPort {
  std::string host;
  uint16_t port = 0;
};

absl::StatusOr<HostPort> ParseHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline rendezvous address '", address, "' is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return HostPort{host, static_cast<uint16_t>(port)};
}

class StoreRendezvous : public Rendezvous {
 public:
  StoreRendezvous(RendezvousOptions options, c10::intrusive_ptr<c10d::Store> store, std::string host)
      : Rendezvous(std::move(options)), store_(std::move(store)), host_(std::move(host)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    try {
      store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("pipeline rendezvous ", options().address, ": setting ", key, ": ", e.what()));
    }
  }

  absl::StatusOr<std::string> Get(const std::string& key) override {
    try {
      store_->wait({key}, options().timeout);
      const std::vector<uint8_t> value = store_->get(key);
      return std::string(value.begin(), value.end());
    } catch (const std::exception& e) {
      return absl::DeadlineExceededError(absl::StrCat(
          "pipeline rendezvous ", options().address, ": no '", key, "' within ",
          options().timeout.count(), " ms (is every stage started?): ", e.what()));
    }
  }

  absl::Status CheckReachable() override {
    if (options().rank == 0) return absl::OkStatus();
    try {
      store_->check({"gloo/reachable"});  // any key: a store that is gone throws
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("pipeline: stage 0's store at ",
                                                 options().address, " is gone: ", e.what()));
    }
  }

  int port() const override {
    return static_cast<int>(static_cast<c10d::TCPStore&>(*store_).getPort());
  }

  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  const std::string& host() const { return host_; }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::string host_;
};

class GlooTransport : public StageTransport {
 public:
  GlooTransport(c10::intrusive_ptr<c10d::ProcessGroupGloo> group, int rank, int size)
      : group_(std::move(group)), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  at::Device device() const override { return at::kCPU; }
  const char* name() const override { return "Gloo"; }

  absl::Status Send(std::span<const at::Tensor> tensors, int peer,
                    std::chrono::milliseconds timeout) override {
    for (const at::Tensor& tensor : tensors) {
      std::vector<at::Tensor> one = {tensor};
      try {
        group_->send(one, peer, /*tag=*/0)->wait(timeout);
      } catch (const std::exception& e) {
        return absl::UnavailableError(
            absl::StrCat("pipeline stage ", rank_, " -> ", peer, ": send failed: ", e.what()));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Post(std::span<const at::Tensor> tensors, int peer) override {
    for (const at::Tensor& tensor : tensors) {
      std::vector<at::Tensor> one = {tensor};
      try {
        posted_.push_back(group_->send(one, peer, /*tag=*/0));  // the work holds the tensor
      } catch (const std::exception& e) {
        return absl::UnavailableError(
            absl::StrCat("pipeline stage ", rank_, " -> ", peer, ": send failed: ", e.what()));
      }
    }
    return absl::OkStatus();
  }

  absl::Status WaitSent(size_t count, std::chrono::milliseconds timeout) override {
    for (; count > 0 && !posted_.empty(); --count) {
      auto work = std::move(posted_.front());
      posted_.pop_front();
      try {
        work->wait(timeout);
      } catch (const std::exception& e) {
        posted_.clear();
        return absl::UnavailableError(
            absl::StrCat("pipeline stage ", rank_, ": a send did not complete: ", e.what()));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Receive(std::span<at::Tensor> tensors, int peer,
                       std::chrono::milliseconds timeout) override {
    for (at::Tensor& tensor : tensors) {
      std::vector<at::Tensor> one = {tensor};
      try {
        group_->recv(one, peer, /*tag=*/0)->wait(timeout);
      } catch (const std::exception& e) {
        return absl::UnavailableError(absl::StrCat("pipeline stage ", rank_, " <- ", peer,
                                                   ": receive failed: ", e.what()));
      }
    }
    return absl::OkStatus();
  }

 private:
  using WorkPtr = decltype(std::declval<c10d::ProcessGroupGloo&>().send(
      std::declval<std::vector<at::Tensor>&>(), 0, 0));
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  int rank_;
  int size_;
  std::deque<WorkPtr> posted_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::Join(const RendezvousOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline stage ", options.rank,
                                                   " is not one of ", options.size, " stages"));
  }
  absl::StatusOr<HostPort> where = ParseHostPort(options.address);
  if (!where.ok()) return where.status();
  c10d::TCPStoreOptions store_options;
  store_options.port = where->port;
  store_options.isServer = options.rank == 0;
  store_options.numWorkers = static_cast<size_t>(options.size);
  store_options.waitWorkers = false;
  store_options.timeout = options.timeout;
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(where->host, store_options);
    return std::unique_ptr<Rendezvous>(
        std::make_unique<StoreRendezvous>(options, std::move(store), where->host));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "pipeline rendezvous ", options.address, ": ",
        options.rank == 0 ? "cannot serve the store: " : "cannot reach stage 0's store: ",
        e.what()));
  }
}

absl::StatusOr<std::unique_ptr<StageTransport>> ConnectGloo(Rendezvous& rendezvous) {
  auto& joined = static_cast<StoreRendezvous&>(rendezvous);
  const RendezvousOptions& options = rendezvous.options();
  try {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create();
    // A configured interface wins. Otherwise stage 0 binds where its store listens; the
    // others bind the same loopback address on one machine, or the interface of their own
    // hostname across machines.
    const bool loopback = joined.host() == "127.0.0.1" || joined.host() == "::1" ||
                          joined.host() == "localhost";
    gloo_options->devices.push_back(
        !options.interface.empty()
            ? c10d::ProcessGroupGloo::createDeviceForInterface(options.interface)
        : options.rank == 0 || loopback
            ? c10d::ProcessGroupGloo::createDeviceForHostname(joined.host())
            : c10d::ProcessGroupGloo::createDefaultDevice());
    gloo_options->timeout = options.timeout;
    auto store = c10::make_intrusive<c10d::PrefixStore>("gloo", joined.store());
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, options.rank, options.size,
                                                              gloo_options);
    return std::unique_ptr<StageTransport>(
        std::make_unique<GlooTransport>(std::move(group), options.rank, options.size));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("pipeline stage ", options.rank, " of ",
                                               options.size, ": Gloo set-up failed: ", e.what()));
  }
}

}  // namespace tophat::pipeline
