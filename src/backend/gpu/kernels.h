// The kernels of the GPU forward pass as host functions: each launches its kernel on `stream` and returns at
// once. Pointers are device pointers unless a comment says otherwise. Matrices are row-major; a batch of n
// activation rows of `cols` values lies row after row. Positions and token ids are read from device memory
// (`step`: position, then the tokens), so a captured decode step replays unchanged for every new token.
#pragma once
#include <cstdint>
#include <span>

#include "backend/gpu/runtime.h"
#include "backend/gpu/weight_layout.h"
#include "gguf/tensor_type.h"

namespace rf::gpu {

// 8-bit activations for quantized weights: per 32 values a scale d (x ~ d * q) and the sums of q over each
// half, with which kernels apply a weight block's offset without touching the quants.
struct ActivationScale {
  float d;
  int16_t sum[2];
};
static_assert(sizeof(ActivationScale) == 8);
constexpr int kActivationBlock = 32;

// How activations are quantized for a weight type: in the blocks of the CPU backend (and of llama.cpp's CPU
// backend, whose logits are the references), so that both backends compute the same function: per 32 values
// with an f16 scale for the 32-element types (Q8_0), per 256 values with one f32 scale for the K-quants and
// IQ4_XS (Q8_K). Float weights take f32 activations.
enum class ActivationBlocks { None, Q8_0, Q8_K };
ActivationBlocks activation_blocks(TensorType weight_type);

// The forms of a batch of activation rows that products read: f32 always; the 8-bit form (quantized weights,
// cols a multiple of 32) and the f16 form (tensor-core GEMMs) where made.
struct ProductInput {
  const float* f32 = nullptr;
  const int8_t* q = nullptr;
  const ActivationScale* scales = nullptr;
  const uint16_t* f16 = nullptr;
};

// Where a kernel that produces activation rows writes them: the f32 rows, and the 8-bit form of `blocks`
// (none for ActivationBlocks::None) that the products reading them next take; where f16 is given, also the
// values those levels stand for as f16, which tensor-core GEMMs take.
struct ActivationOutput {
  float* f32 = nullptr;
  ActivationBlocks blocks = ActivationBlocks::None;
  int8_t* q = nullptr;
  ActivationScale* scales = nullptr;
  uint16_t* f16 = nullptr;
};

// Batches up to this size can run as matrix-vector products that read each weight once for all rows (which
// product a batch takes: products.h, ProductPolicy).
constexpr int kMaxMatvecBatch = 8;

// Whether the kernels read `type` (the float types, the legacy quants, the K-quants, IQ4_NL, IQ4_XS).
bool has_kernels(TensorType type);
// Whether rows of `cols` values of `type` suit the kernels: whole blocks, for float types whole 16-byte loads.
bool row_fits_kernels(TensorType type, int64_t cols);

// One matrix of a product: `rows` rows of the common width, results to y[b * rows + r] for input row b.
struct MatvecSegment {
  WeightView weight;
  int64_t rows = 0;
  float* y = nullptr;
};
constexpr int kMaxMatvecSegments = 3;

// y (+)= dot(weight row r, x row b) for r < rows, b < batch (1..kMaxMatvecBatch), for 1 to
// kMaxMatvecSegments matrices of one type and width that read the same input (q, k and v; gate and up) in
// one launch. Quantized weights read x.q and x.scales, float weights x.f32.
void matvec(TensorType type, std::span<const MatvecSegment> segments, int64_t cols, const ProductInput& x, int batch,
            bool accumulate, gpuStream_t stream);

// For one activation row: the matrices of `segments` (of `type`) and then `last` (of `last_type`) in one launch,
// each computed as its own launch would compute it, where a kernel takes that pair of types: the v projection
// of the _M mixes (Q6_K) after their Q4_K or Q5_K q and k, which saves a launch in half their layers. Returns
// false, launching nothing, for other pairs.
bool matvec_two_types(TensorType type, std::span<const MatvecSegment> segments, TensorType last_type,
                      const MatvecSegment& last, int64_t cols, const ProductInput& x, bool accumulate,
                      gpuStream_t stream);

// Where the 8-bit tensor-core products put the parts of a K split (matmul_q8.cu): `part_floats` floats, and one
// counter for each of `max_tiles` tiles, zeroed here and left zeroed by every launch; sized for this device.
struct TileScratch {
  TileScratch();
  DeviceBuffer parts;
  DeviceBuffer arrivals;
  int64_t part_floats = 0;
  int64_t max_tiles = 0;
};

// Whether matmul_q8 takes `type` on this device: quantized weights that meet 8-bit activations, on a GPU with int8
// mma.sync (NVIDIA sm_80 and later).
bool has_matmul_q8(TensorType type);

// y (+)= dot(weight row r, x row b) for r < segment.rows, b < n, any n, on the tensor cores in integers, with the
// scales of the matrix-vector kernels (x.q and x.scales), so that a row's results match theirs up to float rounding
// and are the same bits whatever the other rows of x.
void matmul_q8(TensorType type, const MatvecSegment& segment, int64_t cols, const ProductInput& x, int64_t n,
               bool accumulate, const TileScratch& scratch, gpuStream_t stream);

// Rows first_row .. first_row + n_rows of a weight as f16, row after row (the tile of a GEMM).
void dequantize_to_f16(TensorType type, const WeightView& weight, int64_t cols, int64_t first_row, int64_t n_rows,
                       uint16_t* out, gpuStream_t stream);

// out[t] = row tokens[t] of an embedding table, as f32, for t < n_tokens.
void embed_tokens(TensorType type, const WeightView& table, int64_t cols, const int32_t* tokens, int64_t n_tokens,
                  float* out, gpuStream_t stream);

// Moves the half scale at byte scale_offset of each of `blocks` raw blocks of block_bytes to scales[b] and the
// rest of the block to payloads + b * (block_bytes - 2): the device layout of split types.
void split_block_scales(const uint8_t* raw, int64_t blocks, int block_bytes, int scale_offset, uint8_t* payloads,
                        uint16_t* scales, gpuStream_t stream);

// out = x / sqrt(mean(x^2) + eps) * weight, per row (cols a multiple of 4; out.f32 must not be x).
void rmsnorm(const float* x, const float* weight, int64_t rows, int64_t cols, float eps, const ActivationOutput& out,
             gpuStream_t stream);

// The 8-bit form of n rows of cols values (cols a multiple of the blocks), and when `f16` is given, the
// values that form stands for, as f16: what a GEMM multiplies with quantized weights.
void quantize_rows(ActivationBlocks blocks, const float* x, int64_t rows, int64_t cols, int8_t* q,
                   ActivationScale* scales, uint16_t* f16, gpuStream_t stream);

// The f16 form of n values: what a GEMM multiplies with float weights.
void convert_to_f16(const float* x, int64_t n, uint16_t* out, gpuStream_t stream);

// The feed-forward network's activation function.
enum class Activation { Silu, Gelu };
// out = act(gate) * up for n rows of cols values (out.f32 may be gate); up null: out = act(gate).
void activate(Activation activation, const float* gate, const float* up, int64_t rows, int64_t cols,
              const ActivationOutput& out, gpuStream_t stream);

// LayerNorm of `rows` rows: (x - mean) / sqrt(var + eps) * weight + bias (bias may be null), with the forms of `out`.
void layernorm(const float* x, const float* weight, const float* bias, int64_t rows, int64_t cols, float eps,
               const ActivationOutput& out, gpuStream_t stream);

// Rows of up to three matrices, each row += its bias (one launch: the q, k and v biases of a layer).
struct BiasSegment {
  float* x = nullptr;
  const float* bias = nullptr;
  int64_t cols = 0;
};
void add_biases(std::span<const BiasSegment> segments, int64_t rows, gpuStream_t stream);

// x += y for n values.
void add(float* x, const float* y, int64_t n, gpuStream_t stream);

// RMSNorm of each head (`head_dim` values) of `heads` rows of up to two matrices, in place (q and k norms).
struct HeadNormSegment {
  float* x = nullptr;
  const float* weight = nullptr;
  int64_t heads = 0;
};
void head_rmsnorm(std::span<const HeadNormSegment> segments, int64_t head_dim, float eps, gpuStream_t stream);

// x = cap * tanh(x / cap) for n values.
void soft_cap(float* x, int64_t n, float cap, gpuStream_t stream);

// Each of the n_tokens rows of cols values x = x * scale + the learned position row (step[0] + t) of `positions`,
// an F32 or F16 table (null: none).
void scale_and_position(float* x, int64_t n_tokens, int64_t cols, float scale, TensorType positions_type,
                        const void* positions, const int32_t* step, gpuStream_t stream);

// Positions a block of a paged KV cache holds (model::kKvBlockPositions).
constexpr int64_t kKvBlockRows = 16;
// Where the tokens of a pass over a paged KV cache are, the rows of many sequences: token t is at position
// positions[t] of its sequence, whose block table starts at blocks + table_starts[t]; that sequence's position p lies
// in row blocks[table_starts[t] + p / kKvBlockRows] * kKvBlockRows + p % kKvBlockRows of every layer's cache.
struct PagedRows {
  const int32_t* positions = nullptr;
  const int32_t* table_starts = nullptr;
  const int32_t* blocks = nullptr;
};

// scale_and_position for the tokens of a paged pass, each with the learned row of its own position.
void scale_and_position(float* x, int64_t n_tokens, int64_t cols, float scale, TensorType positions_type,
                        const void* positions, const PagedRows& rows, gpuStream_t stream);

// out[i] = row rows[i] of x, for i < n (rows of cols values).
void gather_rows(const float* x, const int32_t* rows, int64_t n, int64_t cols, float* out, gpuStream_t stream);

// out[r] = the index of the largest of the cols values of row r of x, for r < rows: the first of equal ones, as
// std::max_element finds it (util/argmax.h) in a row without NaN.
void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* out, gpuStream_t stream);

