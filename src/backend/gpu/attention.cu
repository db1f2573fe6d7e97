// Attention over the f16 KV cache.
//
// Decoding (one query token): split-K in a single launch, which also rotates the token's query and key and
// stores its key and value in the cache (a launch of its own for prompts). The query heads that share a kv head
// (GQA) are taken in parts of a few heads (heads_per_block()), and the positions are cut into chunks of
// kAttentionChunk; a fixed number of thread blocks per part (a few per multiprocessor in all, at most one per
// chunk of the context) share the chunks that hold positions 0 .. step[0], block b taking chunks b, b + blocks,
// ... The grid depends on the context only, not on the position, so a captured decode step replays for every
// token; blocks without a chunk go straight to the end. Within a block each team of 32 lanes takes its own
// positions of every chunk and keeps its own running softmax (maximum, sum and weighted values) in registers for
// all the query heads of the part, reading each key and value once for all of them, with no barrier between
// positions: the team's lanes are split among the heads, and a head's lanes among the pieces of the row. The
// block then merges its teams' softmaxes through shared memory into one partial result per head. On CUDA, heads of
// 64 values are scored on tensor cores instead (score_on_tensor_cores()), into the same merge. The last block
// to finish among those of a combine group learns so from a counter in device memory; it rescales the group's
// partials to a common maximum, sums them, and writes the output rows together with their 8-bit form for the
// o-projection, which would otherwise take a combine kernel and a quantization kernel of their own. A combine
// group is the fewest consecutive parts whose query heads fill whole quantization blocks (usually one), so that
// every block is quantized by the one thread block that holds all its values. Where a combine group is one part
// and the context still short (up to a few chunks: lone_block_chunks()), the first thread block of each part takes
// every chunk and writes the output itself, and the others end at once.
//
// Prompts (several query tokens): flash-attention style, with an online softmax, so no score matrix is ever stored.
// On CUDA, heads of 64 and 128 values go on tensor cores (attention_prompt_tensor_core_kernel: 16 tokens of a head a
// warp, tiles of keys and values shared by a thread block). Otherwise a thread block owns one (token, head), keeps
// the query in shared memory, and its teams of 32 lanes stream over the keys and values the token may see, 32 at a
// time, each team every kTeams-th step, with its output accumulator in registers (lane l has dimensions l, l + 32,
// ...); the teams' softmaxes then merge. The tokens of a paged batch (many sequences, each
// through its block table) take that scalar kernel too, decoding tokens and prompt tokens alike.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/gpu/device.cuh"
#include "backend/gpu/kernels.h"
#include "backend/gpu/pass_rows.cuh"
#include "backend/gpu/quantize.cuh"
#include "backend/gpu/rope.cuh"

