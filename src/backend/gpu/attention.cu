// Attention over the f16 KV cache.
//
// Decoding (one query token): split-K. Thread block (kv head, chunk) computes, for every query head that
// shares the kv head (GQA), the scores of the chunk's positions, their softmax with its own maximum, and the
// weighted sum of the values; it reads each key and value of the chunk once for all those heads. A second
// kernel rescales the chunks' partial results to a common maximum and sums them.
//
// Prompts (several query tokens): flash-attention style. A team of 32 lanes owns one (token, head), keeps
// the query in shared memory and the output accumulator in registers (lane l has dimensions l, l + 32, ...)
// and streams over the keys and values the token may see, 32 at a time, with an online softmax, so no score
// matrix is ever stored.
#include <cmath>

#include "backend/gpu/device.cuh"
#include "backend/gpu/kernels.h"

namespace rf::gpu {
namespace {

constexpr int kThreads = 128;
constexpr int kTeams = kThreads / kTeam;

int64_t max_splits(int64_t context) { return (context + kAttentionChunk - 1) / kAttentionChunk; }

// partials: per query head and chunk, head_dim unnormalized outputs, then the chunk's maximum and sum.
__global__ void __launch_bounds__(kThreads) attention_chunk_kernel(AttentionShape shape, const float* q,
                                                                   const uint16_t* keys, const uint16_t* values,
                                                                   const int32_t* step, int64_t splits,
                                                                   float scale, float* partials) {
  start_successor();
  wait_for_predecessor();
  extern __shared__ float shared[];
  const int64_t chunk = blockIdx.x;  // x: grids allow 2^31 - 1 blocks there, 65535 in y (1M positions)
  const int64_t kv_head = blockIdx.y;
  const int64_t begin = chunk * kAttentionChunk;
  const int64_t positions = step[0] + 1;
  if (begin >= positions) return;
  const int64_t count = min(kAttentionChunk, positions - begin);
  const int64_t group = shape.heads_per_kv_head();
  const int64_t head_dim = shape.head_dim;
  const int64_t kv_dim = shape.kv_dim();
  float* q_shared = shared;                                 // [group][head_dim]
  float* scores = q_shared + group * head_dim;              // [group][kAttentionChunk]
  float* stats = scores + group * kAttentionChunk;          // [group][2]: maximum, sum

  for (int64_t i = threadIdx.x; i < group * head_dim; i += kThreads)
    q_shared[i] = q[kv_head * group * head_dim + i];
  __syncthreads();

  // Scores: a thread per position, all heads of the group at once (the key is read once, 16 bytes at a time
  // where the head dimension allows).
  for (int64_t p = threadIdx.x; p < count; p += kThreads) {
    const uint16_t* key = keys + (begin + p) * kv_dim + kv_head * head_dim;
    float dot[kMaxHeadsPerKvHead] = {};
    int64_t d = 0;
    if (head_dim % 8 == 0) {
      for (; d < head_dim; d += 8) {
        const int4 k8 = load_16(key + d);
        float k[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 pair = __half22float2(*reinterpret_cast<const __half2*>(&reinterpret_cast<const int*>(&k8)[i]));
          k[2 * i] = pair.x;
          k[2 * i + 1] = pair.y;
        }
#pragma unroll
        for (int g = 0; g < kMaxHeadsPerKvHead; ++g) {
          if (g < group) {
            const float4 qa = *reinterpret_cast<const float4*>(q_shared + g * head_dim + d);
            const float4 qb = *reinterpret_cast<const float4*>(q_shared + g * head_dim + d + 4);
            dot[g] += k[0] * qa.x + k[1] * qa.y + k[2] * qa.z + k[3] * qa.w + k[4] * qb.x + k[5] * qb.y +
                      k[6] * qb.z + k[7] * qb.w;
          }
        }
      }
    }
    for (; d < head_dim; d += 2) {
      const float2 k = __half22float2(*reinterpret_cast<const __half2*>(key + d));
#pragma unroll
      for (int g = 0; g < kMaxHeadsPerKvHead; ++g)
        if (g < group) dot[g] += k.x * q_shared[g * head_dim + d] + k.y * q_shared[g * head_dim + d + 1];
    }
#pragma unroll
    for (int g = 0; g < kMaxHeadsPerKvHead; ++g)
      if (g < group) scores[g * kAttentionChunk + p] = dot[g] * scale;
  }
  __syncthreads();

  // Softmax of each head's chunk (one team per head): maximum, then exponentials and their sum.
  const int team = static_cast<int>(threadIdx.x / kTeam);
  const int lane = static_cast<int>(threadIdx.x % kTeam);
  for (int64_t g = team; g < group; g += kTeams) {
    float* row = scores + g * kAttentionChunk;
    float maximum = -INFINITY;
    for (int64_t p = lane; p < count; p += kTeam) maximum = fmaxf(maximum, row[p]);
    maximum = team_max(maximum);
    float sum = 0.0f;
    for (int64_t p = lane; p < count; p += kTeam) {
      row[p] = expf(row[p] - maximum);
      sum += row[p];
    }
    sum = team_sum(sum);
    if (lane == 0) {
      stats[2 * g] = maximum;
      stats[2 * g + 1] = sum;
    }
  }
  __syncthreads();

  // Weighted values: a thread per (head, dimension pair); consecutive threads read consecutive pairs.
  for (int64_t i = threadIdx.x; i < group * head_dim / 2; i += kThreads) {
    const int64_t g = i / (head_dim / 2);
    const int64_t d = 2 * (i % (head_dim / 2));
    const float* weights = scores + g * kAttentionChunk;
    const uint16_t* value = values + begin * kv_dim + kv_head * head_dim + d;
    float2 acc = {0.0f, 0.0f};
#pragma unroll 8
    for (int64_t p = 0; p < count; ++p) {
      const float2 v = __half22float2(*reinterpret_cast<const __half2*>(value + p * kv_dim));
      acc.x += weights[p] * v.x;
      acc.y += weights[p] * v.y;
    }
    float* partial = partials + ((kv_head * group + g) * splits + chunk) * (head_dim + 2);
    partial[d] = acc.x;
    partial[d + 1] = acc.y;
    if (d == 0) {
      partial[head_dim] = stats[2 * g];
      partial[head_dim + 1] = stats[2 * g + 1];
    }
  }
}

__global__ void __launch_bounds__(kThreads) attention_combine_kernel(AttentionShape shape, const int32_t* step,
                                                                     int64_t splits, const float* partials,
                                                                     float* out) {
  start_successor();
  wait_for_predecessor();
  const int64_t head = blockIdx.x;
  const int64_t head_dim = shape.head_dim;
  const int64_t used = (step[0] + kAttentionChunk) / kAttentionChunk;  // chunks holding positions 0..step[0]
  const float* head_partials = partials + head * splits * (head_dim + 2);
  float maximum = -INFINITY;
  for (int64_t c = 0; c < used; ++c) maximum = fmaxf(maximum, head_partials[c * (head_dim + 2) + head_dim]);
  float total = 0.0f;
  for (int64_t c = 0; c < used; ++c) {
    const float* partial = head_partials + c * (head_dim + 2);
    total += partial[head_dim + 1] * expf(partial[head_dim] - maximum);
  }
  for (int64_t d = threadIdx.x; d < head_dim; d += kThreads) {
    float acc = 0.0f;
    for (int64_t c = 0; c < used; ++c) {
      const float* partial = head_partials + c * (head_dim + 2);
      acc += partial[d] * expf(partial[head_dim] - maximum);
    }
    out[head * head_dim + d] = acc / total;
  }
}

template <int kDimsPerLane>
__global__ void __launch_bounds__(kThreads) attention_prompt_kernel(AttentionShape shape, const float* q,
                                                                    const uint16_t* keys, const uint16_t* values,
                                                                    int64_t n_tokens, const int32_t* step,
                                                                    float scale, float* out) {
  start_successor();
  wait_for_predecessor();
  __shared__ float4 q_shared[kTeams][kMaxHeadDim / 4];
  const int team = static_cast<int>(threadIdx.x / kTeam);
  const int lane = static_cast<int>(threadIdx.x % kTeam);
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kTeams + team;
  const bool valid = item < n_tokens * shape.n_heads;
  const int64_t t = valid ? item / shape.n_heads : 0;
  const int64_t head = item % shape.n_heads;
  const int64_t head_dim = shape.head_dim;
  const int64_t kv_offset = head / shape.heads_per_kv_head() * head_dim;
  const int64_t kv_dim = shape.kv_dim();
  const float* q_head = q + t * shape.q_dim() + head * head_dim;
  auto* q_team = reinterpret_cast<float*>(q_shared[team]);
  for (int64_t d = lane; d < head_dim; d += kTeam) q_team[d] = valid ? q_head[d] * scale : 0.0f;
  __syncthreads();
  if (!valid) return;

  float acc[kDimsPerLane] = {};
  float maximum = -INFINITY;
  float sum = 0.0f;
  const int64_t positions = step[0] + t + 1;
  // 32 keys per step, one per lane: lane k scores key first + k on its own (the query is in shared memory,
  // the key row is read 16 bytes at a time), the team takes the step's maximum and sum, and then every lane
  // accumulates the weighted values of the 32 keys for its dimensions (l, l + 32, ...).
  for (int64_t first = 0; first < positions; first += kTeam) {
    const int64_t p = first + lane;
    float score = -INFINITY;
    if (p < positions) {
      const uint16_t* key = keys + p * kv_dim + kv_offset;
      float dot = 0.0f;
      int64_t d = 0;
      if (head_dim % 8 == 0) {  // rows of whole 16-byte pieces
        for (; d < head_dim; d += 8) {
          const int4 k8 = load_16(key + d);
          const float4 qa = q_shared[team][d / 4];
          const float4 qb = q_shared[team][d / 4 + 1];
          const float2 k01 = __half22float2(*reinterpret_cast<const __half2*>(&k8.x));
          const float2 k23 = __half22float2(*reinterpret_cast<const __half2*>(&k8.y));
          const float2 k45 = __half22float2(*reinterpret_cast<const __half2*>(&k8.z));
          const float2 k67 = __half22float2(*reinterpret_cast<const __half2*>(&k8.w));
          dot += qa.x * k01.x + qa.y * k01.y + qa.z * k23.x + qa.w * k23.y + qb.x * k45.x + qb.y * k45.y +
                 qb.z * k67.x + qb.w * k67.y;
        }
      }
      for (; d < head_dim; d += 2) {
        const float2 k2 = __half22float2(*reinterpret_cast<const __half2*>(key + d));
        dot += q_team[d] * k2.x + q_team[d + 1] * k2.y;
      }
      score = dot;
    }
    const float step_maximum = fmaxf(maximum, team_max(score));
    const float weight = p < positions ? expf(score - step_maximum) : 0.0f;
    const float rescale = expf(maximum - step_maximum);
    sum = sum * rescale + team_sum(weight);
#pragma unroll
    for (int j = 0; j < kDimsPerLane; ++j) acc[j] *= rescale;
    const int64_t keys_here = min(static_cast<int64_t>(kTeam), positions - first);
    for (int k = 0; k < keys_here; ++k) {
      const float w = shuffle(weight, k, kTeam);
      const uint16_t* value = values + (first + k) * kv_dim + kv_offset;
#pragma unroll
      for (int j = 0; j < kDimsPerLane; ++j) {
        const int64_t d = lane + j * kTeam;
        if (d < head_dim) acc[j] += w * half_to_float(value[d]);
      }
    }
    maximum = step_maximum;
  }
  float* out_head = out + t * shape.q_dim() + head * head_dim;
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) {
    const int64_t d = lane + j * kTeam;
    if (d < head_dim) out_head[d] = acc[j] / sum;
  }
}

float attention_scale(const AttentionShape& shape) { return 1.0f / std::sqrt(static_cast<float>(shape.head_dim)); }

}  // namespace

