#include "models/runtime/kv_cache.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <string>
#include <utility>

#include <c10/util/Exception.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tophat {

KvBlockPool::KvBlockPool(const ModelConfig& config, int64_t num_layers, int64_t num_blocks,
                         int64_t block_size, at::ScalarType dtype, at::Device device)
    : KvBlockPool(num_layers, num_blocks, block_size, config.num_key_value_heads,
                  config.head_dim, dtype, device) {}

KvBlockPool::KvBlockPool(int64_t num_layers, int64_t num_blocks, int64_t block_size,
                         int64_t kv_heads, int64_t head_dim, at::ScalarType dtype,
                         at::Device device)
    : num_layers_(num_layers),
      num_blocks_(num_blocks),
      block_size_(block_size),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      dtype_(dtype),
      device_(device) {
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  // A submodel with no layers (input with m = 0) still gets a valid, empty pool.
  keys_ = at::zeros({num_layers, num_blocks, block_size, kv_heads_, head_dim_}, options);
  values_ = at::zeros_like(keys_);
  // The allocation's own device: "cuda" asked for becomes "cuda:0", as every tensor and
  // submodel names it, so that comparing the pool's device with theirs holds.
  device_ = keys_.device();
  layer_keys_.reserve(num_layers);
  layer_values_.reserve(num_layers);
  for (int64_t l = 0; l < num_layers; ++l) {
    layer_keys_.push_back(keys_[l]);
    layer_values_.push_back(values_[l]);
  }
}

absl::StatusOr<std::shared_ptr<KvBlockPool>> KvBlockPool::Create(const ModelConfig& config,
                                                                 int64_t num_layers,
                                                                 int64_t num_blocks,
                                                                 int64_t block_size,
                                                                 at::ScalarType dtype,
                                                                 at::Device device) {
  if (num_layers < 0 || num_blocks < 1 || block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a KV block pool needs num_layers >= 0, num_blocks >= 1 and block_size >= 1; got ",
        num_layers, " layers, ", num_blocks, " blocks of ", block_size, " positions"));
  }
  if (num_blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(num_blocks, " KV blocks are more than an int32 block id can name"));
  }
  if (config.num_key_value_heads < 1 || config.head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a KV block pool needs num_key_value_heads and head_dim >= 1; the config has ",
        config.num_key_value_heads, " and ", config.head_dim));
  }
  // Sized by arithmetic before anything is allocated: an impossible size must fail here with
  // the numbers, not depend on the allocator failing (a machine that overcommits may not
  // fail at all, and AddressSanitizer aborts instead).
  const int64_t block_bytes = BytesPerBlock(config, num_layers, block_size, dtype);
  int64_t total_bytes = 0;
  const bool overflows = block_bytes < 0 || __builtin_mul_overflow(num_blocks, block_bytes,
                                                                   &total_bytes);
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  const int64_t host_bytes =
      pages > 0 && page_size > 0 ? static_cast<int64_t>(pages) * page_size : 0;
  // On a GPU the bound is its memory, which only the allocator knows; host memory still
  // catches sizes no device has.
  if (overflows || (host_bytes > 0 && total_bytes > host_bytes &&
                    (device.is_cpu() || total_bytes > 64 * host_bytes))) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a KV block pool of ", num_blocks, " blocks x ", block_bytes, " bytes",
        overflows ? " overflows 64 bits"
                  : absl::StrCat(" is ", total_bytes, " bytes, more than this machine's ",
                                 host_bytes, " bytes of memory")));
  }
  try {
    return std::shared_ptr<KvBlockPool>(
        new KvBlockPool(config, num_layers, num_blocks, block_size, dtype, device));
  } catch (const std::exception& e) {
    std::string what = e.what();
    // c10::Error appends a C++ backtrace after the first line.
    if (auto newline = what.find('\n'); newline != std::string::npos) what.resize(newline);
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate a KV block pool of ", num_blocks, " blocks x ",
        BytesPerBlock(config, num_layers, block_size, dtype), " bytes on ", device.str(), ": ",
        what));
  }
}

