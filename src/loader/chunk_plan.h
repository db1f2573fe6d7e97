// How a StreamingLoader cuts groups of tensors into chunks, each read into one staging buffer: small tensors
// are packed together, large ones split at row boundaries, and a chunk never mixes groups, so a group is
// complete exactly when its last chunk has been consumed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gguf/gguf.h"
#include "loader/sink.h"

namespace rf::loader {

struct PlannedChunk {
  size_t group;
  std::vector<Piece> pieces;
};

struct ChunkPlan {
  std::vector<PlannedChunk> chunks;  // group by group, in group order
  std::vector<size_t> first_chunk;   // group g owns chunks [first_chunk[g], first_chunk[g + 1])
};

// Where pieces start inside a staging buffer; any copy engine and SIMD loop is at full speed from there.
inline constexpr uint64_t kPieceAlignment = 64;

// `group_tensors[g]` are the tensors group g loads, in order. Each chunk spans at most chunk_bytes of its
// buffer. Throws an rf::Error naming the tensor when chunk_bytes cannot hold one block of it.
ChunkPlan plan_chunks(const std::vector<std::vector<const gguf::TensorInfo*>>& group_tensors, uint64_t chunk_bytes);

}  // namespace rf::loader
