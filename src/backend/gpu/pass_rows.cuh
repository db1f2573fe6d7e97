// Where the tokens of a pass are, for the kernels that take positions, store keys and values or attend: the position
// of each token in its sequence, and the row of a layer's KV cache that holds a position of that sequence. One
// sequence's tokens (SequenceRows) and a paged batch's (PagedBatchRows) are a template parameter of those kernels, so
// that both run one kernel source and one sequence's pays nothing for block tables.
#pragma once
#include <cstdint>

#include "backend/gpu/kernels.h"

namespace rf::gpu {

// One sequence's tokens, at positions step[0], step[0] + 1, ...; position p in row p of a layer's cache, or in row
// p % ring where the layer keeps a ring (AttentionShape::ring).
struct SequenceRows {
  const int32_t* step;
  int64_t ring;
  __device__ int64_t position(int64_t t) const { return step[0] + t; }
  __device__ int64_t row(int64_t, int64_t p) const { return ring > 0 ? p % ring : p; }
};

// The tokens of a paged pass, each of its own sequence (PagedRows).
struct PagedBatchRows {
  PagedRows paged;
  __device__ int64_t position(int64_t t) const { return paged.positions[t]; }
  __device__ int64_t row(int64_t t, int64_t p) const {
    const int64_t block = paged.blocks[paged.table_starts[t] + p / kKvBlockRows];
    return block * kKvBlockRows + p % kKvBlockRows;
  }
};

}  // namespace rf::gpu
