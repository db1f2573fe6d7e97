// Matrix products on quantized weights, computed block by block where the weights lie (no dequantized copy
// of a matrix). Activation rows are quantized once to the type the weight's dot product expects (8-bit
// blocks, as llama.cpp does) and reused for every weight row; the weight rows are shared out over the
// thread pool, so a matrix is streamed from memory once per product whatever the number of tokens.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "gguf/tensor_type.h"
#include "model/lazy_tensor.h"

namespace rf::cpu {

// A weight matrix in its stored layout: `rows` rows (outputs) of `cols` elements (inputs), row_bytes apart.
struct Matrix {
  TensorType type;
  const uint8_t* data;
  int64_t rows;
  int64_t cols;
  size_t row_bytes;
};

// The matrix of a weight, materializing it on first use.
Matrix matrix_of(const model::LazyTensor& weight);

// Rows of f32 activations and their quantized forms, one per activation type, made when a product first
// needs them: the q, k and v projections (or gate and up) read the same rows and quantize them once. Buffers are kept
// across calls, so steady-state decoding allocates nothing.
class QuantizedRows {
 public:
  // `float_activations`: products take the f32 rows whatever the weight type, and quantized weights are
  // dequantized row by row to meet them (TransformerOptions::float_activations).
  explicit QuantizedRows(bool float_activations = false) : float_activations_(float_activations) {}
  bool float_activations() const { return float_activations_; }
  // Points at `rows` rows of `cols` floats (kept by the caller until the next set) and drops the
  // quantized forms of the previous rows.
  void set(const float* x, int64_t rows, int64_t cols);
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // Quantizes the rows as `weight_type`'s dot product takes them, unless that is done already.
  void prepare(TensorType weight_type, ThreadPool& pool);
  // The prepared rows for `weight_type`, row_bytes(weight_type) apart.
  const uint8_t* quantized(TensorType weight_type) const;
  size_t row_bytes(TensorType weight_type) const;

 private:
  struct Quantized {
    TensorType type;  // activation type
    bool current;
    std::vector<uint8_t> bytes;
  };
  bool float_activations_;
  const float* x_ = nullptr;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  std::vector<Quantized> quantized_;
};

// One product of a weight with the input rows: out[t * weight.rows + r] = dot(weight row r, input row t).
struct Product {
  Matrix weight;
  float* out;
};

// Runs products that share their input rows as one job over the pool (the q, k and v projections; gate and
// up), so that threads meet once instead of once per matrix.
void matmul(ThreadPool& pool, std::span<const Product> products, QuantizedRows& input);
inline void matmul(ThreadPool& pool, const Matrix& weight, QuantizedRows& input, float* out) {
  const Product product{weight, out};
  matmul(pool, {&product, 1}, input);
}

}  // namespace rf::cpu