int64_t KvBlockPool::BytesPerBlock(const ModelConfig& config, int64_t num_layers,
                                   int64_t block_size, at::ScalarType dtype) {
  return 2 * num_layers * block_size * config.num_key_value_heads * config.head_dim *
         static_cast<int64_t>(c10::elementSize(dtype));
}

namespace {

int64_t CheckedCapacity(int64_t capacity) {
  TORCH_CHECK(capacity >= 0, "a KV cache cannot have capacity ", capacity);
  return capacity;
}

}  // namespace

KvCache::KvCache(const ModelConfig& config, int64_t num_layers, int64_t capacity,
                 at::ScalarType dtype, at::Device device)
    // A zero capacity still makes a (one-position) block, but holds none of it.
    : pool_(new KvBlockPool(config, num_layers, 1,
                            std::max<int64_t>(CheckedCapacity(capacity), 1), dtype, device)) {
  if (capacity > 0) block_table_.push_back(0);
}

KvCache::KvCache(std::shared_ptr<KvBlockPool> pool) : pool_(std::move(pool)), paged_(true) {
  TORCH_CHECK(pool_ != nullptr, "a paged KV cache needs a pool");
}

KvCache KvCache::Growing(const ModelConfig& config, int64_t num_layers, int64_t max_capacity,
                         int64_t growth_step, at::ScalarType dtype, at::Device device) {
  TORCH_CHECK(max_capacity >= 1 && growth_step >= 1, "a growing KV cache needs a maximum (",
              max_capacity, ") and a growth step (", growth_step, ") of at least 1");
  KvCache cache(config, num_layers, 0, dtype, device);
  cache.max_capacity_ = max_capacity;
  cache.growth_step_ = growth_step;
  return cache;
}

int64_t KvCache::StorageBytes() const {
  return static_cast<int64_t>(block_table_.size()) * pool_->block_size() * 2 *
         pool_->num_layers() * pool_->kv_heads() * pool_->head_dim() *
         static_cast<int64_t>(c10::elementSize(pool_->dtype()));
}

absl::Status KvCache::Reserve(int64_t positions) {
  if (positions <= capacity()) return absl::OkStatus();
  if (!growing() || positions > max_capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the KV cache needs ", positions, " positions and holds ",
        growing() ? max_capacity_ : capacity(), growing() ? " at most" : ""));
  }
  // 1.5x keeps the copies amortised (each position is copied at most twice on average) and
  // the slack under a third of what is held.
  const int64_t wanted = std::max(positions, capacity() + capacity() / 2);
  const int64_t steps = (wanted + growth_step_ - 1) / growth_step_;
  const int64_t grown = std::min(max_capacity_, steps * growth_step_);
  try {
    auto pool = std::shared_ptr<KvBlockPool>(
        new KvBlockPool(pool_->num_layers(), 1, grown, pool_->kv_heads(), pool_->head_dim(),
                        pool_->dtype(), pool_->device()));
    if (length_ > 0) {
      // [layers, 1, capacity, kv_heads, head_dim]: one copy each for all layers.
      pool->keys_.narrow(2, 0, length_).copy_(pool_->keys_.narrow(2, 0, length_));
      pool->values_.narrow(2, 0, length_).copy_(pool_->values_.narrow(2, 0, length_));
    }
    pool_ = std::move(pool);
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (auto newline = what.find('\n'); newline != std::string::npos) what.resize(newline);
    return absl::ResourceExhaustedError(absl::StrCat("cannot grow a KV cache to ", grown,
                                                     " positions: ", what));
  }
  block_table_.assign(1, 0);
  return absl::OkStatus();
}

void KvCache::AppendBlock(int32_t block_id) {
  TORCH_CHECK(paged_, "a contiguous KV cache holds one private block; it takes no others");
  TORCH_CHECK(block_id >= 0 && block_id < pool_->num_blocks(), "KV block id ", block_id,
              " is outside the pool's ", pool_->num_blocks(), " blocks");
  block_table_.push_back(block_id);
}

