// Key/value storage: a pool of fixed-size blocks, and the cache of one sequence over the
// layers of one submodel, which maps the sequence's positions onto blocks of a pool.
#pragma once

#include <algorithm>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/formats/config.h"

namespace tophat {

// Storage for `num_blocks` blocks of `block_size` positions each, over `num_layers` layers:
// keys and values [num_layers, num_blocks, block_size, kv_heads, head_dim], allocated (and
// zeroed) once. A block id names the same block in every layer. The pool does no accounting:
// which ids are free is the owner's business (scheduler/kv_block_allocator.h on the cloud).
// Shared between the caches that hold its blocks; not thread-safe (the engine thread does
// every forward pass and every block-table change).
class KvBlockPool {
 public:
  // Errors: sizes that are not positive (num_layers may be 0: a submodel with no layers),
  // more blocks than an int32 id can name, allocation failure (ResourceExhausted).
  static absl::StatusOr<std::shared_ptr<KvBlockPool>> Create(const ModelConfig& config,
                                                             int64_t num_layers,
                                                             int64_t num_blocks,
                                                             int64_t block_size,
                                                             at::ScalarType dtype,
                                                             at::Device device);
  // Bytes one block takes: keys and values, all layers.
  static int64_t BytesPerBlock(const ModelConfig& config, int64_t num_layers,
                               int64_t block_size, at::ScalarType dtype);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_layers() const { return num_layers_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }
  // Blocks needed to hold `positions` positions.
  int64_t BlocksFor(int64_t positions) const {
    return (positions + block_size_ - 1) / block_size_;
  }

  // [num_blocks, block_size, kv_heads, head_dim] views of one layer's storage (contiguous).
  const at::Tensor& keys(int64_t layer) const { return layer_keys_[layer]; }
  const at::Tensor& values(int64_t layer) const { return layer_values_[layer]; }

  // Block from[i]'s keys and values, every layer, into block to[i] (a forked session's copy
  // of its parent's KV; a later pipeline stage does the copy stage 0's fork did). The reads
  // happen before the writes, so a block may be both a source and a destination.
  // InvalidArgument for lists of different lengths or an id outside the pool.
  absl::Status CopyBlocks(std::span<const int32_t> from, std::span<const int32_t> to);

 private:
  friend class KvCache;
  KvBlockPool(const ModelConfig& config, int64_t num_layers, int64_t num_blocks,
              int64_t block_size, at::ScalarType dtype, at::Device device);  // throws
  KvBlockPool(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads,
              int64_t head_dim, at::ScalarType dtype, at::Device device);  // throws

  int64_t num_layers_;
  int64_t num_blocks_;
  int64_t block_size_;
  int64_t kv_heads_;
  int64_t head_dim_;
  at::ScalarType dtype_;
  at::Device device_;
  at::Tensor keys_;    // [num_layers, num_blocks, block_size, kv_heads, head_dim]
  at::Tensor values_;  // same
  std::vector<at::Tensor> layer_keys_;  // keys_[l], made once so the step creates no views
  std::vector<at::Tensor> layer_values_;
};

// The key/value cache of one sequence over the layers of one submodel. Position j of the
// sequence lives in block block_table()[j / block_size] at offset j % block_size.
// length() is the number of positions whose K/V are stored: the position of the next token.
//
// Two kinds, one code path:
// - contiguous: a private pool of one block of `capacity` positions (tests, benchmarks, the
//   cloud's warm-up). A growing contiguous cache (KvCache::Growing, the device agent's) starts
//   with no storage and reallocates its block when Reserve needs more, to at least 1.5x and in
//   whole growth steps, never past its maximum: a device pays for the positions a request
//   uses, not for the longest it may reach, and attention still reads one contiguous view;
// - paged: blocks of a shared pool; it starts with none, and the owner appends the ids its
//   allocator gave it before a forward pass needs them, and frees the ids that
//   ReleaseUnusedBlocks returns. The cache never frees anything itself.
// Move-only: a copy would hold the same blocks twice. Not thread-safe: its blocks are its own,
// and the thread that runs the forward passes (the cloud's engine thread) owns the cache.
class KvCache {
 public:
  // Contiguous cache. Throws (as a tensor allocation does) if the storage cannot be had.
  KvCache(const ModelConfig& config, int64_t num_layers, int64_t capacity, at::ScalarType dtype,
          at::Device device);
  // Paged cache over a shared pool (non-null); holds no blocks yet.
  explicit KvCache(std::shared_ptr<KvBlockPool> pool);
  // Growing contiguous cache of at most `max_capacity` positions, grown in multiples of
  // `growth_step` positions (both >= 1; checked, a violation throws c10::Error). Holds no
  // storage until the first Reserve.
  static KvCache Growing(const ModelConfig& config, int64_t num_layers, int64_t max_capacity,
                         int64_t growth_step, at::ScalarType dtype, at::Device device);

  KvCache(KvCache&&) = default;
  KvCache& operator=(KvCache&&) = default;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int64_t length() const { return length_; }
  // Positions the held blocks can store: blocks held * block_size.
  int64_t capacity() const {
    return static_cast<int64_t>(block_table_.size()) * pool_->block_size();
  }
  int64_t num_layers() const { return pool_->num_layers(); }
  bool paged() const { return paged_; }
  bool growing() const { return max_capacity_ > 0; }
  // Bytes of key/value storage this cache holds now (a paged cache: its blocks).
  int64_t StorageBytes() const;

