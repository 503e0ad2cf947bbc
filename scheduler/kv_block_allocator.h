// KV block accounting for the cloud's paged KV cache: which block ids are free, and how many
// are promised to admitted sessions. Pure bookkeeping; the tensors live in models/runtime/kv_cache.h.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace tophat {

// Admission reserves a session's worst case (its max_positions) up front, so a running
// session never stalls for lack of a block and nobody's KV is ever evicted. Blocks are then
// taken from the reservation as the session grows. Not thread-safe: the engine thread owns it.
class KvBlockAllocator {
 public:
  KvBlockAllocator(int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  // Blocks handed out and not yet freed.
  int32_t num_allocated() const { return num_blocks_ - static_cast<int32_t>(free_.size()); }
  // Blocks neither allocated nor promised to a reservation: what admission can still give.
  int32_t num_unreserved() const { return static_cast<int32_t>(free_.size()) - reserved_; }
  double usage() const {
    return num_blocks_ == 0 ? 0.0 : static_cast<double>(num_allocated()) / num_blocks_;
  }

  // Blocks needed to hold `positions` positions.
  int32_t BlocksFor(int64_t positions) const;

  // Promises `blocks` blocks; false (and no change) when fewer are unreserved.
  bool Reserve(int32_t blocks);
  // Returns an unused part of a reservation.
  void Unreserve(int32_t blocks);
  // Takes one block out of an earlier reservation. nullopt only if the caller allocates
  // beyond what it reserved (a bug the caller reports).
  std::optional<int32_t> AllocateReserved();
  // Returns a block to the free list.
  void Free(int32_t block_id);

 private:
  int32_t num_blocks_;
  int32_t block_size_;
  int32_t reserved_ = 0;
  // LIFO free list: a freed block is reused first, while it is still warm in cache.
  std::vector<int32_t> free_;
};

}  // namespace tophat
