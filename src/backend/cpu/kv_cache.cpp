#include "backend/cpu/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "model/forward_pass.h"
#include "util/error.h"
#include "util/half.h"

namespace rf::cpu {

KvCache::KvCache(const model::ModelConfig& config, int64_t capacity, TensorType type, int64_t max_batch)
    : config_(config), type_(type), capacity_(capacity), max_batch_(max_batch), kv_dim_(config.kv_dim()) {
  if (type != TensorType::F16 && type != TensorType::F32)
    fail("KV cache type {} is not supported (F16 or F32)", tensor_type_name(type));
  if (capacity <= 0) fail("KV cache capacity must be positive, got {}", capacity);
  if (max_batch <= 0) fail("max_batch must be positive, got {}", max_batch);
  element_bytes_ = type == TensorType::F16 ? 2 : 4;
  layer_offsets_.push_back(0);
  for (int64_t l = 0; l < config.n_layers; ++l) {
    rows_.push_back(model::kv_cache_rows(config, l, capacity, max_batch));
    layer_offsets_.push_back(layer_offsets_.back() + static_cast<size_t>(rows_.back() * kv_dim_) * element_bytes_);
  }
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
}

void KvCache::store(int64_t layer, int64_t position, const float* key, const float* value) {
  written_ = std::max(written_, position + 1);
  const size_t offset = layer_offset(layer) + static_cast<size_t>(row(layer, position) * kv_dim_) * element_bytes_;
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

}  // namespace rf::cpu
