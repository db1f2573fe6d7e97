#include "loader/chunk_plan.h"

#include <algorithm>

#include "util/error.h"

namespace rf::loader {
namespace {

// The granule a tensor is split at: a row when one fits in a chunk (kernels and repacking work by rows),
// else a quantization block.
uint64_t split_unit(const gguf::TensorInfo& tensor, uint64_t chunk_bytes) {
  const uint64_t row = tensor.bytes / tensor.rows();
  if (row <= chunk_bytes) return row;
  const uint64_t block = tensor.type_info->block_bytes;
  if (block > chunk_bytes)
    fail("chunk size {} bytes cannot hold one {}-byte block of tensor '{}'", chunk_bytes, block, tensor.name);
  return block;
}

uint64_t align_up(uint64_t value, uint64_t alignment) { return (value + alignment - 1) / alignment * alignment; }

}  // namespace

ChunkPlan plan_chunks(const std::vector<std::vector<const gguf::TensorInfo*>>& group_tensors, uint64_t chunk_bytes) {
  ChunkPlan plan;
  for (size_t group = 0; group < group_tensors.size(); ++group) {
    plan.first_chunk.push_back(plan.chunks.size());
    PlannedChunk chunk{group, {}};
    uint64_t used = 0;
    for (const gguf::TensorInfo* tensor : group_tensors[group]) {
      const uint64_t unit = split_unit(*tensor, chunk_bytes);
      uint64_t offset = 0;
      do {
        const uint64_t start = align_up(used, kPieceAlignment);
        const uint64_t room = start < chunk_bytes ? (chunk_bytes - start) / unit * unit : 0;
        const uint64_t take = std::min(tensor->bytes - offset, room);
        if (take == 0 && offset < tensor->bytes) {
          plan.chunks.push_back(std::move(chunk));
          chunk = {group, {}};
          used = 0;
          continue;
        }
        chunk.pieces.push_back({tensor, offset, take, start});
        used = start + take;
        offset += take;
      } while (offset < tensor->bytes);
    }
    if (!chunk.pieces.empty()) plan.chunks.push_back(std::move(chunk));
  }
  plan.first_chunk.push_back(plan.chunks.size());
  return plan;
}

}  // namespace rf::loader
