#include "backend/cpu/kv_cache.h"

#include <cstring>

#include "util/error.h"
#include "util/half.h"

namespace rf::cpu {

KvCache::KvCache(const model::ModelConfig& config, int64_t capacity, TensorType type)
    : type_(type), capacity_(capacity), kv_dim_(config.kv_dim()) {
  if (type != TensorType::F16 && type != TensorType::F32)
    fail("KV cache type {} is not supported (F16 or F32)", tensor_type_name(type));
  if (capacity <= 0) fail("KV cache capacity must be positive, got {}", capacity);
  element_bytes_ = type == TensorType::F16 ? 2 : 4;
  const size_t bytes = layer_offset(config.n_layers);
  keys_.reset(new uint8_t[bytes]);
  values_.reset(new uint8_t[bytes]);
}

void KvCache::truncate(int64_t n) {
  if (n < 0 || n > size_) fail("cannot truncate the KV cache to {} positions: it holds {}", n, size_);
  size_ = n;
}

void KvCache::mark_filled(int64_t n) {
  if (n < 0 || n > capacity_) fail("KV cache of {} positions cannot hold {}", capacity_, n);
  size_ = n;
}

void KvCache::store(int64_t layer, int64_t position, const float* key, const float* value) {
  const size_t offset = layer_offset(layer) + static_cast<size_t>(position * kv_dim_) * element_bytes_;
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