  // Makes room for `positions` positions. A growing cache reallocates its block (keeping
  // positions [0, length())) when it holds fewer; any other cache only checks. Errors
  // (ResourceExhausted, nothing changed): more than a growing cache's maximum or a fixed
  // cache's capacity, or the allocation failed.
  absl::Status Reserve(int64_t positions);
  // A growing cache may grow to `max_capacity` positions from now on (a conversation's next
  // turn carries its caches past the first turn's limit); never lowers it. No-op for any
  // other cache.
  void RaiseMaxCapacity(int64_t max_capacity) {
    if (growing()) max_capacity_ = std::max(max_capacity_, max_capacity);
  }
  const KvBlockPool& pool() const { return *pool_; }
  std::span<const int32_t> block_table() const { return block_table_; }
  // The pool row (block * block_size + offset) that holds `position`, in one layer's
  // storage viewed as [num_blocks * block_size, kv_heads, head_dim]: where a batched write
  // puts that position's K/V. Precondition: 0 <= position < capacity().
  int64_t SlotOf(int64_t position) const {
    const int64_t block_size = pool_->block_size();
    return int64_t{block_table_[static_cast<size_t>(position / block_size)]} * block_size +
           position % block_size;
  }

  // Appends a block to the end of the table. Preconditions: a paged cache and
  // 0 <= block_id < pool().num_blocks() (both checked; a violation throws c10::Error), and an
  // id that no other cache holds (the owner's allocator guarantees it; not checked).
  void AppendBlock(int32_t block_id);
  // Points this paged cache at `blocks` (in position order) holding `length` positions:
  // how a later stage of the cloud's pipeline follows the block tables stage 0's allocator
  // keeps. Reuses the table's storage. Errors: a contiguous cache, an id outside the pool,
  // or a length the blocks cannot hold.
  absl::Status Assign(std::span<const int32_t> blocks, int64_t length);
  // Drops the trailing blocks that length() does not need and appends their ids to
  // `released` (a vector the caller reuses, so this need not allocate); returns how many.
  // A contiguous cache keeps its one private block and releases nothing.
  int64_t ReleaseUnusedBlocks(std::vector<int32_t>& released);
  std::vector<int32_t> ReleaseUnusedBlocks();

  // Rolls back to `length` positions (speculative rejection, cloud restart replay). Keeps
  // the blocks, so the sequence can grow again without new ones.
  absl::Status Truncate(int64_t length);
  // Length 0; keeps the blocks (ReleaseUnusedBlocks then returns them all for a paged cache).
  void Clear() { length_ = 0; }

  // For the forward pass, which calls these for every layer before Advance.
  // Stores `k`, `v` ([n, kv_heads, head_dim]) at positions [position, position + n) of
  // `layer`, one copy per block segment. Precondition: position + n <= capacity().
  void Write(int64_t layer, int64_t position, const at::Tensor& k, const at::Tensor& v) const;
  // Keys and values of positions [0, positions) of `layer` as [positions, kv_heads, head_dim]
  // tensors: views when the positions lie in the first block (always so for a contiguous
  // cache), else a copy gathered block by block (index_select).
  at::Tensor Keys(int64_t layer, int64_t positions) const;
  at::Tensor Values(int64_t layer, int64_t positions) const;
  // The same with this cache's block ids already on the pool's device (int32, at least the
  // blocks `positions` spans, in block-table order): a GPU step uploads them once for every
  // layer instead of once per call. Undefined `device_ids`: as above.
  at::Tensor Keys(int64_t layer, int64_t positions, const at::Tensor& device_ids) const;
  at::Tensor Values(int64_t layer, int64_t positions, const at::Tensor& device_ids) const;

  // Copies of the keys and values of positions [begin, begin + count) in every layer, as
  // [2, num_layers, count, kv_heads, head_dim]. Parallel drafting drafts several branches
  // past the same position one after another in one cache; it keeps each branch's rows this
  // way and puts back the one verification picks. Precondition: begin + count <= length().
  at::Tensor ExportPositions(int64_t begin, int64_t count) const;
  // Writes rows made by ExportPositions at `begin` and sets length() to begin + count.
  // Errors: begin > length(), a shape that does not match this cache, or no room.
  absl::Status ImportPositions(int64_t begin, const at::Tensor& rows);

  // Copies positions [0, length) of `source`, a paged cache over the same pool, into this
  // one's blocks and sets length() to `length`: a forked session's KV (a copy, not shared
  // blocks). Errors (nothing changed): a contiguous cache on either side, another pool, a
  // length past the source's, or this cache not empty or without the blocks for it.
  absl::Status CopyPrefixFrom(const KvCache& source, int64_t length);

  // Called by the forward pass after every layer has written `count` new positions.
  void Advance(int64_t count) { length_ += count; }

 private:
  at::Tensor Rows(const at::Tensor& blocks, int64_t positions,
                  const at::Tensor& device_ids = {}) const;

  std::shared_ptr<KvBlockPool> pool_;
  std::vector<int32_t> block_table_;
  int64_t length_ = 0;
  bool paged_ = false;
  int64_t max_capacity_ = 0;  // > 0: a growing contiguous cache
  int64_t growth_step_ = 0;
};

}  // namespace tophat
