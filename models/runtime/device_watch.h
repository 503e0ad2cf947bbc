// Whether the device a daemon computes on still can, asked after a failure. A CUDA context
// that hit an error no later call recovers from (a device-side assert, an illegal address,
// an uncorrectable ECC error, a GPU gone from the bus) fails every call from then on, and only
// a new process gets a working one: a daemon that finds its device lost stops serving and
// exits for its supervisor to restart it, instead of failing every request while its health
// says it serves. The cloud's engine and the device agent both ask one of these.
#pragma once

#include <functional>
#include <mutex>
#include <string>

#include <c10/core/Device.h>

#include "absl/status/status.h"

namespace tophat {

class DeviceWatch {
 public:
  // Asks the device: OK while it computes, UNAVAILABLE naming it and the error once lost.
  using Check = std::function<absl::Status()>;

  // `check` empty: for a CUDA device, kernels::CudaContextFault of it, the loss named
  // "`whose` GPU (cuda:N) is lost: cudaErrorX: text" (`whose`: "the cloud's", "the
  // agent's"); a CPU is never lost.
  DeviceWatch(c10::Device device, std::string whose, Check check = {});

  // A failover drill (the daemons' --drill-device-loss-after-*): the next CheckAfterFailure
  // finds the device lost, with `loss` as the UNAVAILABLE message, without asking it, so
  // that a lost device's whole path runs on one that is fine. Thread-safe.
  void StartDrill(std::string loss);

  // After a failure on the device: asks it (unless already lost) and returns the loss, or OK.
  // `found` (optional) is set true for the one call that found the loss. Thread-safe; waits
  // for the device's queued work, so it is for failure paths, not every step.
  absl::Status CheckAfterFailure(bool* found = nullptr);

  // The loss, or OK while none has been found. Thread-safe.
  absl::Status lost() const;

 private:
  Check check_;
  mutable std::mutex mutex_;
  absl::Status lost_;  // under mutex_
  std::string drill_;  // under mutex_: StartDrill's loss, "" without a drill
};

}  // namespace tophat