namespace rf::gpu {
namespace {

constexpr int kThreads = 128;
constexpr int kTeams = kThreads / kTeam;

// The decode kernel quantizes its output as quantize_element() does: a Q8_K block is a whole thread block.
constexpr int kDecodeThreads = kQuantizeThreads;
constexpr int kDecodeTeams = kDecodeThreads / kTeam;
static_assert(sizeof(unsigned) == sizeof(float), "the arrival counters take floats of the partials buffer");
static_assert(kMaxHeadDim <= kDecodeThreads, "a thread of the decode kernel rotates and stores a key's value");
// Thread blocks per multiprocessor that the decode grid aims at (as many as are resident at once: the kernel
// keeps two): more blocks scan a long context in fewer chunks each, fewer leave fewer partials for the
// combining block.
constexpr int64_t kDecodeBlocksPerMultiprocessor = 2;

// Heads of this many values score on tensor cores (scores_on_tensor_cores()).
constexpr int kTensorCoreHeadDim = 64;
// Whether the build has the tensor-core steps (mma.sync, sm_80 on) that some kernels take: CUDA, not HIP.
#if defined(ROCMFORGE_GPU_HIP)
constexpr bool kBuildHasTensorCores = false;
#else
constexpr bool kBuildHasTensorCores = true;
#endif

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

// k[0] * q[0] + ... + k[7] * q[7] for eight query values q (16-byte aligned): the prompt kernel's scoring step,
// over a widened piece of a key.
__device__ __forceinline__ float dot_8(const float (&k)[8], const float* q) {
  const float4 qa = *reinterpret_cast<const float4*>(q);
  const float4 qb = *reinterpret_cast<const float4*>(q + 4);
  return k[0] * qa.x + k[1] * qa.y + k[2] * qa.z + k[3] * qa.w + k[4] * qb.x + k[5] * qb.y + k[6] * qb.z +
         k[7] * qb.w;
}

// Thread blocks per part (attention_decode_kernel) of the decode grid, for `parts` parts.
int64_t decode_blocks(int64_t parts, int64_t context) {
  static const int64_t multiprocessors = device_info().multiprocessors;  // asks the driver: once
  const int64_t wanted = (kDecodeBlocksPerMultiprocessor * multiprocessors + parts - 1) / parts;
  return std::max<int64_t>(1, std::min(wanted, max_splits(context)));
}

// Floats of the partial results: per query head and thread block, head_dim unnormalized outputs, then the
// block's maximum and sum; sized for the most thread blocks a part (a whole group a block, the fewest parts), so
// that the arrival counters after them sit at one place for every launch on the buffer, whatever its parts.
int64_t decode_partial_floats(const AttentionShape& shape, int64_t context) {
  return shape.n_heads * decode_blocks(shape.n_kv_heads, context) * (shape.head_dim + 2);
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

// How a team of the decode kernel holds one row of a kv head (a key, a value, or the query heads of the
// group): the query heads take slots of lanes_per_head() lanes (slots: the group rounded up to a power of two),
// and within a slot lane `sub` takes pieces sub, sub + lanes_per_head, ... of the head: 8 values (16 bytes of the
// cache) where the head dimension allows, else 2. Value i of a lane is dimension dim(i) of its head.
__host__ __device__ constexpr int lanes_per_head(int64_t group) {
  int slots = 1;
  while (slots < group) slots *= 2;
  return kTeam / slots;
}
__host__ __device__ constexpr int piece_values(int64_t head_dim) { return head_dim % 8 == 0 ? 8 : 2; }
// log2 of a power of two.
__host__ __device__ constexpr int log2_of(int power) {
  int shift = 0;
  while ((1 << shift) < power) ++shift;
  return shift;
}

// Pieces and slots are powers of two: shifts and masks rather than the integer divisions that the decode kernel's
// warps would otherwise run after its wait: with the scores' fused multiply-adds and the batches' 32-bit compares
// (score_by_lanes), fewer instructions a launch, and the 8B's decoding faster on an H200.
struct TeamLayout {
  int head_dim;
  int piece;
  int piece_shift;  // log2(piece)
  int lanes_per_head;
  int slot;
  int sub;

  __device__ TeamLayout(int head_dim_, int group, int lane)
      : head_dim(head_dim_),
        piece(piece_values(head_dim_)),
        piece_shift(log2_of(piece)),
        lanes_per_head(rf::gpu::lanes_per_head(group)),
        slot(lane >> log2_of(lanes_per_head)),
        sub(lane & (lanes_per_head - 1)) {}
  __device__ int dim(int i) const {
    return (sub + (i >> piece_shift) * lanes_per_head) * piece + (i & (piece - 1));
  }
};

// Values a lane holds of one row (a power of two, at least one piece of 8): what TeamLayout needs for the shape
// where a thread block takes `heads` query heads.
int values_per_lane(const AttentionShape& shape, int64_t heads) {
  const int64_t lanes = lanes_per_head(heads);
  const int64_t piece = piece_values(shape.head_dim);
  const int64_t needed = (shape.head_dim / piece + lanes - 1) / lanes * piece;
  int values = 8;
  while (values < needed) values *= 2;
  return values;
}

// The decode kernel's work split for kValues values a lane: teams that score (their merge buffers, kValues floats a
// lane, take at most 4096 floats of shared memory), the positions of a chunk each of them takes (consecutive), and
// how many of those it loads before it uses the first (the loaded rows take kBatch * kValues registers: with 16
// values a lane, batches of 4 spilled and were slower than batches of 2). With 8 values a lane a team takes its
// positions of a chunk in one batch: chunks of 64 positions in batches of 8 take half the rounds of chunks of 32 in
// batches of 4, which made the 8B's decoding faster on an H200.
template <int kValues>
struct DecodeSplit {
  static constexpr int kScoringTeams = kValues <= 16 ? kDecodeTeams : 4096 / (kTeam * kValues);
  static constexpr int kPositionsPerTeam = static_cast<int>(kAttentionChunk) / kScoringTeams;
  static constexpr int kBatch = kValues <= 8 ? kPositionsPerTeam : kValues <= 32 ? 2 : 1;
  static constexpr int kMergeFloats = kScoringTeams * kTeam * (kValues + 2);
  static_assert(kAttentionChunk % kScoringTeams == 0 && kPositionsPerTeam % kBatch == 0);
};

// Chunks that block 0 of a part takes alone while the context has no more (0: never), writing the output itself: no
// partial results, no arrival, no combining block. Alone, its teams scan the chunks one after another, a round of
// loads for every kBatch positions, which up to kLoneRounds rounds costs less than what it saves (on an H200, fewer
// rounds gained less and more no more). Copying the chunks to shared memory before the wait for the projections,
// instead of asking for them in L2, was slower. Only where a part's query heads fill whole quantization blocks
// (parts_per_combine 1).
constexpr int kLoneRounds = 4;
template <int kValues>
__host__ __device__ constexpr int64_t lone_block_chunks(int64_t parts_per_combine) {
  using Split = DecodeSplit<kValues>;
  return parts_per_combine == 1 ? kLoneRounds * Split::kBatch / Split::kPositionsPerTeam : 0;
}

// A lane's values of one cache row as f16 pairs (zero past the head).
template <int kValues>
struct RowPart {
  uint32_t pairs[kValues / 2];

  // The row `offset` values after `rows` (an offset within a batch of rows: 32 bits, one multiply-add an address
  // instead of 64-bit arithmetic for every row), or zeros where it is not `present`.
  __device__ void load(const uint16_t* rows, int offset, const TeamLayout& layout, bool present) {
    if (layout.piece == 8) {
#pragma unroll
      for (int j = 0; j < kValues / 8; ++j) {
        const int d = layout.dim(8 * j);
        const int4 v = present && d < layout.head_dim ? load_16(rows + (offset + d)) : make_int4(0, 0, 0, 0);
        pairs[4 * j] = v.x;
        pairs[4 * j + 1] = v.y;
        pairs[4 * j + 2] = v.z;
        pairs[4 * j + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < kValues / 2; ++j) {
        const int d = layout.dim(2 * j);
        pairs[j] = present && d < layout.head_dim ? *reinterpret_cast<const uint32_t*>(rows + (offset + d)) : 0u;
      }
    }
  }
  __device__ float2 pair(int j) const { return load_halves(&pairs[j]); }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// Tensor-core steps (sm_80 on): d += a * b with f16 inputs and f32 sums, lane 4g + t holding rows g and g + 8 of a
// and d, and column g of b (PTX ISA, mma.m16n8k16 and mma.m16n8k8 fragments). a0 holds row g's columns 2t and
// 2t + 1, a1 row g + 8's, a2 and a3 the same rows' columns 2t + 8 and 2t + 9; b0 column g's rows 2t and 2t + 1, b1
// its rows 2t + 8 and 2t + 9; d0 and d1 row g's columns 2t and 2t + 1, d2 and d3 row g + 8's. The decode scoring
// has at most 8 rows (query heads): its rows g + 8 are zero.
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_m16n8k8(float (&d)[4], uint32_t a0, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(b0));
}

__device__ __forceinline__ uint32_t pack_halves(float low, float high) {
  const __half2 pair = __floats2half2_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// A scoring team's softmax over its positions of the block's chunks on tensor cores, written to the merge buffers in
// the layout of the scalar scoring (TeamLayout with 8 values a lane). Each step takes the team's 8 positions of a
// chunk: scores = queries (the part's heads as rows) x keys, then outputs += weights x values; the rows of
// kChunksAtOnce chunks are loaded before the first is scored. The dot products run over the head's dimensions in
// any order, so lane 4g + t takes dimensions t * kHeadDim / 4 onwards of key g (16-byte loads) and gives them to
// the k-steps as the fragments want them; the values' dimensions are permuted too (output tile j, column n is
// dimension n * kHeadDim / 8 + j), so that lane 4g + t loads dimensions g * kHeadDim / 8 onwards of positions 2t
// and 2t + 1 and pairs them with byte permutes. Queries and weights are rounded to f16. Against the scalar scoring,
// a lane holds a quarter of a key row instead of every head slot holding all of it, so the rows of two chunks (all
// of tg128's) are in flight at once, and a step takes a few dozen instructions instead of a few hundred.
template <int kHeadDim, int kChunksAtOnce>
__device__ __forceinline__ void score_on_tensor_cores(const float* queries, int heads, int lanes_per_head,
                                                      const uint16_t* keys, const uint16_t* values, int kv_dim,
                                                      int64_t positions, int64_t first_chunk, int64_t chunks,
                                                      int64_t chunk_step, int team, int lane, float* merged_acc,
                                                      float* maxima, float* sums) {
  constexpr int kSteps = kHeadDim / 16;
  constexpr int kTiles = kHeadDim / 8;
  constexpr int kKeyLoads = kHeadDim / 32;
  constexpr int kValueLoads = kHeadDim / 64;
  constexpr int kPositions = 8;   // a team's positions of a chunk: the columns of the scores
  constexpr int kLaneValues = 8;  // values a lane holds in the merge buffers' layout (scores_on_tensor_cores())
  static_assert(kAttentionChunk == kDecodeTeams * kPositions);
  const int g = lane / 4;
  const int t = lane % 4;
  const int key_first = t * (kHeadDim / 4);
  const int value_first = g * (kHeadDim / 8);
  uint32_t query[kSteps][2];
#pragma unroll
  for (int s = 0; s < kSteps; ++s)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float2 pair = *reinterpret_cast<const float2*>(queries + g * kHeadDim + key_first + 4 * s + 2 * half);
      query[s][half] = g < heads ? pack_halves(pair.x, pair.y) : 0u;
    }
  float acc[kTiles][4] = {};
  float maximum = -INFINITY, sum = 0.0f;
  // The lane's rows within a step's: 32-bit offsets from the step's first row (as RowPart::load).
  const int key_offset = g * kv_dim + key_first;
  const int value_offset = 2 * t * kv_dim + value_first;
  const int4 zero = make_int4(0, 0, 0, 0);
  for (int64_t chunk = first_chunk; chunk < chunks; chunk += chunk_step * kChunksAtOnce) {
    int4 key[kChunksAtOnce][kKeyLoads], value[kChunksAtOnce][2][kValueLoads];
    int in_context[kChunksAtOnce];  // the step's positions that the context has (32-bit compares below)
#pragma unroll
    for (int c = 0; c < kChunksAtOnce; ++c) {
      const int64_t this_chunk = chunk + c * chunk_step;
      const int64_t first = this_chunk * kAttentionChunk + team * kPositions;
      const int64_t left = positions - first;
      in_context[c] = this_chunk < chunks ? static_cast<int>(max(min(left, int64_t{kPositions}), int64_t{0})) : 0;
      const uint16_t* key_rows = keys + first * kv_dim;
      const uint16_t* value_rows = values + first * kv_dim;
#pragma unroll
      for (int i = 0; i < kKeyLoads; ++i)
        key[c][i] = g < in_context[c] ? load_16(key_rows + (key_offset + 8 * i)) : zero;
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int i = 0; i < kValueLoads; ++i)
          value[c][r][i] =
              2 * t + r < in_context[c] ? load_16(value_rows + (value_offset + r * kv_dim + 8 * i)) : zero;
    }
#pragma unroll
    for (int c = 0; c < kChunksAtOnce; ++c) {
      if (in_context[c] == 0) break;
      float score[4] = {};
      const auto* key_words = reinterpret_cast<const uint32_t*>(key[c]);
#pragma unroll
      for (int s = 0; s < kSteps; ++s)
        mma_m16n8k16(score, query[s][0], 0u, query[s][1], 0u, key_words[2 * s], key_words[2 * s + 1]);
      const float s0 = 2 * t < in_context[c] ? score[0] : -INFINITY;
      const float s1 = 2 * t + 1 < in_context[c] ? score[1] : -INFINITY;
      const float batch_maximum = quad_max(fmaxf(s0, s1));
      const float new_maximum = fmaxf(maximum, batch_maximum);
      const float rescale = __expf(maximum - new_maximum);
      const float w0 = __expf(s0 - new_maximum);
      const float w1 = __expf(s1 - new_maximum);
      sum = sum * rescale + w0 + w1;
      maximum = new_maximum;
      const uint32_t weights = pack_halves(w0, w1);
      const auto* low = reinterpret_cast<const uint32_t*>(value[c][0]);
      const auto* high = reinterpret_cast<const uint32_t*>(value[c][1]);
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        acc[j][0] *= rescale;
        acc[j][1] *= rescale;
        mma_m16n8k8(acc[j], weights, __byte_perm(low[j / 2], high[j / 2], j % 2 ? 0x7632 : 0x5410));
      }
    }
  }
  const float total = quad_sum(sum);
  if (g >= heads) return;
  // Dimension d of head g is value d % kLaneValues of lane g * lanes_per_head + d / kLaneValues (TeamLayout).
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int d = (2 * t + e) * (kHeadDim / 8) + j;
      merged_acc[(team * kLaneValues + d % kLaneValues) * kTeam + g * lanes_per_head + d / kLaneValues] = acc[j][e];
    }
  for (int sub = t; sub < lanes_per_head; sub += 4) {
    maxima[team * kTeam + g * lanes_per_head + sub] = maximum;
    sums[team * kTeam + g * lanes_per_head + sub] = total;
  }
}
#endif

// A scoring team's softmax over its positions of the block's chunks, each lane holding kValues values of its head's
// rows (TeamLayout), written to the merge buffers.
template <int kValues>
__device__ __forceinline__ void score_by_lanes(const float* queries, int heads, const TeamLayout& layout,
                                               const uint16_t* keys, const uint16_t* values, int kv_dim,
                                               int64_t positions, int64_t first_chunk, int64_t chunks,
                                               int64_t chunk_step, int team, int lane, float* merged_acc,
                                               float* maxima, float* sums) {
  using Split = DecodeSplit<kValues>;
  const int head_dim = layout.head_dim;
  // The lane's values of its head's query (zero for lanes without a head).
  float query[kValues];
#pragma unroll
  for (int i = 0; i < kValues; ++i) {
    const int d = layout.dim(i);
    query[i] = layout.slot < heads && d < head_dim ? queries[layout.slot * head_dim + d] : 0.0f;
  }
  float maximum = -INFINITY, sum = 0.0f;
  float acc[kValues] = {};
  for (int64_t chunk = first_chunk; chunk < chunks; chunk += chunk_step) {
    for (int first = 0; first < Split::kPositionsPerTeam; first += Split::kBatch) {
      const int64_t position = chunk * kAttentionChunk + team * Split::kPositionsPerTeam + first;
      if (position >= positions) break;  // the team's (and its later batches') positions are all past the end
      // The batch's positions that the context has (32-bit compares below).
      const int in_context = static_cast<int>(min(positions - position, static_cast<int64_t>(Split::kBatch)));
      RowPart<kValues> key[Split::kBatch], value[Split::kBatch];
      const int64_t batch_row = position * kv_dim;
#pragma unroll
      for (int u = 0; u < Split::kBatch; ++u) {
        key[u].load(keys + batch_row, u * kv_dim, layout, u < in_context);
        value[u].load(values + batch_row, u * kv_dim, layout, u < in_context);
      }
      // Scores: the lane's share of each dot product, summed over the lanes of its head, the batch's
      // positions side by side in each step of the exchange so that their shuffles overlap (a loop per
      // position ran them one after another). The exponentials below take the fast path: their arguments are
      // at most zero.
      float score[Split::kBatch];
#pragma unroll
      for (int u = 0; u < Split::kBatch; ++u) {
        score[u] = 0.0f;
#pragma unroll
        for (int j = 0; j < kValues / 2; ++j) {
          const float2 kj = key[u].pair(j);
          // Two fused multiply-adds (a pair's products summed before they joined the score took three steps).
          score[u] = fmaf(query[2 * j + 1], kj.y, fmaf(query[2 * j], kj.x, score[u]));
        }
      }
#pragma unroll
      for (int mask = kTeam / 2; mask > 0; mask /= 2)
        if (mask < layout.lanes_per_head)
#pragma unroll
          for (int u = 0; u < Split::kBatch; ++u) score[u] += shuffle_xor(score[u], mask, kTeam);
      float batch_maximum = -INFINITY;
#pragma unroll
      for (int u = 0; u < Split::kBatch; ++u) {
        if (u >= in_context) score[u] = -INFINITY;
        batch_maximum = fmaxf(batch_maximum, score[u]);
      }
      // The running softmax: the new maximum, the batch's weights under it, and the factor that brings what
      // came before to it.
      const float new_maximum = fmaxf(maximum, batch_maximum);
      const float rescale = __expf(maximum - new_maximum);
      float weight[Split::kBatch];
      float total = 0.0f;
#pragma unroll
      for (int u = 0; u < Split::kBatch; ++u) {
        weight[u] = __expf(score[u] - new_maximum);
        total += weight[u];
      }
      sum = sum * rescale + total;
      maximum = new_maximum;
#pragma unroll
      for (int j = 0; j < kValues / 2; ++j) {
        float2 weighted = {acc[2 * j] * rescale, acc[2 * j + 1] * rescale};
#pragma unroll
        for (int u = 0; u < Split::kBatch; ++u) {
          const float2 vj = value[u].pair(j);
          weighted.x += weight[u] * vj.x;
          weighted.y += weight[u] * vj.y;
        }
        acc[2 * j] = weighted.x;
        acc[2 * j + 1] = weighted.y;
      }
    }
  }
  // The team's softmax to shared memory.
#pragma unroll
  for (int i = 0; i < kValues; ++i) merged_acc[(team * kValues + i) * kTeam + lane] = acc[i];
  maxima[team * kTeam + lane] = maximum;
  sums[team * kTeam + lane] = sum;
}

// Output values e[0 .. kValues) of a combine group whose partials start at group_partials: each the sum of its
// head's partials of the `used` blocks that had chunks, brought to their common maximum, divided by the
// softmax's sum under it. The maximum is taken first, so that the partials' factors do not wait on each other
// as an online softmax's would (each its maximum, then its exponential, in turn), and a thread's values go
// together, so that their loads do (two values a thread were faster on an H200 than one at a time).
template <int kValues>
__device__ __forceinline__ void combine_partials(const float* group_partials, int blocks, int used, int head_dim,
                                                 const int (&e)[kValues], float* value) {
  const int64_t stride = head_dim + 2;
  const float* partial[kValues];
  float maximum[kValues], total[kValues];
#pragma unroll
  for (int i = 0; i < kValues; ++i) {
    partial[i] = group_partials + static_cast<int64_t>(e[i] / head_dim) * blocks * stride;
    maximum[i] = -INFINITY;
    total[i] = 0.0f;
    value[i] = 0.0f;
  }
#pragma unroll 8
  for (int b = 0; b < used; ++b)
#pragma unroll
    for (int i = 0; i < kValues; ++i) maximum[i] = fmaxf(maximum[i], partial[i][b * stride + head_dim]);
#pragma unroll 8
  for (int b = 0; b < used; ++b)
#pragma unroll
    for (int i = 0; i < kValues; ++i) {
      const float* p = partial[i] + b * stride;
      const float factor = expf(p[head_dim] - maximum[i]);
      value[i] += p[e[i] % head_dim] * factor;
      total[i] += p[head_dim + 1] * factor;
    }
#pragma unroll
  for (int i = 0; i < kValues; ++i) value[i] /= total[i];
}

// Output value i of the `outputs` from `first` on, and its share of their 8-bit form: every thread of the block
// calls this for the same kDecodeThreads consecutive values (quantize_element).
template <ActivationBlocks kBlocks>
__device__ __forceinline__ void store_output(float value, int64_t first, int i, int outputs,
                                             const ActivationOutput& out, float2* scratch) {
  if (i < outputs) out.f32[first + i] = value;
  const bool active = i - static_cast<int>(threadIdx.x) % kTeam < outputs;  // whole teams: whole blocks
  quantize_element<kBlocks>(value, first + i, active, out.q, out.scales, out.f16, scratch);
}

// One head of q or k as attention takes it: its projection plus its bias, normalized (RMSNorm with the weight
// `norm`, `scale` its 1 / rms) where the model says so, value d as head[d]. Null pointers leave a step out.
struct HeadInput {
  const float* values;
  const float* bias;
  const float* norm;
  float scale;

