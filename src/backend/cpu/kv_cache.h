// Keys and values of the positions evaluated so far, so that a new token attends to the past without recomputing
// it. Each layer's rows come in blocks of model::kKvBlockPositions, and a sequence finds its positions through a
// block table that may wrap: position p is in block table[p / kKvBlockPositions % n], n the table's blocks in that
// layer, slot p % kKvBlockPositions.
//
// One sequence's cache keeps its positions in order: its table is the identity, and a sliding-window layer keeps
// only a ring of its last positions (model::kv_cache_rows), where that saves memory, so the table wraps there.
// Positions [0, size()) are valid; a chat that keeps a common prefix truncates to it and continues from there.
// A paged cache is a pool of blocks that the sequences of a batch share, each by its own table
// (engine::KvBlockPool decides which block holds what); it keeps every position, sliding-window layers too.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/cpu/ops.h"
#include "gguf/tensor_type.h"
#include "model/config.h"
#include "model/forward_pass.h"

namespace rf::cpu {

class KvCache {
 public:
  // One sequence's cache of `capacity` positions, filled by passes of at most `max_batch` tokens; `type` is F16
  // (half the memory, llama.cpp's default) or F32. Memory is reserved, not touched: pages are committed as
  // positions fill. `config` must outlive the cache.
  KvCache(const model::ModelConfig& config, int64_t capacity, TensorType type, int64_t max_batch);
  // A paged cache of `blocks` blocks in every layer.
  static KvCache paged(const model::ModelConfig& config, int64_t blocks, TensorType type);

  TensorType type() const { return type_; }
  int64_t capacity() const { return capacity_; }
  int64_t size() const { return size_; }
  size_t bytes() const { return layer_offsets_.back(); }  // of the keys (the values take as many)
  // Forgets positions >= n (n <= size()), or every position where a ring has lost keys that the next query
  // needs (model::positions_after_truncate): size() tells which.
  void truncate(int64_t n);

  // The block table of one sequence's cache: 0, 1, 2, ... (as many as the layer with the most blocks holds).
  std::span<const model::BlockId> contiguous_table() const { return contiguous_table_; }
  // Rows of a layer (whole blocks), and the row that holds `position` there for a sequence of block table `table`.
  int64_t rows(int64_t layer) const { return rows_[static_cast<size_t>(layer)]; }
  int64_t row(int64_t layer, std::span<const model::BlockId> table, int64_t position) const;
  // Appends the rows that hold positions [first, first + count) of such a sequence to `ranges`, oldest first,
  // consecutive rows as one range.
  void append_rows(int64_t layer, std::span<const model::BlockId> table, int64_t first, int64_t count,
                   std::vector<RowRange>& ranges) const;

  // Writes the key and value rows (kv_dim floats each) of `row` in `layer`. A forward pass writes its positions
  // in every layer, then marks them filled (one sequence's cache).
  void store(int64_t layer, int64_t row, const float* key, const float* value);
  void mark_filled(int64_t n);
  // Copies the keys and values of block `source` into block `destination`, in every layer (a paged cache).
  void copy_block(model::BlockId source, model::BlockId destination);

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
  // `rows`: per layer, whole blocks.
  KvCache(const model::ModelConfig& config, int64_t capacity, TensorType type, int64_t max_batch,
          std::vector<int64_t> rows);
  size_t layer_offset(int64_t layer) const { return layer_offsets_[static_cast<size_t>(layer)]; }
  // The blocks of `table` that layer `layer` holds: the table wraps after them.
  std::span<const model::BlockId> layer_table(int64_t layer, std::span<const model::BlockId> table) const;

  const model::ModelConfig& config_;
  TensorType type_;
  int64_t capacity_;
  int64_t max_batch_;
  int64_t kv_dim_;
  size_t element_bytes_;
  std::vector<int64_t> rows_;          // per layer
  std::vector<size_t> layer_offsets_;  // bytes from the start of keys_ (and of values_), per layer, then the end
  std::vector<model::BlockId> contiguous_table_;
  int64_t size_ = 0;
  int64_t written_ = 0;  // one past the newest position stored since the cache was last empty
  std::unique_ptr<uint8_t[]> keys_;
  std::unique_ptr<uint8_t[]> values_;
};

}  // namespace rf::cpu
