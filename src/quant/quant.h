// Block formats: dequantize to f32 and quantize from f32 for the tensor types ROCmForge computes with.
// Layouts are bit-identical to ggml's, so GGUF files from llama.cpp load as they are.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "gguf/tensor_type.h"

namespace rf::quant {

// F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS.
bool is_supported(TensorType type);
std::span<const TensorType> supported_types();
// Throws an Error naming the type and `what` needs it ("tensor 'blk.0.attn_q.weight'") when unsupported.
void require_supported(TensorType type, std::string_view what);

// `n` elements (a multiple of the block size) of blocks at `src` -> f32.
void dequantize(TensorType type, const void* src, float* dst, int64_t n);
// Same, split over `threads` threads for big tensors (0 = all cores).
void dequantize_parallel(TensorType type, const void* src, float* dst, int64_t n, int threads = 0);

// `rows` rows of `n_per_row` f32 values -> blocks at `dst` (rows * row_bytes(type, n_per_row) bytes).
// K-quants and IQ4 search their scales as llama.cpp's reference quantizer does.
void quantize(TensorType type, const float* src, void* dst, int64_t rows, int64_t n_per_row);

// Q8_K, the activation format of K-quant and IQ4_XS dot products (no file stores it): `n` f32 values, a
// multiple of 256, -> n / 256 BlockQ8_K (quant/blocks.h).
void quantize_q8_k(const float* src, void* dst, int64_t n);

}  // namespace rf::quant
