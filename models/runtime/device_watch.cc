#include "models/runtime/device_watch.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_device.h"

namespace tophat {

DeviceWatch::DeviceWatch(c10::Device device, std::string whose, Check check)
    : check_(std::move(check)) {
  if (check_ || !device.is_cuda()) return;
  const int index = device.has_index() ? device.index() : -1;
  check_ = [index, whose = std::move(whose), name = device.str()]() -> absl::Status {
    const std::optional<std::string> fault = kernels::CudaContextFault(index);
    if (!fault) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(whose, " GPU (", name, ") is lost: ", *fault));
  };
}

void DeviceWatch::StartDrill(std::string loss) {
  std::lock_guard<std::mutex> lock(mutex_);
  drill_ = std::move(loss);
}

absl::Status DeviceWatch::CheckAfterFailure(bool* found) {
  if (found != nullptr) *found = false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!lost_.ok() || (!check_ && drill_.empty())) return lost_;
  absl::Status checked = drill_.empty() ? check_() : absl::UnavailableError(drill_);
  if (checked.ok()) return checked;
  // Whatever code the check used, a lost device is the server being unavailable: agents
  // replay elsewhere, apps retry.
  lost_ = absl::UnavailableError(checked.message());
  if (found != nullptr) *found = true;
  return lost_;
}

absl::Status DeviceWatch::lost() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_;
}

}  // namespace tophat
