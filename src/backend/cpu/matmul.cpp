#include "backend/cpu/matmul.h"

#include <algorithm>

#include "backend/cpu/vec_dot.h"
#include "quant/quant.h"
#include "util/error.h"

namespace rf::cpu {

Matrix matrix_of(const model::LazyTensor& weight) {
  return {weight.type(), static_cast<const uint8_t*>(weight.data()) + weight.stored_offset(), weight.rows(),
          weight.cols(), weight.row_bytes()};
}

void QuantizedRows::set(const float* x, int64_t rows, int64_t cols) {
  x_ = x;
  rows_ = rows;
  cols_ = cols;
  for (Quantized& q : quantized_) q.current = false;
}

size_t QuantizedRows::row_bytes(TensorType weight_type) const {
  return float_activations_ ? static_cast<size_t>(cols_) * sizeof(float) : activation_bytes(weight_type, cols_);
}

void QuantizedRows::prepare(TensorType weight_type, ThreadPool& pool) {
  if (float_activations_) return;
  const TensorType type = activation_type(weight_type);
  auto it = std::find_if(quantized_.begin(), quantized_.end(), [&](const Quantized& q) { return q.type == type; });
  if (it == quantized_.end()) it = quantized_.insert(quantized_.end(), Quantized{type, false, {}});
  if (it->current) return;
  const size_t bytes_per_row = row_bytes(weight_type);
  if (it->bytes.size() < bytes_per_row * static_cast<size_t>(rows_)) it->bytes.resize(bytes_per_row * rows_);
  uint8_t* dst = it->bytes.data();
  pool.parallel_for(rows_, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t)
      quantize_activation(weight_type, x_ + t * cols_, dst + t * bytes_per_row, cols_);
  });
  it->current = true;
}

const uint8_t* QuantizedRows::quantized(TensorType weight_type) const {
  if (float_activations_) return reinterpret_cast<const uint8_t*>(x_);
  const TensorType type = activation_type(weight_type);
  for (const Quantized& q : quantized_)
    if (q.type == type && q.current) return q.bytes.data();
  fail("activations were not prepared for {} weights", tensor_type_name(weight_type));
}

namespace {

// A batch is multiplied block by block: a few weight rows (they stay in L1/L2) against groups of activation
// rows (a group stays in L2), so every weight byte comes from memory once however many tokens there are.
constexpr int64_t kRowBlock = 16;
constexpr size_t kActivationGroupBytes = 1024 * 1024;  // of the 2 MB L2 of the target machine
// From this many tokens on, whole tiles of kTileRows weight rows go through vec_dot_tile where the type has a
// tile kernel; fewer tokens would not repay unpacking a tile's blocks.
constexpr int64_t kMinTileTokens = 4;

// Decoding (one input row) streams each weight row from memory once. A core walking one contiguous range of
// rows stalls with its line fill buffers full of software prefetches; walking several ranges at once gives the
// hardware prefetcher several streams to run ahead on. The streams take turns by pieces of 1024 columns (576
// bytes of Q4_K), not whole rows: with whole rows of 8192 columns (4.6 KB of Q4_K, the FFN down projection) the
// products reached 22 GB/s on the target machine against 26-28 by pieces (docs/PERFORMANCE.md). A row's
// result is then the sum of its pieces' dot products.
constexpr int64_t kDecodeStreams = 4;
constexpr int64_t kDecodePieceCols = 1024;

// Rows [first, last) of one product for a single input row.
void multiply_vector(const Product& product, const uint8_t* activation, int64_t first, int64_t last) {
  const Matrix& w = product.weight;
  const int64_t stream_rows = (last - first + kDecodeStreams - 1) / kDecodeStreams;
  const int64_t piece_cols = w.cols % kDecodePieceCols == 0 ? kDecodePieceCols : w.cols;
  const size_t piece_bytes = row_bytes(w.type, piece_cols);
  const size_t piece_activation_bytes = activation_bytes(w.type, piece_cols);
  const VecDotFn dot = vec_dot_kernel(w.type);
  for (int64_t i = 0; i < stream_rows; ++i) {
    for (int64_t r = first + i; r < last; r += stream_rows) product.out[r] = 0;
    for (int64_t c = 0; c < w.cols / piece_cols; ++c)
      for (int64_t r = first + i; r < last; r += stream_rows)
        product.out[r] += dot(w.data + r * w.row_bytes + c * piece_bytes, activation + c * piece_activation_bytes,
                              piece_cols);
  }
}

// Rows [first, last) of one product with f32 activations and weights of a type whose dot product takes 8-bit
// ones: each weight row dequantized, then multiplied as an F32 row with every input row.
void multiply_dequantized_rows(const Product& product, const QuantizedRows& input, int64_t first, int64_t last) {
  const Matrix& w = product.weight;
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(w.cols));
  for (int64_t r = first; r < last; ++r) {
    quant::dequantize(w.type, w.data + r * w.row_bytes, row.data(), w.cols);
    vec_dot_rows(TensorType::F32, row.data(), input.quantized(TensorType::F32), input.row_bytes(TensorType::F32),
                 input.rows(), w.cols, product.out + r, w.rows);
  }
}