  __device__ float projected(int64_t d) const { return values[d] + (bias ? bias[d] : 0.0f); }
  __device__ float operator[](int64_t d) const { return norm ? projected(d) * scale * norm[d] : projected(d); }
};

// Where a decode block keeps the sums of squares of its heads' values for their norms: one per team-sized piece of
// the part's query heads and then of its key heads (pieces of kTeam values: heads of a multiple of kTeam values; a
// part that runs into a second kv head has fewer query heads than a group).
constexpr int kHeadSquares = (kMaxHeadsPerKvHead + 1) * kMaxHeadDim / kTeam;

// Grid: (thread blocks per part, parts). A part is `heads_per_block` consecutive query heads of one kv head's
// group, or running into the next one's (heads_per_block()). `arrivals`: one counter per combine group of
// parts_per_combine parts. kTensorCores: the teams score on tensor cores (scores_on_tensor_cores()) where the device
// has them.
template <ActivationBlocks kBlocks, int kValues, bool kTensorCores, bool kExtras>
__global__ void __launch_bounds__(kDecodeThreads, 2) attention_decode_kernel(
    AttentionShape shape, const float* q, const float* k, const float* v, QkvExtras extras, const float* cos_sin,
    uint16_t* keys, uint16_t* values, const int32_t* step, float scale, int64_t heads_per_block,
    int64_t parts_per_combine, float* partials, unsigned* arrivals, ActivationOutput out) {
  using Split = DecodeSplit<kValues>;
  start_successor();
  extern __shared__ float dynamic_shared[];
  __shared__ float2 scratch[kDecodeThreads / 32];
  const int block = static_cast<int>(blockIdx.x);
  const int blocks = static_cast<int>(gridDim.x);
  const int64_t part = blockIdx.y;
  const int heads = static_cast<int>(heads_per_block);
  const int64_t first_head = part * heads;
  const int64_t group = shape.heads_per_kv_head();
  // The part's heads lie in one kv head's group or run into the next one's (heads_per_block()): the block reads and
  // stores the rows of both, which lie side by side in the cache.
  const int64_t kv_head = first_head / group;
  const int kv_heads = static_cast<int>((first_head + heads - 1) / group - kv_head + 1);
  const int head_dim = static_cast<int>(shape.head_dim);
  const int64_t kv_dim = shape.kv_dim();
  const int team = static_cast<int>(threadIdx.x / kTeam);
  const int lane = static_cast<int>(threadIdx.x % kTeam);
  // The position was written before the pass's first kernel started, and the cache rows of earlier positions
  // by earlier passes: neither depends on the kernels before this one, so the block asks for its chunks' keys
  // and values in L2 while they finish (each row's bytes of the part's kv heads; the newest row is this launch's
  // to write).
  const int64_t positions = step[0] + 1;
  const int64_t newest = positions - 1;
  const float* angles = position_angles(cos_sin, newest, shape);
  const int64_t chunks = (positions + kAttentionChunk - 1) / kAttentionChunk;
  // A short context: block 0 of the part takes every chunk and writes the output itself (lone_block_chunks()).
  const bool lone = chunks <= lone_block_chunks<kValues>(parts_per_combine);
  if (lone && block != 0) return;
  // The block's chunks: block, block + blocks, ..., or alone all of them.
  const int64_t first_chunk = lone ? 0 : block;
  const int64_t chunk_step = lone ? 1 : blocks;
  if (head_dim % 8 == 0) {
    const int64_t rows = 2 * kAttentionChunk * ((chunks - first_chunk + chunk_step - 1) / chunk_step);  // keys, values
    for (int64_t i = threadIdx.x; i < rows; i += kDecodeThreads) {
      const int64_t position =
          (first_chunk + i / (2 * kAttentionChunk) * chunk_step) * kAttentionChunk + i / 2 % kAttentionChunk;
      const uint16_t* cache = i % 2 == 0 ? keys : values;
      if (position < newest)
        prefetch_to_l2(cache + position * kv_dim + kv_head * head_dim,
                       static_cast<uint32_t>(kv_heads * head_dim * 2));
    }
  }
  // The angles of the thread's first query value (and of its key value: the same dimension) are asked for before the
  // wait too, as the table's row may have left the cache since the layer before read it.
  const int own_dim = static_cast<int>(threadIdx.x) % head_dim;
  const float2 own_angle = dimension_angle(angles, own_dim, shape);
  // So is what needs no earlier kernel's results and would otherwise take integer divisions, loops and 64-bit
  // arithmetic after the wait: where the thread's first query value is and how it rotates, whether the block stores
  // the newest position's key and value and where, and the lane's place in its team's rows: the kernel's time
  // follows the instructions its warps run after the wait, and each of these took some off it on an H200.
  const DimensionRotation own_rotation = dimension_rotation(own_dim, shape, own_angle);
  const float* own_query = q + (first_head + static_cast<int>(threadIdx.x) / head_dim) * head_dim;
  const bool stores_newest = lone || block == (chunks - 1) % blocks;
  const int64_t own_kv_head = kv_head + static_cast<int>(threadIdx.x) / head_dim;  // the thread's key value's
  const int64_t newest_offset = newest * kv_dim + own_kv_head * head_dim + own_dim;
  const TeamLayout layout(head_dim, heads, lane);
  const int64_t lane_kv_head = (first_head + min(layout.slot, heads - 1)) / group;  // of the lane's head
  wait_for_predecessor();
  const int64_t stride = head_dim + 2;  // floats of one partial result

  // Shared memory: the scoring teams' softmaxes for the merge, then the part's queries (alone, then its output).
  float* merged_acc = dynamic_shared;                                   // [team][value][lane]
  float* maxima = merged_acc + Split::kScoringTeams * kValues * kTeam;  // [team][lane]
  float* sums = maxima + Split::kScoringTeams * kTeam;                  // [team][lane]
  float* queries = dynamic_shared + Split::kMergeFloats;                // [heads][head_dim]
  if (first_chunk < chunks) {
    // The part's queries, rotated and scaled. The block of each part whose chunks include the newest position also
    // puts its kv heads' keys (rotated) and values into the cache, where its scoring reads them; no other block reads
    // those rows, and the parts of one kv head write the same bits. The kv heads have at most kDecodeThreads values
    // (kMaxHeadDim, or two heads of half as many): thread i takes value i of the keys and the values, which it reads
    // before it stores anything, so that those reads and the queries' go out together rather than one round trip
    // after the other. Faster on an H200 than reading them after the queries' stores (F16 unchanged).
    const bool stores_row = stores_newest && static_cast<int>(threadIdx.x) < kv_heads * head_dim;
    float newest_key = 0.0f, newest_value = 0.0f;
    if constexpr (!kExtras) {
      newest_key = stores_row ? rotated(k + own_kv_head * head_dim, own_rotation) : 0.0f;
      newest_value = stores_row ? v[own_kv_head * head_dim + own_dim] : 0.0f;
      if (static_cast<int>(threadIdx.x) < heads * head_dim)
        queries[threadIdx.x] = rotated(own_query, own_rotation) * scale;
      for (int i = static_cast<int>(threadIdx.x) + kDecodeThreads; i < heads * head_dim; i += kDecodeThreads) {
        const int d = i % head_dim;
        queries[i] = rotated(q + (first_head + i / head_dim) * head_dim,
                             dimension_rotation(d, shape, dimension_angle(angles, d, shape))) *
                     scale;
      }
    } else {
      // The heads with their biases and norms: the part's query heads are heads 0 .. heads - 1, its key heads heads
      // heads .. heads + kv_heads - 1; a team sums the squares of each kTeam values, and a head adds its teams' sums.
      __shared__ float squares[kHeadSquares];
      const auto head_at = [&](int head) {
        const bool key = head >= heads;
        const int64_t key_head = kv_head + head - heads;
        return HeadInput{key ? k + key_head * head_dim : q + (first_head + head) * head_dim,
                         key ? (extras.k_bias ? extras.k_bias + key_head * head_dim : nullptr)
                             : (extras.q_bias ? extras.q_bias + (first_head + head) * head_dim : nullptr),
                         key ? extras.k_norm : extras.q_norm, 1.0f};
      };
      if (extras.q_norm) {
        for (int i = static_cast<int>(threadIdx.x); i < (heads + kv_heads) * head_dim; i += kDecodeThreads) {
          const float x = head_at(i / head_dim).projected(i % head_dim);
          const float sum = team_sum(x * x);
          if (lane == 0) squares[i / kTeam] = sum;
        }
        __syncthreads();
      }
      const auto normalized_head = [&](int head) {
        HeadInput input = head_at(head);
        if (input.norm) {
          float sum = 0.0f;
          for (int piece = head * head_dim / kTeam; piece < (head + 1) * head_dim / kTeam; ++piece)
            sum += squares[piece];
          input.scale = rsqrtf(sum / static_cast<float>(head_dim) + extras.eps);
        }
        return input;
      };
      if (stores_row) {
        newest_key = rotated(normalized_head(heads + static_cast<int>(threadIdx.x) / head_dim), own_rotation);
        const int64_t value_index = own_kv_head * head_dim + own_dim;
        newest_value = v[value_index] + (extras.v_bias ? extras.v_bias[value_index] : 0.0f);
      }
      for (int i = static_cast<int>(threadIdx.x); i < heads * head_dim; i += kDecodeThreads) {
        const int d = i % head_dim;
        queries[i] = rotated(normalized_head(i / head_dim),
                             dimension_rotation(d, shape, dimension_angle(angles, d, shape))) *
                     scale;
      }
    }
    if (stores_row) {
      keys[newest_offset] = float_to_half(newest_key);
      values[newest_offset] = float_to_half(newest_value);
    }
    __syncthreads();

    if (team < Split::kScoringTeams) {
      // The rows of the lane's head's kv head start here (the teams address them by 32-bit offsets).
      const uint16_t* head_keys = keys + lane_kv_head * head_dim;
      const uint16_t* head_values = values + lane_kv_head * head_dim;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
      if constexpr (kTensorCores)
        score_on_tensor_cores<kTensorCoreHeadDim, 2>(queries, heads, layout.lanes_per_head, head_keys, head_values,
                                                     static_cast<int>(kv_dim), positions, first_chunk, chunks,
                                                     chunk_step, team, lane, merged_acc, maxima, sums);
      else
#endif
        score_by_lanes<kValues>(queries, heads, layout, head_keys, head_values, static_cast<int>(kv_dim), positions,
                                first_chunk, chunks, chunk_step, team, lane, merged_acc, maxima, sums);
    }
    __syncthreads();

    // The block's partial per head: the teams' softmaxes brought to their common maximum and summed. A team
    // without positions has maximum -inf and weighs nothing; the first team always has some. Thread (team, lane)
    // takes values team, team + kDecodeTeams, ... of the lane's in the merge buffers: its own layout's.
    for (int i = team; i < kValues; i += kDecodeTeams) {
      const int d = layout.dim(i);
      if (layout.slot >= heads || d >= head_dim) continue;
      float common = -INFINITY;
#pragma unroll
      for (int t = 0; t < Split::kScoringTeams; ++t) common = fmaxf(common, maxima[t * kTeam + lane]);
      float value = 0.0f, total = 0.0f;
#pragma unroll
      for (int t = 0; t < Split::kScoringTeams; ++t) {
        const float factor = __expf(maxima[t * kTeam + lane] - common);
        value += merged_acc[(t * kValues + i) * kTeam + lane] * factor;
        total += sums[t * kTeam + lane] * factor;
      }
      if (lone) {
        queries[layout.slot * head_dim + d] = value / total;
        continue;
      }
      float* partial = partials + ((first_head + layout.slot) * blocks + block) * stride;
      partial[d] = value;
      if (d == 0) {
        partial[head_dim] = common;
        partial[head_dim + 1] = total;
      }
    }
  }

  if (lone) {
    __syncthreads();
    const int outputs = heads * head_dim;  // whole quantization blocks
    for (int base = 0; base < outputs; base += kDecodeThreads) {
      const int i = base + static_cast<int>(threadIdx.x);
      store_output<kBlocks>(i < outputs ? queries[i] : 0.0f, first_head * head_dim, i, outputs, out, scratch);
    }
    return;
  }

  const int64_t combine_group = part / parts_per_combine;
  if (!arrive_last(arrivals + combine_group, static_cast<unsigned>(parts_per_combine * blocks))) return;

  // The combining block: kDecodeThreads consecutive output values at a time quantize together; a thread
  // computes its values of two such rounds at once where there are two (combine_partials).
  const int64_t group_heads = parts_per_combine * heads;
  const int64_t first = combine_group * group_heads * head_dim;  // the group's first value
  const int outputs = static_cast<int>(group_heads) * head_dim;  // a multiple of the quantization block
  const int used = static_cast<int>(min(static_cast<int64_t>(blocks), chunks));
  const float* group_partials = partials + combine_group * group_heads * blocks * stride;
  for (int base = 0; base < outputs; base += 2 * kDecodeThreads) {
    const int e = base + static_cast<int>(threadIdx.x);
    const auto within = [&](int i) { return min(i, outputs - 1); };  // a value past the end is computed, not kept
    float value[2];
    const bool two = base + kDecodeThreads < outputs;
    if (two)
      combine_partials<2>(group_partials, blocks, used, head_dim, {e, within(e + kDecodeThreads)}, value);
    else
      combine_partials<1>(group_partials, blocks, used, head_dim, {within(e)}, value);
    for (int round = 0; round < (two ? 2 : 1); ++round)
      store_output<kBlocks>(value[round], first, e + round * kDecodeThreads, outputs, out, scratch);
  }
}

// `Rows` (pass_rows.cuh): where each token is in its sequence, and which cache row holds a position of it. A thread
// block takes one (token, head); its kTeams teams take every kTeams-th step of 32 positions, each with its own running
// softmax, and then merge them in team order: the positions of a decoding token are scanned kTeams ways at once, and
// a token's result depends on its own positions alone, not on the batch beside it.
template <int kDimsPerLane, typename Rows>
__global__ void __launch_bounds__(kThreads) attention_prompt_kernel(AttentionShape shape, const float* q,
                                                                    const uint16_t* keys, const uint16_t* values,
                                                                    Rows rows, float scale, float* out) {
  start_successor();
  wait_for_predecessor();
  __shared__ float q_block[kMaxHeadDim];
  __shared__ float team_acc[kTeams][kMaxHeadDim];
  __shared__ float team_maximum[kTeams];
  __shared__ float team_total[kTeams];
  const int team = static_cast<int>(threadIdx.x / kTeam);
  const int lane = static_cast<int>(threadIdx.x % kTeam);
  const int64_t t = blockIdx.x / shape.n_heads;
  const int64_t head = blockIdx.x % shape.n_heads;
  const int64_t head_dim = shape.head_dim;
  const int64_t kv_offset = head / shape.heads_per_kv_head() * head_dim;
  const int64_t kv_dim = shape.kv_dim();
  const float* q_head = q + t * shape.q_dim() + head * head_dim;
  for (int64_t d = threadIdx.x; d < head_dim; d += kThreads) q_block[d] = q_head[d] * scale;
  __syncthreads();

  float acc[kDimsPerLane] = {};
  float maximum = -INFINITY;
  float sum = 0.0f;
  const int64_t positions = rows.position(t) + 1;
  const int64_t start = shape.window > 0 ? max(positions - shape.window, int64_t{0}) : 0;
  const auto row_of = [&](int64_t p) { return rows.row(t, p); };
  // 32 keys per step, one per lane: lane k scores key first + k on its own (the query is in shared memory,
  // the key row is read 16 bytes at a time), the team takes the step's maximum and sum, and then every lane
  // accumulates the weighted values of the 32 keys for its dimensions (l, l + 32, ...).
  for (int64_t first = start + team * kTeam; first < positions; first += kTeams * kTeam) {
    const int64_t p = first + lane;
    float score = -INFINITY;
    if (p < positions) {
      const uint16_t* key = keys + row_of(p) * kv_dim + kv_offset;
      float dot = 0.0f;
      int64_t d = 0;
      if (head_dim % 8 == 0) {  // rows of whole 16-byte pieces
        for (; d < head_dim; d += 8) {
          float k[8];
          widen_8_halves(load_16(key + d), k);
          dot += dot_8(k, q_block + d);
        }
      }
      for (; d < head_dim; d += 2) {
        const float2 k = load_halves(key + d);
        dot += q_block[d] * k.x + q_block[d + 1] * k.y;
      }
      score = shape.cap > 0.0f ? shape.cap * tanhf(dot / shape.cap) : dot;
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
      const uint16_t* value = values + row_of(first + k) * kv_dim + kv_offset;
#pragma unroll
      for (int j = 0; j < kDimsPerLane; ++j) {
        const int64_t d = lane + j * kTeam;
        if (d < head_dim) acc[j] += w * half_to_float(value[d]);
      }
    }
    maximum = step_maximum;
  }

  // A team without positions has maximum -inf and adds nothing.
  if (lane == 0) {
    team_maximum[team] = maximum;
    team_total[team] = sum;
  }
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) {
    const int64_t d = lane + j * kTeam;
    if (d < head_dim) team_acc[team][d] = acc[j];
  }
  __syncthreads();
  float merged_maximum = -INFINITY;
  for (int i = 0; i < kTeams; ++i) merged_maximum = fmaxf(merged_maximum, team_maximum[i]);
  float weights[kTeams];
  float merged_sum = 0.0f;
  for (int i = 0; i < kTeams; ++i) {
    weights[i] = expf(team_maximum[i] - merged_maximum);
    merged_sum += team_total[i] * weights[i];
  }
  float* out_head = out + t * shape.q_dim() + head * head_dim;
  for (int64_t d = threadIdx.x; d < head_dim; d += kThreads) {
    float value = 0.0f;
    for (int i = 0; i < kTeams; ++i) value += team_acc[i][d] * weights[i];
    out_head[d] = value / merged_sum;
  }
}