// The rotation angles of every position of a context: (cos, sin) of p * inverse_frequencies[i] for p < positions,
// i < pairs, computed in double precision as the CPU does: cos_sin[2 * (p * pairs + i)] and [.. + 1]. Made once,
// when the KV cache is allocated, for the kernels below that rotate queries and keys.
void rope_table(const double* inverse_frequencies, int64_t pairs, int64_t positions, float* cos_sin,
                gpuStream_t stream);

struct AttentionShape {
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t rope_pairs;  // leading dimension pairs of each head that rotate
  bool neox;           // pairs (i, i + rope_pairs) instead of (2i, 2i + 1)
  float scale;         // of q . k
  float cap = 0.0f;    // scores become cap * tanh(score / cap); 0: not capped
  int64_t window = 0;  // a query sees the last `window` positions, itself included; 0: all before it
  // Rows of the layer's cache where it is a ring (model::kv_cache_rows: a sliding-window layer's, position p in row
  // p % ring); 0: a row for each position (row p).
  int64_t ring = 0;
  constexpr int64_t q_dim() const { return n_heads * head_dim; }
  constexpr int64_t kv_dim() const { return n_kv_heads * head_dim; }
  constexpr int64_t heads_per_kv_head() const { return n_heads / n_kv_heads; }
};

