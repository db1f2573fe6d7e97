// Rotary position embedding and the KV cache write. The angles of every position of the context are computed
// once, with the cache (in double precision, as the CPU backend does, so that long positions keep their accuracy);
// every layer then rotates its queries and keys with them and stores keys and values as f16 rows of the cache. (A
// single token, decoding, is rotated and stored by the decode attention kernel itself.) Computed per forward pass
// instead, the angles of a decoded token took a launch at the head of every token (one thread block in double
// precision), which the first layer waited for.
#include "backend/gpu/device.cuh"
#include "backend/gpu/kernels.h"
#include "backend/gpu/pass_rows.cuh"
#include "backend/gpu/rope.cuh"

namespace rf::gpu {
namespace {

constexpr int kThreads = 256;

__global__ void rope_table_kernel(const double* inverse_frequencies, int64_t pairs, int64_t positions,
                                  float* cos_sin) {
  start_successor();
  wait_for_predecessor();
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (index >= positions * pairs) return;
  const double angle = static_cast<double>(index / pairs) * inverse_frequencies[index % pairs];
  cos_sin[2 * index] = static_cast<float>(cos(angle));
  cos_sin[2 * index + 1] = static_cast<float>(sin(angle));
}

// One thread block per (token, head), one thread per dimension: every thread reads its value and its pair
// partner's, the block waits, then every thread writes its rotated value (in place) and, for a key head, the
// key and value rows of the head into the cache as f16. `Rows` (pass_rows.cuh) says where each token is.
template <typename Rows>
__global__ void rope_store_kernel(AttentionShape shape, float* q, float* k, const float* v, const float* cos_sin,
                                  Rows rows, uint16_t* key_cache, uint16_t* value_cache) {
  start_successor();
  wait_for_predecessor();
  const int64_t t = blockIdx.x;
  const int64_t head = blockIdx.y;
  const int64_t d = threadIdx.x;
  const bool is_key = head >= shape.n_heads;
  const int64_t kv_head = head - shape.n_heads;
  float* row = is_key ? k + t * shape.kv_dim() + kv_head * shape.head_dim : q + t * shape.q_dim() + head * shape.head_dim;
  const int64_t position = rows.position(t);
  const float* angles = position_angles(cos_sin, position, shape);
  const float value =
      d < shape.head_dim ? rotated(row, dimension_rotation(d, shape, dimension_angle(angles, d, shape))) : 0.0f;
  __syncthreads();
  if (d >= shape.head_dim) return;
  row[d] = value;
  if (is_key) {
    const int64_t cache = rows.row(t, position) * shape.kv_dim() + kv_head * shape.head_dim + d;
    key_cache[cache] = float_to_half(value);
    value_cache[cache] = float_to_half(v[t * shape.kv_dim() + kv_head * shape.head_dim + d]);
  }
}

template <typename Rows>
void launch_rope_and_store(const AttentionShape& shape, float* q, float* k, const float* v, const float* cos_sin,
                           int64_t n_tokens, const Rows& rows, uint16_t* key_cache, uint16_t* value_cache,
                           gpuStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>(shape.n_heads + shape.n_kv_heads));
  const auto threads = static_cast<unsigned>((shape.head_dim + 31) / 32 * 32);
  launch_overlapped("rope_and_store", rope_store_kernel<Rows>, grid, threads, 0, stream, shape, q, k, v, cos_sin, rows,
                    key_cache, value_cache);
}

}  // namespace

void rope_table(const double* inverse_frequencies, int64_t pairs, int64_t positions, float* cos_sin,
                gpuStream_t stream) {
  const auto blocks = static_cast<unsigned>((positions * pairs + kThreads - 1) / kThreads);
  launch_overlapped("rope_table", rope_table_kernel, blocks, kThreads, 0, stream, inverse_frequencies, pairs,
                    positions, cos_sin);
}

void rope_and_store(const AttentionShape& shape, float* q, float* k, const float* v, const float* cos_sin,
                    int64_t n_tokens, const int32_t* step, uint16_t* key_cache, uint16_t* value_cache,
                    gpuStream_t stream) {
  launch_rope_and_store(shape, q, k, v, cos_sin, n_tokens, SequenceRows{step, shape.ring}, key_cache, value_cache,
                        stream);
}

void rope_and_store(const AttentionShape& shape, float* q, float* k, const float* v, const float* cos_sin,
                    int64_t n_tokens, const PagedRows& rows, uint16_t* key_cache, uint16_t* value_cache,
                    gpuStream_t stream) {
  launch_rope_and_store(shape, q, k, v, cos_sin, n_tokens, PagedBatchRows{rows}, key_cache, value_cache, stream);
}

}  // namespace rf::gpu