#if !defined(ROCMFORGE_GPU_HIP)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// 16 bytes from global to shared memory without passing through registers (cp.async, sm_80 on), or zeros where not
// `present`.
__device__ __forceinline__ void copy_16_async(void* shared, const void* global, bool present) {
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(address), "l"(global), "r"(present ? 16 : 0)
               : "memory");
}
#endif

// Prompts on tensor cores (sm_80 on), for heads of kHeadDim values (64 or 128): flash attention as FA2 lays it out. A
// thread block takes kPromptTileTokens consecutive tokens of one query head, each of its warps 16 of them as the rows
// of mma.m16n8k16 fragments (queries scaled and rounded to f16 once, held in registers), and walks the keys the block's
// last token may see in tiles of kPromptTileKeys positions: the block copies a tile's keys and values into shared
// memory (by asynchronous copies, the next tile while its warps score one), each warp scores its rows against it
// (scores = queries x keys^T, 8 positions a fragment), masks the positions past each row's token, updates its rows'
// running maximum and sum, and adds weights x values, the weights (f16) taken straight from the scores' fragments and
// the values' fragments read transposed by ldmatrix. f32 sums throughout; a row's sum is reduced over its quad of lanes
// once, at the end.
constexpr int kPromptTileTokens = 64;
constexpr int kPromptWarps = kPromptTileTokens / 16;
// Positions of a tile: as many as keep two stages of keys and values within the 48 KB a block has without asking.
template <int kHeadDim>
constexpr int kPromptTileKeys = kHeadDim <= 64 ? 64 : 32;