absl::Status KvCache::Assign(std::span<const int32_t> blocks, int64_t length) {
  if (!paged_) return absl::FailedPreconditionError("a contiguous KV cache takes no block table");
  for (int32_t id : blocks) {
    if (id < 0 || id >= pool_->num_blocks()) {
      return absl::InvalidArgumentError(absl::StrCat("KV block id ", id, " is outside the pool's ",
                                                     pool_->num_blocks(), " blocks"));
    }
  }
  if (length < 0 || length > static_cast<int64_t>(blocks.size()) * pool_->block_size()) {
    return absl::InvalidArgumentError(absl::StrCat(blocks.size(), " blocks of ",
                                                   pool_->block_size(),
                                                   " positions cannot hold ", length));
  }
  block_table_.assign(blocks.begin(), blocks.end());
  length_ = length;
  return absl::OkStatus();
}

int64_t KvCache::ReleaseUnusedBlocks(std::vector<int32_t>& released) {
  if (!paged_) return 0;
  const auto keep = static_cast<size_t>(pool_->BlocksFor(length_));
  if (keep >= block_table_.size()) return 0;
  const auto count = static_cast<int64_t>(block_table_.size() - keep);
  released.insert(released.end(), block_table_.begin() + static_cast<ptrdiff_t>(keep),
                  block_table_.end());
  block_table_.resize(keep);
  return count;
}

std::vector<int32_t> KvCache::ReleaseUnusedBlocks() {
  std::vector<int32_t> released;
  ReleaseUnusedBlocks(released);
  return released;
}

absl::Status KvCache::Truncate(int64_t length) {
  if (length < 0 || length > length_) {
    return absl::OutOfRangeError(absl::StrCat("cannot truncate a KV cache of length ", length_,
                                              " to ", length));
  }
  length_ = length;
  return absl::OkStatus();
}

void KvCache::Write(int64_t layer, int64_t position, const at::Tensor& k,
                    const at::Tensor& v) const {
  const int64_t block_size = pool_->block_size();
  const at::Tensor& keys = pool_->keys(layer);
  const at::Tensor& values = pool_->values(layer);
  const int64_t n = k.size(0);
  for (int64_t done = 0; done < n;) {
    const int64_t pos = position + done;
    const int32_t block = block_table_[pos / block_size];
    const int64_t offset = pos % block_size;
    const int64_t count = std::min(block_size - offset, n - done);
    keys.select(0, block).narrow(0, offset, count).copy_(k.narrow(0, done, count));
    values.select(0, block).narrow(0, offset, count).copy_(v.narrow(0, done, count));
    done += count;
  }
}

at::Tensor KvCache::Rows(const at::Tensor& blocks, int64_t positions,
                         const at::Tensor& device_ids) const {
  const int64_t block_size = pool_->block_size();
  if (positions <= block_size) {
    return blocks.select(0, block_table_.empty() ? 0 : block_table_[0]).narrow(0, 0, positions);
  }
  const int64_t needed = pool_->BlocksFor(positions);
  at::Tensor ids;
  if (device_ids.defined() && device_ids.size(0) >= needed) {
    ids = device_ids.narrow(0, 0, needed);
  } else {
    // The ids are only read; from_blob does not copy them (on CPU).
    ids = at::from_blob(const_cast<int32_t*>(block_table_.data()), {needed}, at::kInt);
    if (!blocks.is_cpu()) ids = ids.to(blocks.device());
  }
  return blocks.index_select(0, ids)
      .view({needed * block_size, pool_->kv_heads(), pool_->head_dim()})
      .narrow(0, 0, positions);
}

at::Tensor KvCache::Keys(int64_t layer, int64_t positions) const {
  return Rows(pool_->keys(layer), positions);
}

at::Tensor KvCache::Values(int64_t layer, int64_t positions) const {
  return Rows(pool_->values(layer), positions);
}

at::Tensor KvCache::Keys(int64_t layer, int64_t positions, const at::Tensor& device_ids) const {
  return Rows(pool_->keys(layer), positions, device_ids);
}

at::Tensor KvCache::Values(int64_t layer, int64_t positions,
                           const at::Tensor& device_ids) const {
  return Rows(pool_->values(layer), positions, device_ids);
}