// Rows [first, last) of one product, for every input row.
void multiply_rows(const Product& product, const QuantizedRows& input, int64_t first, int64_t last) {
  const Matrix& w = product.weight;
  if (input.float_activations() && activation_type(w.type) != TensorType::F32) {
    multiply_dequantized_rows(product, input, first, last);
    return;
  }
  const uint8_t* activations = input.quantized(w.type);
  const size_t stride = input.row_bytes(w.type);
  const int64_t tokens = input.rows();
  if (tokens == 1) {
    multiply_vector(product, activations, first, last);
    return;
  }
  const bool tiles = tokens >= kMinTileTokens && has_tile_kernel(w.type);
  const auto group = std::max<int64_t>(1, static_cast<int64_t>(kActivationGroupBytes / stride));
  for (int64_t block = first; block < last; block += kRowBlock) {
    const int64_t block_end = std::min(last, block + kRowBlock);
    for (int64_t t0 = 0; t0 < tokens; t0 += group) {
      const int64_t count = std::min(tokens, t0 + group) - t0;
      const uint8_t* group_activations = activations + t0 * stride;
      float* group_out = &product.out[t0 * w.rows];
      int64_t r = block;
      for (; tiles && r + kTileRows <= block_end; r += kTileRows)
        vec_dot_tile(w.type, w.data + r * w.row_bytes, w.row_bytes, group_activations, stride, count, w.cols,
                     group_out + r, w.rows);
      for (; r < block_end; ++r)
        vec_dot_rows(w.type, w.data + r * w.row_bytes, group_activations, stride, count, w.cols, group_out + r, w.rows);
    }
  }
}

}  // namespace

void matmul(ThreadPool& pool, std::span<const Product> products, QuantizedRows& input) {
  int64_t total_rows = 0;
  for (const Product& product : products) {
    if (product.weight.cols != input.cols())
      fail("matmul: input rows have {} values, the weight rows {}", input.cols(), product.weight.cols);
    input.prepare(product.weight.type, pool);
    total_rows += product.weight.rows;
  }
  // Chunks of at least ~32K multiply-adds keep the cost of handing out a chunk negligible.
  const int64_t grain = std::max<int64_t>(1, 32768 / (input.cols() * input.rows()));
  // The products' rows, one after another, are shared out as one range.
  pool.parallel_for(total_rows, grain, [&](int64_t begin, int64_t end, int) {
    int64_t offset = 0;
    for (const Product& product : products) {
      const int64_t first = std::max(begin, offset) - offset;
      const int64_t last = std::min(end, offset + product.weight.rows) - offset;
      if (first < last) multiply_rows(product, input, first, last);
      offset += product.weight.rows;
    }
  });
}

}  // namespace rf::cpu
