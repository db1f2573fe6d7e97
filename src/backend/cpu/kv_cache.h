// Keys and values of the positions evaluated so far, one block per layer, so that a new token attends to
// the past without recomputing it. Positions [0, size()) are valid; a chat that keeps a common prefix
// truncates to it and continues from there.
#pragma once
#include <cstdint>
#include <memory>

#include "gguf/tensor_type.h"
#include "model/config.h"

namespace rf::cpu {

class KvCache {
 public:
  // Room for `capacity` positions in every layer; `type` is F16 (half the memory, llama.cpp's default) or
  // F32. Memory is reserved, not touched: pages are committed as positions fill.
  KvCache(const model::ModelConfig& config, int64_t capacity, TensorType type);

  TensorType type() const { return type_; }
  int64_t capacity() const { return capacity_; }
  int64_t size() const { return size_; }
  // Forgets positions >= n (n <= size()).
  void truncate(int64_t n);

  // Writes the key and value rows (kv_dim floats each) of `position` (< capacity) in `layer`. A forward
  // pass writes its positions in every layer, then marks them filled.
  void store(int64_t layer, int64_t position, const float* key, const float* value);
  void mark_filled(int64_t n);

  // The rows of a layer: position p, kv head h starts at element (p * kv_dim + h * head_dim).
  template <typename T>
  const T* keys(int64_t layer) const {
    return reinterpret_cast<const T*>(keys_.get() + layer_offset(layer));
  }
  template <typename T>
  const T* values(int64_t layer) const {
    return reinterpret_cast<const T*>(values_.get() + layer_offset(layer));
  }
  int64_t row_elements() const { return kv_dim_; }

 private:
  size_t layer_offset(int64_t layer) const { return static_cast<size_t>(layer * capacity_ * kv_dim_) * element_bytes_; }

  TensorType type_;
  int64_t capacity_;
  int64_t kv_dim_;
  size_t element_bytes_;
  int64_t size_ = 0;
  std::unique_ptr<uint8_t[]> keys_;
  std::unique_ptr<uint8_t[]> values_;
};

}  // namespace rf::cpu
