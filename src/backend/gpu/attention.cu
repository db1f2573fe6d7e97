// Attention over the f16 KV cache.
//
// Decoding (one query token): split-K in a single launch, which also rotates the token's query and key and
// stores its key and value in the cache (a launch of its own for prompts). The positions are cut into chunks of
// kAttentionChunk; a fixed number of thread blocks per kv head (a few per multiprocessor in all, at most one
// per chunk of the context) share the chunks that hold positions 0 .. step[0], block b taking chunks b,
// b + blocks, ... The grid depends on the context only, not on the position, so a captured decode step
// replays for every token; blocks without a chunk go straight to the end. For every query head that shares
// the kv head (GQA) a block scores a chunk's positions, reading each key and value once for all those heads,
// and folds the chunk into a running softmax (its maximum, its sum and the weighted values), which it writes
// out as one partial result per head. The last block to finish among those of a combine group learns so
// from a counter in device memory; it rescales the group's partials to a common maximum, sums them, and
// writes the output rows together with their 8-bit form for the o-projection, which would otherwise take a
// combine kernel and a quantization kernel of their own. A combine group is the fewest consecutive kv heads
// whose query heads fill whole quantization blocks (usually one), so that every block is quantized by the
// one thread block that holds all its values.
//
// Prompts (several query tokens): flash-attention style. A team of 32 lanes owns one (token, head), keeps
// the query in shared memory and the output accumulator in registers (lane l has dimensions l, l + 32, ...)
// and streams over the keys and values the token may see, 32 at a time, with an online softmax, so no score
// matrix is ever stored.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/gpu/device.cuh"
#include "backend/gpu/kernels.h"
#include "backend/gpu/quantize.cuh"
#include "backend/gpu/rope.cuh"

namespace rf::gpu {
namespace {

constexpr int kThreads = 128;
constexpr int kTeams = kThreads / kTeam;

// The decode kernel quantizes its output as quantize_element() does: a Q8_K block is a whole thread block.
constexpr int kDecodeThreads = kQuantizeThreads;
constexpr int kDecodeTeams = kDecodeThreads / kTeam;
constexpr int kChunk = static_cast<int>(kAttentionChunk);
// Lanes that score one position together, each over every kLanesPerPosition-th piece of the head.
constexpr int kLanesPerPosition = kDecodeThreads / kChunk;
static_assert(kDecodeThreads % kChunk == 0 && kLanesPerPosition <= kTeam, "a position's lanes share a team");
static_assert(kChunk <= kTeam, "a team takes a chunk's softmax one position per lane");
static_assert(sizeof(unsigned) == sizeof(float), "the arrival counters take floats of the partials buffer");
// Thread blocks per multiprocessor that the decode grid aims at: more blocks scan a long context in fewer
// chunks each, fewer leave fewer partials for the combining block.
constexpr int64_t kDecodeBlocksPerMultiprocessor = 4;

int64_t max_splits(int64_t context) { return (context + kAttentionChunk - 1) / kAttentionChunk; }

// Two f16 values of the cache (4-byte aligned) as floats.
__device__ __forceinline__ float2 load_halves(const void* p) {
  return __half22float2(*static_cast<const __half2*>(p));
}

// Eight f16 values (one 16-byte load of a cache row) as floats.
__device__ __forceinline__ void widen_8_halves(const int4& v, float (&out)[8]) {
  const float2 pairs[4] = {load_halves(&v.x), load_halves(&v.y), load_halves(&v.z), load_halves(&v.w)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = pairs[i].x;
    out[2 * i + 1] = pairs[i].y;
  }
}

// k[0] * q[0] + ... + k[7] * q[7] for eight query values q (16-byte aligned): the scoring step of both
// attention kernels, over a widened piece of a key.
__device__ __forceinline__ float dot_8(const float (&k)[8], const float* q) {
  const float4 qa = *reinterpret_cast<const float4*>(q);
  const float4 qb = *reinterpret_cast<const float4*>(q + 4);
  return k[0] * qa.x + k[1] * qa.y + k[2] * qa.z + k[3] * qa.w + k[4] * qb.x + k[5] * qb.y + k[6] * qb.z +
         k[7] * qb.w;
}

// The combining block keeps a factor per query head it combines and per thread block of a kv head in shared
// memory: at most this many floats (32 KiB), which bounds the thread blocks of a kv head on large GPUs.
constexpr int64_t kMaxCombineFactors = 8192;

// Thread blocks per kv head of the decode grid.
int64_t decode_blocks(const AttentionShape& shape, int64_t context) {
  static const int64_t multiprocessors = device_info().multiprocessors;  // asks the driver: once
  const int64_t wanted = (kDecodeBlocksPerMultiprocessor * multiprocessors + shape.n_kv_heads - 1) / shape.n_kv_heads;
  return std::max<int64_t>(1, std::min({wanted, max_splits(context), kMaxCombineFactors / shape.n_heads}));
}

// Floats of the partial results: per query head and thread block, head_dim unnormalized outputs, then the
// block's maximum and sum. The arrival counters follow them.
int64_t decode_partial_floats(const AttentionShape& shape, int64_t blocks) {
  return shape.n_heads * blocks * (shape.head_dim + 2);
}

// Values per quantization block of the output form (1: no 8-bit form).
int64_t quantization_block(ActivationBlocks blocks) {
  switch (blocks) {
    case ActivationBlocks::Q8_0: return kActivationBlock;
    case ActivationBlocks::Q8_K: return kQuantizeThreads;
    case ActivationBlocks::None: break;
  }
  return 1;
}

// Adds this thread block to the arrivals at `counter`; true in every thread of the block that arrives last
// of `arrivals`, which also sets the counter back to zero for the next launch. The fences make the partial
// results written before the arrival visible to the last block's reads after it.
__device__ bool arrive_last(unsigned* counter, unsigned arrivals) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) == arrivals - 1;
    if (last) *counter = 0;
    __threadfence();
  }
  __syncthreads();
  return last;
}