int64_t attention_partials_floats(const AttentionShape& shape, int64_t context) {
  return shape.n_heads * max_splits(context) * (shape.head_dim + 2);
}

void attention_decode(const AttentionShape& shape, const float* q, const uint16_t* key_cache,
                      const uint16_t* value_cache, int64_t context, const int32_t* step, float* partials, float* out,
                      gpuStream_t stream) {
  const int64_t splits = max_splits(context);
  const int64_t group = shape.heads_per_kv_head();
  const size_t shared_bytes = sizeof(float) * static_cast<size_t>(group * (shape.head_dim + kAttentionChunk + 2));
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(shape.n_kv_heads));
  launch_overlapped("attention_chunk", attention_chunk_kernel, grid, kThreads, shared_bytes, stream, shape, q,
                    key_cache, value_cache, step, splits, attention_scale(shape), partials);
  launch_overlapped("attention_combine", attention_combine_kernel, static_cast<unsigned>(shape.n_heads), kThreads, 0,
                    stream, shape, step, splits, partials, out);
}

void attention_prompt(const AttentionShape& shape, const float* q, const uint16_t* key_cache,
                      const uint16_t* value_cache, int64_t n_tokens, const int32_t* step, float* out,
                      gpuStream_t stream) {
  const auto blocks = static_cast<unsigned>((n_tokens * shape.n_heads + kTeams - 1) / kTeams);
  const float scale = attention_scale(shape);
  const auto run = [&]<int kDimsPerLane>() {
    launch_overlapped("attention_prompt", attention_prompt_kernel<kDimsPerLane>, blocks, kThreads, 0, stream, shape, q,
                      key_cache, value_cache, n_tokens, step, scale, out);
  };
  if (shape.head_dim <= 32)
    run.template operator()<1>();
  else if (shape.head_dim <= 64)
    run.template operator()<2>();
  else if (shape.head_dim <= 128)
    run.template operator()<4>();
  else
    run.template operator()<8>();
}

}  // namespace rf::gpu
