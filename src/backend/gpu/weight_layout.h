// How a weight matrix lies in device memory: the bits of its GGUF blocks, unchanged except for one move that
// makes wide loads possible. Six types store a block as one IEEE half scale d plus a payload whose size is a
// multiple of 4 (Q4_0 Q5_0 Q8_0 IQ4_NL with d first, Q3_K Q6_K with d last); back to back, such blocks are
// only 2-byte aligned. On the device their payloads lie back to back (16-byte aligned for Q4_0, Q8_0, IQ4_NL
// and Q6_K, 4-byte aligned for Q5_0 and Q3_K) and the scales follow in an array of their own. Every other
// type is stored exactly as in the file.
#pragma once
#include <cstdint>

#include "gguf/tensor_type.h"

namespace rf::gpu {

// Byte offset of the split-off half scale inside a stored block, or -1 when the type keeps its blocks whole.
constexpr int split_scale_offset(TensorType type) {
  switch (type) {
    case TensorType::Q4_0:
    case TensorType::Q5_0:
    case TensorType::Q8_0:
    case TensorType::IQ4_NL:
      return 0;
    case TensorType::Q3_K:
      return 108;
    case TensorType::Q6_K:
      return 208;
    default:
      return -1;
  }
}

// What a kernel needs to find block b (counted from the first block of the matrix, row after row): its
// payload at blocks + b * block_stride and, for split types, its scale at scales[b].
struct WeightView {
  const uint8_t* blocks = nullptr;
  const uint16_t* scales = nullptr;
};

// Sizes of a matrix of `blocks` blocks of `type` in the device layout.
struct DeviceLayout {
  uint64_t block_stride;   // bytes from one payload to the next
  uint64_t scales_offset;  // where the scales start (split types), after the payloads
  uint64_t bytes;          // the whole allocation
};

inline DeviceLayout device_layout(TensorType type, uint64_t blocks) {
  const uint64_t block_bytes = tensor_type_info(type).block_bytes;
  if (split_scale_offset(type) < 0) return {block_bytes, 0, blocks * block_bytes};
  const uint64_t payload_end = blocks * (block_bytes - 2);
  const uint64_t scales_offset = (payload_end + 255) / 256 * 256;
  return {block_bytes - 2, scales_offset, scales_offset + blocks * 2};
}

inline WeightView weight_view(const void* device_data, TensorType type, int64_t rows, int64_t cols) {
  const int64_t blocks = rows * cols / tensor_type_info(type).block_elements;
  const auto* base = static_cast<const uint8_t*>(device_data);
  const DeviceLayout layout = device_layout(type, static_cast<uint64_t>(blocks));
  const auto* scales =
      split_scale_offset(type) < 0 ? nullptr : reinterpret_cast<const uint16_t*>(base + layout.scales_offset);
  return {base, scales};
}

}  // namespace rf::gpu