// Grid: (thread blocks per kv head, kv heads). `arrivals`: one counter per combine group of
// kv_heads_per_combine kv heads.
template <ActivationBlocks kBlocks>
__global__ void __launch_bounds__(kDecodeThreads) attention_decode_kernel(
    AttentionShape shape, const float* q, const float* k, const float* v, const float* cos_sin, uint16_t* keys,
    uint16_t* values, const int32_t* step, float scale, int64_t kv_heads_per_combine, float* partials,
    unsigned* arrivals, ActivationOutput out) {
  start_successor();
  extern __shared__ float4 dynamic_shared[];  // float4: the query is read 16 bytes at a time
  __shared__ float scratch[kDecodeThreads / 32];
  const int block = static_cast<int>(blockIdx.x);
  const int blocks = static_cast<int>(gridDim.x);
  const int64_t kv_head = blockIdx.y;
  const int group = static_cast<int>(shape.heads_per_kv_head());
  const int head_dim = static_cast<int>(shape.head_dim);
  const int64_t kv_dim = shape.kv_dim();
  const int team = static_cast<int>(threadIdx.x / kTeam);
  const int lane = static_cast<int>(threadIdx.x % kTeam);
  // The position was written before the pass's first kernel started, and the cache rows of earlier positions
  // by earlier passes: neither depends on the kernels before this one, so the block asks for its chunks' keys
  // and values in L2 while they finish (each row's bytes of this kv head; the newest row is this launch's to
  // write).
  const int64_t positions = step[0] + 1;
  const int64_t chunks = (positions + kAttentionChunk - 1) / kAttentionChunk;
  if (head_dim % 8 == 0) {
    const int64_t rows = 2 * kAttentionChunk * ((chunks - block + blocks - 1) / blocks);  // keys and values
    for (int64_t i = threadIdx.x; i < rows; i += kDecodeThreads) {
      const int64_t position = (block + i / (2 * kAttentionChunk) * blocks) * kAttentionChunk + i / 2 % kAttentionChunk;
      const uint16_t* cache = i % 2 == 0 ? keys : values;
      if (position < positions - 1)
        prefetch_to_l2(cache + position * kv_dim + kv_head * head_dim, static_cast<uint32_t>(head_dim * 2));
    }
  }
  wait_for_predecessor();
  const int64_t stride = head_dim + 2;  // floats of one partial result
  float* q_shared = reinterpret_cast<float*>(dynamic_shared);  // [group][head_dim]
  // [group][head_dim]: the weighted values under the running maximum (in shared memory rather than registers,
  // which would keep fewer thread blocks on a multiprocessor)
  float* acc = q_shared + group * head_dim;
  float* scores = acc + group * head_dim;                      // [group][kChunk]
  float* maxima = scores + group * kChunk;                     // [group]: the running softmax
  float* sums = maxima + group;                                // [group]
  float* rescales = sums + group;                              // [group]: of the old maximum to the new

  if (block < chunks) {
    for (int i = static_cast<int>(threadIdx.x); i < group * head_dim; i += kDecodeThreads) {
      q_shared[i] = rotated(q + (kv_head * group + i / head_dim) * head_dim, i % head_dim, shape, cos_sin);
      acc[i] = 0.0f;
    }
    for (int g = static_cast<int>(threadIdx.x); g < group; g += kDecodeThreads) {
      maxima[g] = -INFINITY;
      sums[g] = 0.0f;
    }
    // The block whose chunks include the newest position first puts its key (rotated) and value into the
    // cache, where its scoring reads them; no other block reads that row.
    if (block == (chunks - 1) % blocks) {
      for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += kDecodeThreads) {
        const int64_t offset = kv_head * head_dim + d;
        keys[(positions - 1) * kv_dim + offset] = float_to_half(rotated(k + kv_head * head_dim, d, shape, cos_sin));
        values[(positions - 1) * kv_dim + offset] = float_to_half(v[offset]);
      }
    }
    __syncthreads();

    const int slot = static_cast<int>(threadIdx.x / kLanesPerPosition);  // the position of the chunk it scores
    const int part = static_cast<int>(threadIdx.x % kLanesPerPosition);
    for (int64_t chunk = block; chunk < chunks; chunk += blocks) {
      const int64_t begin = chunk * kAttentionChunk;
      const int count = static_cast<int>(min(kAttentionChunk, positions - begin));

      // Scores: kLanesPerPosition lanes per position, each reading every kLanesPerPosition-th piece of the
      // key (16 bytes where the head dimension allows) for all heads of the group, then summing across them.
      float dot[kMaxHeadsPerKvHead] = {};
      if (slot < count) {
        const uint16_t* key = keys + (begin + slot) * kv_dim + kv_head * head_dim;
        if (head_dim % 8 == 0) {
          for (int d = 8 * part; d < head_dim; d += 8 * kLanesPerPosition) {
            float k[8];
            widen_8_halves(load_16(key + d), k);
#pragma unroll
            for (int g = 0; g < kMaxHeadsPerKvHead; ++g)
              if (g < group) dot[g] += dot_8(k, q_shared + g * head_dim + d);
          }
        } else {
          for (int d = 2 * part; d < head_dim; d += 2 * kLanesPerPosition) {
            const float2 k = load_halves(key + d);
#pragma unroll
            for (int g = 0; g < kMaxHeadsPerKvHead; ++g)
              if (g < group) dot[g] += k.x * q_shared[g * head_dim + d] + k.y * q_shared[g * head_dim + d + 1];
          }
        }
      }
#pragma unroll
      for (int g = 0; g < kMaxHeadsPerKvHead; ++g) {
        if (g < group) {
          float total = dot[g];
#pragma unroll
          for (int mask = kLanesPerPosition / 2; mask > 0; mask /= 2)
            total += shuffle_xor(total, mask, kLanesPerPosition);
          if (part == 0 && slot < count) scores[g * kChunk + slot] = total * scale;
        }
      }
      __syncthreads();

      // The running softmax of each head (one team per head, a lane per position): the new maximum, the
      // chunk's weights under it, and the factor that brings what came before to it.
      for (int g = team; g < group; g += kDecodeTeams) {
        float* row = scores + g * kChunk;
        const float previous = maxima[g];
        const float score = lane < count ? row[lane] : -INFINITY;
        const float maximum = fmaxf(previous, team_max(score));
        const float weight = lane < count ? expf(score - maximum) : 0.0f;
        if (lane < count) row[lane] = weight;
        const float total = team_sum(weight);
        if (lane == 0) {
          const float rescale = expf(previous - maximum);
          rescales[g] = rescale;
          sums[g] = sums[g] * rescale + total;
          maxima[g] = maximum;
        }
      }
      __syncthreads();

      // Weighted values: a thread per (head, dimension pair); consecutive threads take consecutive pairs.
      for (int i = static_cast<int>(threadIdx.x); i < group * head_dim / 2; i += kDecodeThreads) {
        const int g = i / (head_dim / 2);
        const int d = 2 * (i % (head_dim / 2));
        const float* weights = scores + g * kChunk;
        const uint16_t* value = values + begin * kv_dim + kv_head * head_dim + d;
        float2 sum = {0.0f, 0.0f};
#pragma unroll 8
        for (int p = 0; p < count; ++p) {
          const float2 v = load_halves(value + p * kv_dim);
          sum.x += weights[p] * v.x;
          sum.y += weights[p] * v.y;
        }
        float2& pair = reinterpret_cast<float2*>(acc)[i];
        pair.x = pair.x * rescales[g] + sum.x;
        pair.y = pair.y * rescales[g] + sum.y;
      }
      __syncthreads();  // the next chunk rewrites the scores and rescales
    }

    for (int i = static_cast<int>(threadIdx.x); i < group * (head_dim + 2); i += kDecodeThreads) {
      const int g = i / (head_dim + 2);
      const int d = i % (head_dim + 2);
      const float value = d < head_dim ? acc[g * head_dim + d] : d == head_dim ? maxima[g] : sums[g];
      partials[((kv_head * group + g) * blocks + block) * stride + d] = value;
    }
  }

  const int64_t combine_group = kv_head / kv_heads_per_combine;
  if (!arrive_last(arrivals + combine_group, static_cast<unsigned>(kv_heads_per_combine * blocks))) return;

  // The combining block. First, a team per query head of the group: the factor that brings each partial (of
  // the blocks that had chunks) to the head's common maximum, divided by the softmax's sum under it.
  const int heads = static_cast<int>(kv_heads_per_combine) * group;
  const int64_t first_head = combine_group * heads;
  const int used = static_cast<int>(min(static_cast<int64_t>(blocks), chunks));
  float* factors = reinterpret_cast<float*>(dynamic_shared);  // [heads][used]: at most kMaxCombineFactors
  for (int h = team; h < heads; h += kDecodeTeams) {
    const float* head_partials = partials + (first_head + h) * blocks * stride;
    float maximum = -INFINITY;
    for (int b = lane; b < used; b += kTeam) maximum = fmaxf(maximum, head_partials[b * stride + head_dim]);
    maximum = team_max(maximum);
    float total = 0.0f;
    for (int b = lane; b < used; b += kTeam) {
      const float rescale = expf(head_partials[b * stride + head_dim] - maximum);
      factors[h * used + b] = rescale;
      total += head_partials[b * stride + head_dim + 1] * rescale;
    }
    total = team_sum(total);
    for (int b = lane; b < used; b += kTeam) factors[h * used + b] /= total;
  }
  __syncthreads();

  // Then each output value, kDecodeThreads consecutive ones at a time, which quantize together.
  const int64_t first = first_head * head_dim;  // the group's first value
  const int outputs = heads * head_dim;         // a multiple of the quantization block
  for (int base = 0; base < outputs; base += kDecodeThreads) {
    const int e = base + static_cast<int>(threadIdx.x);
    float value = 0.0f;
    if (e < outputs) {
      const int h = e / head_dim;
      const float* partial = partials + (first_head + h) * blocks * stride + e % head_dim;
      const float* head_factors = factors + h * used;
#pragma unroll 8
      for (int b = 0; b < used; ++b) value += partial[b * stride] * head_factors[b];
      out.f32[first + e] = value;
    }
    const bool active = e - static_cast<int>(threadIdx.x) % kTeam < outputs;  // whole teams: the group is whole blocks
    quantize_element<kBlocks>(value, first + e, active, out.q, out.scales, out.f16, scratch);
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
          float k[8];
          widen_8_halves(load_16(key + d), k);
          dot += dot_8(k, q_team + d);
        }
      }
      for (; d < head_dim; d += 2) {
        const float2 k = load_halves(key + d);
        dot += q_team[d] * k.x + q_team[d + 1] * k.y;
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
  return decode_partial_floats(shape, decode_blocks(shape, context)) + shape.n_kv_heads;
}

