// Dot products of one quantized weight row with one activation row: the inner loop of every CPU matrix
// product. As in ggml, activations are quantized once per row to an 8-bit block format matching the weight's
// blocks (Q8_0 for the 32-element types, Q8_K for K-quants and IQ4_XS), so kernels multiply integers and
// apply the scales once per block. F32, F16 and BF16 weights take F32 activations.
#pragma once
#include <cstddef>
#include <cstdint>

#include "gguf/tensor_type.h"

namespace rf::cpu {

// The activation block format a weight type's dot product consumes. Throws for unsupported weight types.
TensorType activation_type(TensorType weight_type);
// Bytes of one activation row of `n` elements for that weight type.
size_t activation_bytes(TensorType weight_type, int64_t n);
// `n` f32 activations -> activation_bytes(weight_type, n) bytes at `dst`.
void quantize_activation(TensorType weight_type, const float* x, void* dst, int64_t n);
// Dot product of one weight row of `n` elements with one activation row in activation_type format.
float vec_dot(TensorType weight_type, const void* weight_row, const void* activation, int64_t n);
// Dot products of one weight row with `count` activation rows, activation_stride bytes apart:
// out[t * out_stride] = vec_dot(weight_type, weight_row, activations + t * activation_stride, n), bit for bit.
// A batch (prompt processing) is bound by unpacking weight blocks, not by reading them, so the kernels for the
// common types unpack each block once for a group of activation rows; other types call vec_dot per row.
void vec_dot_rows(TensorType weight_type, const void* weight_row, const void* activations, size_t activation_stride,
                  int64_t count, int64_t n, float* out, int64_t out_stride);

// Weight rows of one tile of vec_dot_tile.
constexpr int kTileRows = 8;
// Whether vec_dot_tile has a kernel for the type in this build (Q4_K, Q5_K and Q6_K with VNNI).
bool has_tile_kernel(TensorType weight_type);
// Dot products of kTileRows weight rows, weight_row_bytes apart, with `count` activation rows:
// out[t * out_stride + i] = dot(weight row i, activation row t) for i < kTileRows, out_stride >= kTileRows.
// Prompt processing: each weight block is unpacked once for all the rows and tokens, and one instruction
// multiplies 8 rows with one token. Equal to vec_dot up to float rounding (the scales are applied in another
// order). Throws where has_tile_kernel is false.
void vec_dot_tile(TensorType weight_type, const void* weight_rows, size_t weight_row_bytes, const void* activations,
                  size_t activation_stride, int64_t count, int64_t n, float* out, int64_t out_stride);

// The portable kernel behind vec_dot, whatever SIMD kernel the build selected: tests check one against the
// other.
float vec_dot_portable(TensorType weight_type, const void* weight_row, const void* activation, int64_t n);
// Which kernel vec_dot runs for a type: "avx2+avx512vnni", "avx2+avxvnni", "avx2" or "portable".
const char* vec_dot_kernel_name(TensorType weight_type);

// Kernels: weight row, activation row, elements. Each kernel file exposes its own table by type; nullptr
// where it has no kernel. vec_dot_portable.cpp covers every supported type; vec_dot_x86.cpp holds the AVX2
// (+ VNNI) kernels and has none when built without AVX2, FMA and F16C.
using VecDotFn = float (*)(const void* weight_row, const void* activation, int64_t n);
// The multi-row form: the arguments of vec_dot_rows after the weight type.
using VecDotRowsFn = void (*)(const void* weight_row, const void* activations, size_t activation_stride, int64_t count,
                              int64_t n, float* out, int64_t out_stride);
// The tile form: the arguments of vec_dot_tile after the weight type.
using VecDotTileFn = void (*)(const void* weight_rows, size_t weight_row_bytes, const void* activations,
                              size_t activation_stride, int64_t count, int64_t n, float* out, int64_t out_stride);
// The kernel vec_dot calls for a type, for a caller making many calls of one type (decoding calls it for
// every piece of every row): one lookup instead of one a call. Throws for unsupported types.
VecDotFn vec_dot_kernel(TensorType weight_type);
VecDotFn portable_vec_dot_kernel(TensorType weight_type);
struct NamedKernel {
  VecDotFn kernel;
  VecDotRowsFn rows;  // nullptr where vec_dot_rows loops over `kernel`
  VecDotTileFn tile;  // nullptr where there is no tile kernel
  const char* name;
};
NamedKernel x86_vec_dot_kernel(TensorType weight_type);
// Activation quantization: f32 values -> blocks, for a count of whole blocks. x86_q8_k_quantizer is the AVX2
// form of quant::quantize_q8_k (the same bytes), nullptr in a build without AVX2.
using QuantizeFn = void (*)(const float* x, void* dst, int64_t n);
QuantizeFn x86_q8_k_quantizer();

}  // namespace rf::cpu
