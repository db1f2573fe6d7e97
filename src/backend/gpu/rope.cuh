// The rotary position embedding of one value, shared by the kernel that rotates and stores a prompt's queries
// and keys (rope.cu) and the decode attention kernel, which rotates its token's query and key as it reads them
// (attention.cu).
#pragma once
#include <cstdint>

#include "backend/gpu/kernels.h"

namespace rf::gpu {

// The angles of `position` in a rope_table: its row of (cos, sin) per dimension pair.
__device__ __forceinline__ const float* position_angles(const float* cos_sin, int64_t position,
                                                        const AttentionShape& shape) {
  return cos_sin + 2 * position * shape.rope_pairs;
}

// The (cos, sin) that rotate dimension d of a head by the angles of one token (cos_sin: (cos, sin) per dimension
// pair); (1, 0) for dimensions past the rotated pairs, which keep their value.
__device__ __forceinline__ float2 dimension_angle(const float* cos_sin, int64_t d, const AttentionShape& shape) {
  const int64_t pairs = shape.rope_pairs;
  if (d >= 2 * pairs) return make_float2(1.0f, 0.0f);
  // Normal: pair i is (2i, 2i + 1). NeoX: pair i is (i, i + pairs).
  const int64_t pair = shape.neox ? d % pairs : d / 2;
  return make_float2(cos_sin[2 * pair], cos_sin[2 * pair + 1]);
}

// How dimension d of a head rotates by `angle` (dimension_angle of d): to head[d] * self + head[partner] * other
// (self 1 and other 0 past the rotated pairs). It depends on the dimension and the token's position only, so the
// decode attention works it out before the head's values exist.
struct DimensionRotation {
  int64_t d, partner;
  float self, other;
};
__device__ __forceinline__ DimensionRotation dimension_rotation(int64_t d, const AttentionShape& shape, float2 angle) {
  const int64_t pairs = shape.rope_pairs;
  if (d >= 2 * pairs) return {d, d, 1.0f, 0.0f};
  const bool first = shape.neox ? d < pairs : d % 2 == 0;
  const int64_t partner = shape.neox ? (first ? d + pairs : d - pairs) : d ^ 1;
  return {d, partner, angle.x, first ? -angle.y : angle.y};
}

// A head's value after `rotation`; `head` holds the head's values before rotation.
// `Head`: a pointer to the head's values, or anything else that gives value d as head[d].
template <typename Head>
__device__ __forceinline__ float rotated(const Head& head, const DimensionRotation& rotation) {
  return head[rotation.d] * rotation.self + head[rotation.partner] * rotation.other;
}

}  // namespace rf::gpu