template <int kHeadDim>
__global__ void __launch_bounds__(kPromptWarps * kTeam) attention_prompt_tensor_core_kernel(
    AttentionShape shape, const float* q, const uint16_t* keys, const uint16_t* values, int64_t n_tokens,
    const int32_t* step, float scale, float* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kSteps = kHeadDim / 16;           // k-steps of a score fragment
  constexpr int kTiles = kHeadDim / 8;            // output fragments of 8 dimensions
  constexpr int kKeyTiles = kPromptTileKeys<kHeadDim> / 8;  // score fragments of 8 positions
  constexpr int kRowHalves = kHeadDim + 8;        // a shared row, padded so that 8 rows' words fall in distinct banks
  // Two stages: the block copies the next tile while its warps score the current one.
  __shared__ __align__(16) uint16_t key_tiles[2][kPromptTileKeys<kHeadDim>][kRowHalves];
  __shared__ __align__(16) uint16_t value_tiles[2][kPromptTileKeys<kHeadDim>][kRowHalves];
  start_successor();
  wait_for_predecessor();
  const int warp = static_cast<int>(threadIdx.x / kTeam);
  const int lane = static_cast<int>(threadIdx.x % kTeam);
  const int g = lane / 4;
  const int t = lane % 4;
  const int64_t head = blockIdx.y;
  const int64_t kv_offset = head / shape.heads_per_kv_head() * kHeadDim;
  const int64_t kv_dim = shape.kv_dim();
  const int64_t first_token = static_cast<int64_t>(blockIdx.x) * kPromptTileTokens;
  const int64_t warp_token = first_token + warp * 16;
  const int64_t start = step[0];
  // The block's last token sees positions 0 .. start + its index; a warp's rows g and g + 8 their own.
  const int64_t block_positions = start + min(first_token + kPromptTileTokens, n_tokens);
  const int64_t row_position[2] = {start + warp_token + g, start + warp_token + g + 8};
  const int64_t warp_last_position = start + warp_token + 15;

  // The queries in the log2 domain (scale * log2 e), so that the softmax takes exp2.
  const float query_scale = scale * 1.4426950408889634f;
  uint32_t query[kSteps][4];
#pragma unroll
  for (int s = 0; s < kSteps; ++s)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t token = warp_token + g + 8 * r;
      const float* row = q + min(token, n_tokens - 1) * shape.q_dim() + head * kHeadDim + 16 * s + 2 * t;
      const float2 low = *reinterpret_cast<const float2*>(row);
      const float2 high = *reinterpret_cast<const float2*>(row + 8);
      query[s][r] = pack_halves(low.x * query_scale, low.y * query_scale);
      query[s][2 + r] = pack_halves(high.x * query_scale, high.y * query_scale);
    }

  float acc[kTiles][4] = {};
  float maximum[2] = {-INFINITY, -INFINITY};
  float sum[2] = {0.0f, 0.0f};  // this lane's columns only, until the end
  // A tile's keys and values into a stage, 16 bytes a thread at a time by asynchronous copies (one group a tile);
  // positions past the block's last are zero.
  const auto copy_tile = [&](int stage, int64_t tile_first) {
    constexpr int kPieces = kPromptTileKeys<kHeadDim> * kHeadDim / 8;
    for (int i = static_cast<int>(threadIdx.x); i < kPieces; i += kPromptWarps * kTeam) {
      const int row = i / (kHeadDim / 8);
      const int column = i % (kHeadDim / 8) * 8;
      const int64_t position = tile_first + row;
      const bool present = position < block_positions;
      const int64_t offset = (present ? position : 0) * kv_dim + kv_offset + column;
      copy_16_async(&key_tiles[stage][row][column], keys + offset, present);
      copy_16_async(&value_tiles[stage][row][column], values + offset, present);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  copy_tile(0, 0);
  int stage = 0;
  for (int64_t tile_first = 0; tile_first < block_positions; tile_first += kPromptTileKeys<kHeadDim>, stage ^= 1) {
    if (tile_first + kPromptTileKeys<kHeadDim> < block_positions) {
      copy_tile(stage ^ 1, tile_first + kPromptTileKeys<kHeadDim>);
      asm volatile("cp.async.wait_group 1;" ::: "memory");  // this tile's group done, the next one's in flight
    } else {
      asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    __syncthreads();
    const auto& key_tile = key_tiles[stage];
    const auto& value_tile = value_tiles[stage];
    if (tile_first <= warp_last_position) {
      float score[kKeyTiles][4] = {};
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
          const auto* key_row = reinterpret_cast<const uint32_t*>(&key_tile[8 * j + g][16 * s]);
          mma_m16n8k16(score[j], query[s][0], query[s][1], query[s][2], query[s][3], key_row[t], key_row[t + 4]);
        }
      // Positions past a row's token weigh nothing; the first tile holds position 0, which every row sees.
      float rescale[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float tile_maximum = -INFINITY;
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int64_t position = tile_first + 8 * j + 2 * t + e;
            float& value = score[j][2 * r + e];
            if (position > row_position[r]) value = -INFINITY;
            tile_maximum = fmaxf(tile_maximum, value);
          }
        const float new_maximum = fmaxf(maximum[r], quad_max(tile_maximum));
        rescale[r] = exp2f(maximum[r] - new_maximum);
        maximum[r] = new_maximum;
        float tile_sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& value = score[j][2 * r + e];
            value = exp2f(value - new_maximum);
            tile_sum += value;
          }
        sum[r] = sum[r] * rescale[r] + tile_sum;
      }
#pragma unroll
      for (int d = 0; d < kTiles; ++d) {
        acc[d][0] *= rescale[0];
        acc[d][1] *= rescale[0];
        acc[d][2] *= rescale[1];
        acc[d][3] *= rescale[1];
      }
      // outputs += weights (16 positions a k-step: two score fragments) x values.
#pragma unroll
      for (int k = 0; k < kKeyTiles / 2; ++k) {
        const uint32_t a0 = pack_halves(score[2 * k][0], score[2 * k][1]);
        const uint32_t a1 = pack_halves(score[2 * k][2], score[2 * k][3]);
        const uint32_t a2 = pack_halves(score[2 * k + 1][0], score[2 * k + 1][1]);
        const uint32_t a3 = pack_halves(score[2 * k + 1][2], score[2 * k + 1][3]);
        const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(&value_tile[16 * k + lane % 16][0]));
#pragma unroll
        for (int d = 0; d < kTiles; ++d) {
          uint32_t b0, b1;
          asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                       : "=r"(b0), "=r"(b1)
                       : "r"(address + 16 * d));
          mma_m16n8k16(acc[d], a0, a1, a2, a3, b0, b1);
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = quad_sum(sum[r]);
    const int64_t token = warp_token + g + 8 * r;
    if (token >= n_tokens) continue;
    float* row = out + token * shape.q_dim() + head * kHeadDim + 2 * t;
#pragma unroll
    for (int d = 0; d < kTiles; ++d)
      *reinterpret_cast<float2*>(row + 8 * d) = make_float2(acc[d][2 * r] / total, acc[d][2 * r + 1] / total);
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built for a device without these tensor-core steps
#endif
}
#endif

// attention_prompt_kernel over n tokens where `rows` says, with as many values a lane as the head needs.
template <typename Rows>
void launch_attention_scalar(const AttentionShape& shape, const float* q, const uint16_t* key_cache,
                             const uint16_t* value_cache, int64_t n_tokens, const Rows& rows, float* out,
                             gpuStream_t stream) {
  const auto blocks = static_cast<unsigned>(n_tokens * shape.n_heads);
  const auto run = [&]<int kDimsPerLane>() {
    launch_overlapped("attention_prompt", attention_prompt_kernel<kDimsPerLane, Rows>, blocks, kThreads, 0, stream,
                      shape, q, key_cache, value_cache, rows, shape.scale, out);
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

// Query heads a decode thread block takes (a part): a divisor of the kv head's group, the fewest whose outputs fill
// whole quantization blocks `quantized` values long (so that the part's blocks quantize them alone) and whose heads
// still give every lane of a team a piece of each row; else, where two kv heads' rows fit the threads' stores, as
// many consecutive heads that run into the next kv head's group (Qwen2.5-7B's groups of 7 heads of 128 values, in
// parts of 2); the whole group where none does. Fewer heads a block mean fewer values a lane (values_per_lane), so
// shorter chains of dependent steps in every lane and more positions a round of loads (DecodeSplit), on more
// multiprocessors; each part reads its kv heads' keys and values itself. Parts of 2 of the 8B's 4 heads (8 values a
// lane, one round a chunk) decode faster on an H200 than whole groups (16 values a lane, two rounds a chunk); the
// 1B's heads of 64 values gained nothing and keep whole groups; Qwen2.5-7B decodes a third faster in parts of 2
// than in whole groups (32 values a lane, a seventh of the thread blocks).
int64_t heads_per_block(const AttentionShape& shape, int64_t quantized) {
  const int64_t group = shape.heads_per_kv_head();
  const auto fits = [&](int64_t heads) {
    return heads * shape.head_dim % quantized == 0 &&
           lanes_per_head(heads) * piece_values(shape.head_dim) <= shape.head_dim;
  };
  for (int64_t heads = 1; heads < group; ++heads)
    if (group % heads == 0 && fits(heads)) return heads;
  if (2 * shape.head_dim <= kDecodeThreads)
    for (int64_t heads = 2; heads < group; ++heads)
      if (shape.n_heads % heads == 0 && fits(heads)) return heads;
  return group;
}

// Whether the decode kernel's teams score on tensor cores (score_on_tensor_cores) where a thread block takes `heads`
// query heads: on CUDA, for heads of kTensorCoreHeadDim values, 8 values a lane (at most 8 heads: the rows g of the
// fragments; of one kv head, whose rows the fragments hold). The 1B's heads of 64 decode faster that way on an H200;
// heads of 128 (the 8B's) were slower on tensor cores, with their queries in shared memory or in registers (which
// spilled), and keep the scalar scoring.
bool scores_on_tensor_cores(const AttentionShape& shape, int64_t heads) {
  return kBuildHasTensorCores && shape.head_dim == kTensorCoreHeadDim && heads <= 8 &&
         shape.heads_per_kv_head() % heads == 0 && values_per_lane(shape, heads) == 8;
}

}  // namespace

bool attention_decode_rounds_to_f16(const AttentionShape& shape, ActivationBlocks blocks) {
  return scores_on_tensor_cores(shape, heads_per_block(shape, quantization_block(blocks)));
}

// The partial results, then an arrival counter for up to one part a query head.
int64_t attention_partials_floats(const AttentionShape& shape, int64_t context) {
  return decode_partial_floats(shape, context) + shape.n_heads;
}

void attention_decode(const AttentionShape& shape, const float* q, const float* k, const float* v,
                      const QkvExtras& extras, const float* cos_sin, uint16_t* key_cache, uint16_t* value_cache,
                      int64_t context, const int32_t* step, float* partials, const ActivationOutput& out,
                      gpuStream_t stream) {
  const int64_t quantized = quantization_block(out.blocks);
  const int64_t heads = heads_per_block(shape, quantized);
  const int64_t parts = shape.n_heads / heads;
  const int64_t parts_per_combine = quantized / std::gcd(heads * shape.head_dim, quantized);
  if (parts % parts_per_combine != 0)
    fail_with("attention_decode: the output rows are not whole blocks of their 8-bit form");
  const int64_t blocks = decode_blocks(parts, context);
  auto* arrivals = reinterpret_cast<unsigned*>(partials + decode_partial_floats(shape, context));
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(parts));
  const auto run = [&]<int kValues>() {
    // The teams' softmaxes to merge, and the queries.
    const size_t shared_bytes =
        sizeof(float) * static_cast<size_t>(DecodeSplit<kValues>::kMergeFloats + heads * shape.head_dim);
    const bool with_extras = extras.q_bias || extras.k_bias || extras.v_bias || extras.q_norm || extras.k_norm;
    if (extras.q_norm && !attention_decode_takes_norms(shape))
      fail_with("attention_decode: head norms need heads of whole teams of values");
    const auto launch = [&]<bool kTensorCores>() {
      with_activation_blocks(out.blocks, [&]<ActivationBlocks kBlocks>() {
        const auto run_kernel = [&](auto kernel) {
          launch_overlapped("attention_decode", kernel, grid, kDecodeThreads, shared_bytes, stream, shape, q, k, v,
                            extras, cos_sin, key_cache, value_cache, step, shape.scale, heads, parts_per_combine,
                            partials, arrivals, out);
        };
        if (with_extras)
          run_kernel(attention_decode_kernel<kBlocks, kValues, kTensorCores, true>);
        else
          run_kernel(attention_decode_kernel<kBlocks, kValues, kTensorCores, false>);
      });
    };
    if constexpr (kValues == 8) {
      if (scores_on_tensor_cores(shape, heads)) return launch.template operator()<true>();
    }
    launch.template operator()<false>();
  };
  switch (values_per_lane(shape, heads)) {
    case 8: run.template operator()<8>(); break;
    case 16: run.template operator()<16>(); break;
    case 32: run.template operator()<32>(); break;
    case 64: run.template operator()<64>(); break;
    default: run.template operator()<128>(); break;  // whole groups of 16 wide heads
  }
}

// Prompts score on tensor cores where the shape allows (no cap, no window, and a row for each position, which the
// tiles copy in runs): several times faster on an H200 than the scalar kernel, the more so the longer the prompt;
// the tiles come in two stages by asynchronous copies, which long prompts ran faster than one stage copied through
// registers.
bool attention_prompt_rounds_to_f16(const AttentionShape& shape) {
  return kBuildHasTensorCores && (shape.head_dim == 64 || shape.head_dim == 128) && shape.cap == 0.0f &&
         shape.window == 0 && shape.ring == 0;
}

void attention_prompt(const AttentionShape& shape, const float* q, const uint16_t* key_cache,
                      const uint16_t* value_cache, int64_t n_tokens, const int32_t* step, float* out,
                      gpuStream_t stream) {
#if !defined(ROCMFORGE_GPU_HIP)
  if (attention_prompt_rounds_to_f16(shape)) {
    const dim3 grid(static_cast<unsigned>((n_tokens + kPromptTileTokens - 1) / kPromptTileTokens),
                    static_cast<unsigned>(shape.n_heads));
    const auto run = [&]<int kHeadDim>() {
      launch_overlapped("attention_prompt", attention_prompt_tensor_core_kernel<kHeadDim>, grid, kPromptWarps * kTeam,
                        0, stream, shape, q, key_cache, value_cache, n_tokens, step, shape.scale, out);
    };
    if (shape.head_dim == 64)
      run.template operator()<64>();
    else
      run.template operator()<128>();
    return;
  }
#endif
  launch_attention_scalar(shape, q, key_cache, value_cache, n_tokens, SequenceRows{step, shape.ring}, out, stream);
}

void attention_paged(const AttentionShape& shape, const float* q, const uint16_t* key_cache,
                     const uint16_t* value_cache, int64_t n_tokens, const PagedRows& rows, float* out,
                     gpuStream_t stream) {
  launch_attention_scalar(shape, q, key_cache, value_cache, n_tokens, PagedBatchRows{rows}, out, stream);
}

}  // namespace rf::gpu