// Rotates the queries and keys of n tokens in place (by the angles of positions step[0] .. step[0] + n_tokens - 1
// in cos_sin, a rope_table) and writes keys and values to the f16 cache rows of those positions (position p of a
// layer at row p, or p % shape.ring, each row kv_dim values).
void rope_and_store(const AttentionShape& shape, float* q, float* k, const float* v, const float* cos_sin,
                    int64_t n_tokens, const int32_t* step, uint16_t* key_cache, uint16_t* value_cache,
                    gpuStream_t stream);

// rope_and_store for the tokens of a paged pass: each rotated by the angles of its own position and stored in the
// row of its sequence's block table (shape.ring is 0: a paged cache keeps every position).
void rope_and_store(const AttentionShape& shape, float* q, float* k, const float* v, const float* cos_sin,
                    int64_t n_tokens, const PagedRows& rows, uint16_t* key_cache, uint16_t* value_cache,
                    gpuStream_t stream);

// Causal attention of n tokens at positions step[0].. over the cached keys and values 0 .. step[0] + t (the last
// shape.window of them where it is set), scores soft-capped where shape.cap is set: out[t * q_dim + h * head_dim +
// d]. Keys and values come from the f16 cache of one layer (a ring where shape.ring is set, as rope_and_store
// writes it). Any shape runs; tensor cores take those without a cap, a window or a ring. With n = 1 after
// rope_and_store, this is also the plain path of a decoding step.
void attention_prompt(const AttentionShape& shape, const float* q, const uint16_t* key_cache,
                      const uint16_t* value_cache, int64_t n_tokens, const int32_t* step, float* out,
                      gpuStream_t stream);
// Attention of the n tokens of a paged pass, prompt and decoding rows alike: each over its own sequence's positions
// up to its own (the last shape.window of them where it is set), read through the block table, scores soft-capped
// where shape.cap is set; out as attention_prompt's. The scalar kernel of attention_prompt (f32 scores, an online
// softmax), one team of 32 lanes a (token, head).
void attention_paged(const AttentionShape& shape, const float* q, const uint16_t* key_cache,
                     const uint16_t* value_cache, int64_t n_tokens, const PagedRows& rows, float* out,
                     gpuStream_t stream);
// Whether attention_prompt rounds the queries and the softmax weights to f16 for `shape` (on tensor cores, with f32
// sums, as flash-attention kernels do): its outputs then differ from f32 scoring by up to about 1e-3 of the values'
// scale.
bool attention_prompt_rounds_to_f16(const AttentionShape& shape);

// What a model adds to the projections q, k and v of one token before attention, each pointer null where it adds
// nothing: biases (q_dim, kv_dim and kv_dim values), and the weights of a per-head RMSNorm of q and of k (head_dim
// values each) with its epsilon.
struct QkvExtras {
  const float* q_bias = nullptr;
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float eps = 0.0f;
};

