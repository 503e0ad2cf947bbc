#include "scheduler/kv_block_allocator.h"

#include <cassert>

namespace tophat {

KvBlockAllocator::KvBlockAllocator(int32_t num_blocks, int32_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  free_.reserve(num_blocks);
  // Hand out low ids first.
  for (int32_t id = num_blocks - 1; id >= 0; --id) free_.push_back(id);
}

int32_t KvBlockAllocator::BlocksFor(int64_t positions) const {
  return static_cast<int32_t>((positions + block_size_ - 1) / block_size_);
}

bool KvBlockAllocator::Reserve(int32_t blocks) {
  if (blocks < 0 || blocks > num_unreserved()) return false;
  reserved_ += blocks;
  return true;
}

void KvBlockAllocator::Unreserve(int32_t blocks) {
  assert(blocks >= 0 && blocks <= reserved_);
  reserved_ -= blocks;
}

std::optional<int32_t> KvBlockAllocator::AllocateReserved() {
  if (reserved_ == 0 || free_.empty()) return std::nullopt;
  --reserved_;
  const int32_t id = free_.back();
  free_.pop_back();
  return id;
}

void KvBlockAllocator::Free(int32_t block_id) {
  assert(block_id >= 0 && block_id < num_blocks_);
  free_.push_back(block_id);
}

}  // namespace tophat
