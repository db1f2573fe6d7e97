// The registry of ggml tensor type ids as GGUF stores them: name (spelled as llama.cpp spells it), elements
// per block and bytes per block. The ids and sizes are part of the file format, so the registry lives here;
// src/quant adds the arithmetic (dequantize, quantize, dot products) for the types it supports.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rf {

enum class TensorType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct TensorTypeInfo {
  TensorType type;
  std::string_view name;
  uint32_t block_elements;  // elements per block (1 for plain types)
  uint32_t block_bytes;     // bytes per block
};

// Every id a current GGUF file may carry. Ids retired by ggml (4, 5, 31-33, 36-38) are not listed.
const TensorTypeInfo* find_tensor_type(uint32_t id);
const TensorTypeInfo& tensor_type_info(TensorType type);
std::string_view tensor_type_name(TensorType type);
// Case-insensitive lookup by name ("q4_k" or "Q4_K").
std::optional<TensorType> tensor_type_from_name(std::string_view name);

// Bytes of a row of `elements` elements; elements must be a multiple of the block size.
uint64_t row_bytes(TensorType type, uint64_t elements);

}  // namespace rf