// Whether attention_decode runs `shape`: attention over the whole context (a row for each position) without
// soft-capping (else a decoding step takes the plain path: rope_and_store, attention_prompt); and whether it also
// takes q/k norms (QkvExtras): heads of whole teams of 32 values, whose squares a team sums (else head_rmsnorm runs
// before it).
constexpr bool attention_decode_runs(const AttentionShape& shape) {
  return shape.cap == 0.0f && shape.window == 0 && shape.ring == 0;
}
constexpr bool attention_decode_takes_norms(const AttentionShape& shape) { return shape.head_dim % 32 == 0; }
// One token (decoding) at position step[0], over positions 0 .. step[0], in one launch (split-K). q, k and v are the
// token's projections before their `extras` and rotation: the launch adds the biases, normalizes the heads and
// rotates q and k by the angles of step[0] in cos_sin (a rope_table)
// and writes k and v to the cache rows of step[0], as rope_and_store would. The query heads of a kv head are
// taken in parts of a few heads, and the positions are split into chunks of kAttentionChunk, shared out among a
// fixed number of thread blocks per part, each of which leaves one partial softmax per query head in `partials`. The
// last of a part's blocks to finish (of a few parts' blocks where one part's query heads do not fill whole
// quantization blocks) combines their partials into out.f32 and, unless out.blocks is None, the 8-bit form of the
// row (q_dim whole blocks), which the o-projection then reads without another launch. While the context is a few
// chunks long, one thread block per part takes them all and writes its heads' output without partials. A chunk is
// what a thread block's teams of 32 lanes take at once (eight consecutive positions each where the shape's rows fit
// their registers). The launch depends on the context, not on the position, so a captured step serves every
// position. `partials` holds attention_partials_floats() floats (sized for the current device) and is zeroed before
// the first call: its tail counts the blocks that have finished, and every call leaves it zeroed again.
constexpr int64_t kAttentionChunk = 64;
constexpr int64_t kMaxHeadsPerKvHead = 16;
constexpr int64_t kMaxHeadDim = 256;
int64_t attention_partials_floats(const AttentionShape& shape, int64_t context);
void attention_decode(const AttentionShape& shape, const float* q, const float* k, const float* v,
                      const QkvExtras& extras, const float* cos_sin, uint16_t* key_cache, uint16_t* value_cache,
                      int64_t context, const int32_t* step, float* partials, const ActivationOutput& out,
                      gpuStream_t stream);
// Whether attention_decode, writing an output of `blocks`, rounds the queries and the softmax weights to f16 for
// `shape` (its scores and weighted values on tensor cores, with f32 sums), as flash-attention kernels do: its
// outputs then differ from f32 scoring by up to about 1e-3 of the values' scale.
bool attention_decode_rounds_to_f16(const AttentionShape& shape, ActivationBlocks blocks);

// Decoding with F16 or BF16 weights: a chain of up to kMaxChainSteps matrix-vector steps of one activation row as
// one persistent launch (product_chain.cu says how and why). Each step multiplies its input row of `cols` f32
// values, RMS-normalized with `norm` (eps) where one is given, by one to three matrices of `rows` rows, and stores
// the results (Store: y[m]), adds them to y[0] (Accumulate: the residual stream), or writes silu(first) * second to
// y[0] (Swiglu: gate and up, of equal rows). A step's input may be what an earlier step wrote.
enum class ChainOutput { Store, Accumulate, Swiglu };
struct ChainStep {
  const float* input = nullptr;
  const float* norm = nullptr;
  int64_t cols = 0;
  ChainOutput output = ChainOutput::Store;
  int matrices = 0;
  const void* weights[3] = {};
  int64_t rows[3] = {};
  float* y[3] = {};
};
constexpr int kMaxChainSteps = 4;
// Values of a step's input row, which the consumer threads of a block keep in registers, and what widths divide by.
constexpr int64_t kMaxChainInput = 16384;
constexpr int64_t kChainWidthMultiple = 256;
struct ProductChain {
  TensorType type = TensorType::F16;
  float eps = 0.0f;
  int steps = 0;
  ChainStep step[kMaxChainSteps];
  // Set by the launch: the most rows of a step's matrices that a thread block takes (each consumer warp keeps a sum
  // of each in shared memory).
  int64_t sum_floats = 0;
};
// Whether product_chain runs `chain` here: a CUDA build on a Hopper or newer device, 16-bit float weights, widths
// that are multiples of kChainWidthMultiple values and at most kMaxChainInput, and shared memory enough for a block's
// rows.
bool product_chain_runs(ProductChain chain);
// `arrivals`: one zeroed counter, which the launch leaves zeroed.
void product_chain(ProductChain chain, unsigned* arrivals, gpuStream_t stream);

}  // namespace rf::gpu
