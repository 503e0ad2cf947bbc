// What each device's open sessions hold on one cloud, against the per-device limits, and the
// small slot number each device has while it holds any: the capacity side of admission (who
// may open a session), kept apart from the step's planning (what runs). Pure bookkeeping: the
// engine thread owns it; not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tophat {

struct DeviceLimits {
  // Sessions one device may hold open (running and waiting) at once; 0: no limit.
  int64_t max_sessions = 0;
  // Of those, how many may wait for admission at once; 0: no limit.
  int64_t max_waiting = 0;
  // KV blocks one device's open sessions may count together; 0: no limit.
  int64_t max_kv_blocks = 0;
  // Fair-share weights by certificate identity (a device key "device NAME" looks up NAME);
  // 1 for a device not listed and for plaintext streams ("stream N").
  std::map<std::string, double> weights;
};

// A device is a key: "device " and its certificate's identity, or "stream " and its stream id
// for a plaintext stream. A session counts against its device from Open to Close: as waiting
// until Admit, and for the KV blocks it was opened (or last re-counted) with.
class DeviceLedger {
 public:
  explicit DeviceLedger(DeviceLimits limits) : limits_(std::move(limits)) {}

  // New limits (a config reload): sessions open now keep running, and a device over a new
  // quota opens no more until it is under it. New weights apply at once, to the devices
  // holding slots too (from the next step's split of the prompt budget).
  void SetLimits(DeviceLimits limits);

  // Why `device` may not open one more session of `blocks` KV blocks, naming the limit's
  // config key; nullopt if it may.
  std::optional<std::string> QuotaProblem(const std::string& device, int32_t blocks) const;

  // A session opened, waiting for admission, counting `blocks`. Returns its device's slot,
  // which stays the device's until its last session closes.
  int32_t Open(const std::string& device, int32_t blocks);
  // One of the device's waiting sessions was admitted.
  void Admit(const std::string& device);
  // One of the device's sessions now counts `to_blocks` instead of `from_blocks` (a parked
  // session counts what it holds, not what it could grow to); `waiting`: and it waits for
  // admission again (a resumed one).
  void Recount(const std::string& device, int32_t from_blocks, int32_t to_blocks,
               bool waiting = false);
  // A session counting `blocks` closed; `waiting`: it had not been admitted. The device's
  // last session frees its slot for the next new device.
  void Close(const std::string& device, int32_t blocks, bool waiting);

  // Slots are in [0, num_slots()); a slot may be free (no device) until reused.
  int32_t num_slots() const { return next_slot_; }
  // The fair-share weight of the device in `slot` (1 for a free slot).
  double slot_weight(int32_t slot) const {
    return slot < static_cast<int32_t>(slot_weight_.size()) ? slot_weight_[slot] : 1.0;
  }
  // Devices with sessions open.
  size_t num_devices() const { return usage_.size(); }

  struct Usage {
    int64_t sessions = 0;  // open, running or waiting
    int64_t waiting = 0;   // not yet admitted
    int64_t blocks = 0;    // KV blocks they count
    int32_t slot = 0;
  };
  // What `device`'s sessions count now (all zero for a device with none).
  Usage usage(const std::string& device) const;
  // The `limit` devices whose sessions count the most KV blocks, then the most sessions, then
  // by name: who holds the cloud, for an operator (the metrics port's /devices).
  std::vector<std::pair<std::string, Usage>> Top(size_t limit) const;

 private:
  // `device`'s fair-share weight under limits_.
  double WeightOf(const std::string& device) const;

  DeviceLimits limits_;
  std::unordered_map<std::string, Usage> usage_;
  std::vector<double> slot_weight_;
  std::vector<int32_t> free_slots_;
  int32_t next_slot_ = 0;
};

}  // namespace tophat
