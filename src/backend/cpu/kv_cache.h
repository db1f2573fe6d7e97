// Keys and values of the positions evaluated so far, one block per layer, so that a new token attends to
// the past without recomputing it. Positions [0, size()) are valid; a chat that keeps a common prefix
// truncates to it and continues from there. A sliding-window layer keeps only a ring of its last positions
// (model::kv_cache_rows), where that saves memory.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "gguf/tensor_type.h"
#include "model/config.h"

namespace rf::cpu {

class KvCache {
 public:
  // Room for `capacity` positions, filled by passes of at most `max_batch` tokens; `type` is F16 (half the
  // memory, llama.cpp's default) or F32. Memory is reserved, not touched: pages are committed as positions fill.
  // `config` must outlive the cache.
  KvCache(const model::ModelConfig& config, int64_t capacity, TensorType type, int64_t max_batch);

  TensorType type() const { return type_; }
  int64_t capacity() const { return capacity_; }
  int64_t size() const { return size_; }
  size_t bytes() const { return layer_offsets_.back(); }  // of the keys (the values take as many)
  // Forgets positions >= n (n <= size()), or every position where a ring has lost keys that the next query
  // needs (model::positions_after_truncate): size() tells which.
  void truncate(int64_t n);

  // Writes the key and value rows (kv_dim floats each) of `position` (< capacity) in `layer`. A forward
  // pass writes its positions in every layer, then marks them filled.
  void store(int64_t layer, int64_t position, const float* key, const float* value);
  void mark_filled(int64_t n);

  // Rows of a layer (capacity, or its ring's), and the row that holds `position` there.
  int64_t rows(int64_t layer) const { return rows_[static_cast<size_t>(layer)]; }
  int64_t row(int64_t layer, int64_t position) const { return position % rows(layer); }
  // The rows of a layer: row r, kv head h starts at element (r * kv_dim + h * head_dim).
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
  size_t layer_offset(int64_t layer) const { return layer_offsets_[static_cast<size_t>(layer)]; }

  const model::ModelConfig& config_;
  TensorType type_;
  int64_t capacity_;
  int64_t max_batch_;
  int64_t kv_dim_;
  size_t element_bytes_;
  std::vector<int64_t> rows_;          // per layer
  std::vector<size_t> layer_offsets_;  // bytes from the start of keys_ (and of values_), per layer, then the end
  int64_t size_ = 0;
  int64_t written_ = 0;  // one past the newest position stored since the cache was last empty
  std::unique_ptr<uint8_t[]> keys_;
  std::unique_ptr<uint8_t[]> values_;
};

}  // namespace rf::cpu
