#include "models/runtime/device_watch.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_device.h"

namespace tophat {

DeviceWatch::DeviceWatch(c10::Device device, std::string whose, Check check)
    : check_(check ? std::move(check) : DefaultCheck(device, std::move(whose))) {}

DeviceWatch::Check DeviceWatch::DefaultCheck(c10::Device device, std::string whose) {
  if (!device.is_cuda()) return {};
  const int index = device.has_index() ? device.index() : -1;
  return [index, whose = std::move(whose), name = device.str()]() -> absl::Status {
    const std::optional<std::string> fault = kernels::CudaContextFault(index);
    if (!fault) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(whose, " GPU (", name, ") is lost: ", *fault));
  };
}

absl::Status DeviceWatch::CheckAfterFailure(bool* found) {
  if (found != nullptr) *found = false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!lost_.ok() || !check_) return lost_;
  absl::Status checked = check_();
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
