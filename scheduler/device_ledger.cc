#include "scheduler/device_ledger.h"

#include <algorithm>
#include <cstddef>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace tophat {

std::optional<std::string> DeviceLedger::QuotaProblem(const std::string& device,
                                                      int32_t blocks) const {
  const Usage now = usage(device);
  if (limits_.max_sessions > 0 && now.sessions >= limits_.max_sessions) {
    return absl::StrCat(device, " already has ", now.sessions,
                        " sessions open (limits.max_sessions_per_device)");
  }
  if (limits_.max_waiting > 0 && now.waiting >= limits_.max_waiting) {
    return absl::StrCat(device, " already has ", now.waiting,
                        " sessions waiting for admission (limits.max_waiting_sessions_per_device)");
  }
  if (limits_.max_kv_blocks > 0 && now.blocks + blocks > limits_.max_kv_blocks) {
    return absl::StrCat(device, "'s open sessions hold ", now.blocks, " KV blocks; ", blocks,
                        " more would pass its quota of ", limits_.max_kv_blocks,
                        " (limits.max_kv_fraction_per_device)");
  }
  return std::nullopt;
}

double DeviceLedger::WeightOf(const std::string& device) const {
  // Weights are keyed by the certificate's identity; a plaintext stream has none.
  constexpr std::string_view kIdentified = "device ";
  if (!device.starts_with(kIdentified)) return 1.0;
  const auto weight = limits_.weights.find(device.substr(kIdentified.size()));
  return weight == limits_.weights.end() ? 1.0 : weight->second;
}

void DeviceLedger::SetLimits(DeviceLimits limits) {
  limits_ = std::move(limits);
  for (const auto& [device, usage] : usage_) {
    slot_weight_[static_cast<size_t>(usage.slot)] = WeightOf(device);
  }
}

int32_t DeviceLedger::Open(const std::string& device, int32_t blocks) {
  auto [it, new_device] = usage_.try_emplace(device);
  Usage& usage = it->second;
  if (new_device) {
    if (free_slots_.empty()) {
      usage.slot = next_slot_++;
    } else {
      usage.slot = free_slots_.back();
      free_slots_.pop_back();
    }
    if (slot_weight_.size() <= static_cast<size_t>(usage.slot)) {
      slot_weight_.resize(static_cast<size_t>(usage.slot) + 1, 1.0);
    }
    slot_weight_[static_cast<size_t>(usage.slot)] = WeightOf(device);
  }
  ++usage.sessions;
  ++usage.waiting;
  usage.blocks += blocks;
  return usage.slot;
}

void DeviceLedger::Admit(const std::string& device) {
  if (auto it = usage_.find(device); it != usage_.end()) --it->second.waiting;
}

void DeviceLedger::Recount(const std::string& device, int32_t from_blocks, int32_t to_blocks,
                           bool waiting) {
  auto it = usage_.find(device);
  if (it == usage_.end()) return;
  it->second.blocks += to_blocks - from_blocks;
  if (waiting) ++it->second.waiting;
}

void DeviceLedger::Close(const std::string& device, int32_t blocks, bool waiting) {
  auto it = usage_.find(device);
  if (it == usage_.end()) return;
  Usage& usage = it->second;
  if (waiting) --usage.waiting;
  usage.blocks -= blocks;
  if (--usage.sessions <= 0) {
    free_slots_.push_back(usage.slot);
    usage_.erase(it);
  }
}

DeviceLedger::Usage DeviceLedger::usage(const std::string& device) const {
  const auto it = usage_.find(device);
  return it == usage_.end() ? Usage{} : it->second;
}

std::vector<std::pair<std::string, DeviceLedger::Usage>> DeviceLedger::Top(size_t limit) const {
  std::vector<std::pair<std::string, Usage>> devices(usage_.begin(), usage_.end());
  const auto first = [](const std::pair<std::string, Usage>& a,
                        const std::pair<std::string, Usage>& b) {
    if (a.second.blocks != b.second.blocks) return a.second.blocks > b.second.blocks;
    if (a.second.sessions != b.second.sessions) return a.second.sessions > b.second.sessions;
    return a.first < b.first;
  };
  limit = std::min(limit, devices.size());
  std::partial_sort(devices.begin(), devices.begin() + static_cast<std::ptrdiff_t>(limit),
                    devices.end(), first);
  devices.resize(limit);
  return devices;
}

}  // namespace tophat
