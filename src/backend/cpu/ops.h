// The element-wise and per-head kernels of a forward pass, on f32 activations. Matrix products are
// in matmul.h; these are the cheap operations between them.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/config.h"

namespace rf::cpu {

// out = x / sqrt(mean(x^2) + eps) * weight, for one row of n values (out may be x).
void rmsnorm(float* out, const float* x, const float* weight, int64_t n, float eps);

// out = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias, for one row of n values (out may be x; bias may be
// null).
void layernorm(float* out, const float* x, const float* weight, const float* bias, int64_t n, float eps);

// x = exp(x - max) / sum, in place.
void softmax(float* x, int64_t n);

// gate = silu(gate) * up, where silu(g) = g / (1 + exp(-g)).
void swiglu(float* gate, const float* up, int64_t n);

// gate = gelu(gate) * up, with GELU's tanh form as llama.cpp computes it.
void geglu(float* gate, const float* up, int64_t n);
// x = gelu(x).
void gelu(float* x, int64_t n);

// x = cap * tanh(x / cap): soft-capping (Gemma 2).
void soft_cap(float* x, int64_t n, float cap);

// Each of `rows` rows of `width` values += bias.
void add_rows(float* x, const float* bias, int64_t rows, int64_t width);

// x += y.
void add(float* x, const float* y, int64_t n);

// (cos, sin) of position * inverse_frequency[i] for every pair i: 2 * inverse_frequencies.size() floats.
void rope_angles(float* cos_sin, int64_t position, std::span<const double> inverse_frequencies);

// Rotates the first 2 * n_pairs dimensions of each of `n_heads` heads of `head_dim` values by the angles of
// one position (from rope_angles); Normal style pairs neighbours, NeoX pairs the two halves.
void rope(float* heads, int64_t n_heads, int64_t head_dim, const float* cos_sin, int64_t n_pairs,
          model::RopeStyle style);

// Rows [first, first + count) of a layer's KV cache.
struct RowRange {
  int64_t first;
  int64_t count;
  bool operator==(const RowRange&) const = default;
};

// One query head attending over the cached positions in `ranges` (oldest first; a ring wraps into two, a paged
// block table gives one per run of consecutive blocks) of its key/value head:
// out = softmax(s_j) weighted sum of v_j, s_j = scale * q . k_j, soft-capped where cap > 0. Keys and values are
// f32 or f16 (uint16_t) rows of `head_dim` values, `stride` elements apart. `scores` holds a float of scratch per
// position.
template <typename KvElement>
void attend(float* out, const float* q, const KvElement* keys, const KvElement* values,
            std::span<const RowRange> ranges, int64_t stride, int64_t head_dim, float scale, float cap, float* scores);

}  // namespace rf::cpu