void attention_decode(const AttentionShape& shape, const float* q, const float* k, const float* v,
                      const float* cos_sin, uint16_t* key_cache, uint16_t* value_cache, int64_t context,
                      const int32_t* step, float* partials, const ActivationOutput& out, gpuStream_t stream) {
  const int64_t blocks = decode_blocks(shape, context);
  const int64_t group = shape.heads_per_kv_head();
  const int64_t quantized = quantization_block(out.blocks);
  const int64_t kv_heads_per_combine = quantized / std::gcd(group * shape.head_dim, quantized);
  if (shape.n_kv_heads % kv_heads_per_combine != 0)
    fail_with("attention_decode: the output rows are not whole blocks of their 8-bit form");
  auto* arrivals = reinterpret_cast<unsigned*>(partials + decode_partial_floats(shape, blocks));
  // The scoring blocks' query, weighted values and softmax; then the combining block's factors.
  const size_t shared_bytes =
      sizeof(float) * static_cast<size_t>(std::max(group * (2 * shape.head_dim + kAttentionChunk + 3),
                                                   kv_heads_per_combine * group * blocks));
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(shape.n_kv_heads));
  with_activation_blocks(out.blocks, [&]<ActivationBlocks kBlocks>() {
    launch_overlapped("attention_decode", attention_decode_kernel<kBlocks>, grid, kDecodeThreads, shared_bytes,
                      stream, shape, q, k, v, cos_sin, key_cache, value_cache, step, attention_scale(shape),
                      kv_heads_per_combine, partials, arrivals, out);
  });
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