at::Tensor KvCache::ExportPositions(int64_t begin, int64_t count) const {
  const int64_t layers = num_layers();
  at::Tensor rows = at::empty({2, layers, count, pool_->kv_heads(), pool_->head_dim()},
                              at::TensorOptions().dtype(pool_->dtype()).device(pool_->device()));
  if (count == 0) return rows;
  for (int64_t l = 0; l < layers; ++l) {
    rows[0][l].copy_(Keys(l, begin + count).narrow(0, begin, count));
    rows[1][l].copy_(Values(l, begin + count).narrow(0, begin, count));
  }
  return rows;
}

absl::Status KvCache::ImportPositions(int64_t begin, const at::Tensor& rows) {
  if (begin < 0 || begin > length_) {
    return absl::OutOfRangeError(absl::StrCat("cannot import KV rows at position ", begin,
                                              " into a cache of length ", length_));
  }
  if (rows.dim() != 5 || rows.size(0) != 2 || rows.size(1) != num_layers() ||
      rows.size(3) != pool_->kv_heads() || rows.size(4) != pool_->head_dim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV rows of shape ", c10::str(rows.sizes()), " do not fit a cache of ", num_layers(),
        " layers x ", pool_->kv_heads(), " heads x ", pool_->head_dim()));
  }
  const int64_t count = rows.size(2);
  if (absl::Status room = Reserve(begin + count); !room.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("importing ", count, " KV rows at ", begin,
                                                     ": ", room.message()));
  }
  for (int64_t l = 0; l < num_layers(); ++l) Write(l, begin, rows[0][l], rows[1][l]);
  length_ = begin + count;
  return absl::OkStatus();
}

}  // namespace tophat

namespace tophat {

absl::Status KvBlockPool::CopyBlocks(std::span<const int32_t> from,
                                     std::span<const int32_t> to) {
  if (from.size() != to.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a block copy names ", from.size(),
                                                   " sources and ", to.size(), " destinations"));
  }
  for (const std::span<const int32_t> ids : {from, to}) {
    for (const int32_t id : ids) {
      if (id < 0 || id >= num_blocks_) {
        return absl::InvalidArgumentError(absl::StrCat("a block copy names block ", id,
                                                       ", outside the pool of ", num_blocks_));
      }
    }
  }
  if (from.empty() || num_layers_ == 0) return absl::OkStatus();
  auto ids = [&](std::span<const int32_t> blocks) {
    return at::tensor(std::vector<int64_t>(blocks.begin(), blocks.end()),
                      at::TensorOptions().dtype(at::kLong))
        .to(device_);
  };
  const at::Tensor source = ids(from);
  const at::Tensor destination = ids(to);
  // Dimension 1 is the block in [num_layers, num_blocks, ...]: every layer in one copy.
  keys_.index_copy_(1, destination, keys_.index_select(1, source));
  values_.index_copy_(1, destination, values_.index_select(1, source));
  return absl::OkStatus();
}

absl::Status KvCache::CopyPrefixFrom(const KvCache& source, int64_t length) {
  if (!paged_ || !source.paged_) {
    return absl::FailedPreconditionError("a KV prefix is copied between paged caches only");
  }
  if (pool_ != source.pool_) {
    return absl::InvalidArgumentError("a KV prefix is copied within one pool");
  }
  if (length < 0 || length > source.length_) {
    return absl::OutOfRangeError(absl::StrCat("cannot copy ", length,
                                              " KV positions of a cache of length ",
                                              source.length_));
  }
  if (length_ != 0 || capacity() < length) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a KV prefix of ", length, " positions goes into an empty cache with the blocks for it; "
        "this one holds ", length_, " positions in ", block_table_.size(), " blocks"));
  }
  // Whole blocks: the last one's tail beyond `length` is never read before it is written.
  const auto blocks = static_cast<size_t>(pool_->BlocksFor(length));
  TOPHAT_RETURN_IF_ERROR(
      pool_->CopyBlocks(std::span<const int32_t>(source.block_table_).first(blocks),
                        std::span<const int32_t>(block_table_).first(blocks)));
  length_ = length;
  return absl::OkStatus();
}

}  // namespace tophat
