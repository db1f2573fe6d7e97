#include "backend/cpu/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "util/error.h"
#include "util/half.h"

namespace rf::cpu {
namespace {

constexpr int64_t kBlock = model::kKvBlockPositions;

// Each layer's rows in one sequence's cache: model::kv_cache_rows, in whole blocks.
std::vector<int64_t> contiguous_rows(const model::ModelConfig& config, int64_t capacity, int64_t max_batch) {
  if (capacity <= 0) fail("KV cache capacity must be positive, got {}", capacity);
  if (max_batch <= 0) fail("max_batch must be positive, got {}", max_batch);
  std::vector<int64_t> rows;
  for (int64_t l = 0; l < config.n_layers; ++l)
    rows.push_back(model::kv_blocks_for(model::kv_cache_rows(config, l, capacity, max_batch)) * kBlock);
  return rows;
}

}  // namespace

KvCache::KvCache(const model::ModelConfig& config, int64_t capacity, TensorType type, int64_t max_batch)
    : KvCache(config, capacity, type, max_batch, contiguous_rows(config, capacity, max_batch)) {}

KvCache KvCache::paged(const model::ModelConfig& config, int64_t blocks, TensorType type) {
  if (blocks <= 0) fail("a paged KV cache needs a positive number of blocks, got {}", blocks);
  const int64_t rows = blocks * kBlock;
  return KvCache(config, rows, type, rows, std::vector<int64_t>(static_cast<size_t>(config.n_layers), rows));
}

KvCache::KvCache(const model::ModelConfig& config, int64_t capacity, TensorType type, int64_t max_batch,
                 std::vector<int64_t> rows)
    : config_(config),
      type_(type),
      capacity_(capacity),
      max_batch_(max_batch),
      kv_dim_(config.kv_dim()),
      rows_(std::move(rows)) {
  if (type != TensorType::F16 && type != TensorType::F32)
    fail("KV cache type {} is not supported (F16 or F32)", tensor_type_name(type));
  element_bytes_ = type == TensorType::F16 ? 2 : 4;
  layer_offsets_.push_back(0);
  for (const int64_t layer_rows : rows_)
    layer_offsets_.push_back(layer_offsets_.back() + static_cast<size_t>(layer_rows * kv_dim_) * element_bytes_);
  contiguous_table_.resize(static_cast<size_t>(*std::max_element(rows_.begin(), rows_.end()) / kBlock));
  std::iota(contiguous_table_.begin(), contiguous_table_.end(), 0);
  keys_.reset(new uint8_t[bytes()]);
  values_.reset(new uint8_t[bytes()]);
}

void KvCache::truncate(int64_t n) {
  if (n < 0 || n > size_) fail("cannot truncate the KV cache to {} positions: it holds {}", n, size_);
  size_ = model::positions_after_truncate(config_, capacity_, max_batch_, written_, n);
  if (size_ == 0) written_ = 0;
}

void KvCache::mark_filled(int64_t n) {
  if (n < 0 || n > capacity_) fail("KV cache of {} positions cannot hold {}", capacity_, n);
  size_ = n;
  written_ = std::max(written_, n);
}

std::span<const model::BlockId> KvCache::layer_table(int64_t layer, std::span<const model::BlockId> table) const {
  return table.first(std::min(table.size(), static_cast<size_t>(rows(layer) / kBlock)));
}

int64_t KvCache::row(int64_t layer, std::span<const model::BlockId> table, int64_t position) const {
  const std::span<const model::BlockId> blocks = layer_table(layer, table);
  return blocks[static_cast<size_t>(position / kBlock) % blocks.size()] * kBlock + position % kBlock;
}

void KvCache::append_rows(int64_t layer, std::span<const model::BlockId> table, int64_t first, int64_t count,
                          std::vector<RowRange>& ranges) const {
  const std::span<const model::BlockId> blocks = layer_table(layer, table);
  const size_t appended = ranges.size();
  // Block by block, without a division each: a decoding token walks every block of its context in every layer.
  size_t block = static_cast<size_t>(first / kBlock) % blocks.size();
  int64_t slot = first % kBlock;
  for (int64_t left = count; left > 0;) {
    const int64_t n = std::min(kBlock - slot, left);
    const int64_t start = blocks[block] * kBlock + slot;
    if (ranges.size() > appended && ranges.back().first + ranges.back().count == start)
      ranges.back().count += n;
    else
      ranges.push_back({start, n});
    left -= n;
    slot = 0;
    block = block + 1 == blocks.size() ? 0 : block + 1;
  }
}

void KvCache::store(int64_t layer, int64_t row, const float* key, const float* value) {
  const size_t offset = layer_offset(layer) + static_cast<size_t>(row * kv_dim_) * element_bytes_;
  if (type_ == TensorType::F32) {
    std::memcpy(keys_.get() + offset, key, static_cast<size_t>(kv_dim_) * sizeof(float));
    std::memcpy(values_.get() + offset, value, static_cast<size_t>(kv_dim_) * sizeof(float));
    return;
  }
  auto* keys = reinterpret_cast<uint16_t*>(keys_.get() + offset);
  auto* values = reinterpret_cast<uint16_t*>(values_.get() + offset);
  for (int64_t i = 0; i < kv_dim_; ++i) {
    keys[i] = fp32_to_fp16(key[i]);
    values[i] = fp32_to_fp16(value[i]);
  }
}

void KvCache::copy_block(model::BlockId source, model::BlockId destination) {
  const size_t block_bytes = static_cast<size_t>(kBlock * kv_dim_) * element_bytes_;
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    const size_t from = layer_offset(l) + static_cast<size_t>(source) * block_bytes;
    const size_t to = layer_offset(l) + static_cast<size_t>(destination) * block_bytes;
    std::memmove(keys_.get() + to, keys_.get() + from, block_bytes);
    std::memmove(values_.get() + to, values_.get() + from, block_bytes);
  }
}

}  // namespace rf::cpu
