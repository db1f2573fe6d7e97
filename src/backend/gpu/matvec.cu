// Matrix-vector products for decoding (1 to kMaxMatvecBatch activation rows): the weights are read once, in
// their stored type, and dequantized in registers right before the dot product.
//
// A group of `lanes` lanes (4 to 64, a power of two) computes one output row (two: see below), so that every
// lane gets several slices however narrow the row: lane l of the group takes slices l, l + lanes, ...;
// consecutive lanes take consecutive slices, so a group's loads of one step cover consecutive pieces of the
// row (a few header bytes apart for the quantized types). Each lane issues kUnroll slices' loads before it
// uses the first, which keeps enough bytes in flight to saturate device memory. Quantized weights meet 8-bit
// activations in dp4a; float weights meet f32 activations in FMAs. Q6_K, and Q4_K on narrow rows, go by chunks
// instead (block_decoders.cuh: ChunkDecoder): 16 bytes of quants a lane, consecutive lanes on consecutive
// chunks, a whole team on one row where it is wide enough, so that one load of a team reads 512 consecutive
// bytes.
//
// Each thread block asks for its rows' bytes in L2 (one bulk prefetch) before it waits for the kernel before it
// (programmatic dependent launch, device.cuh): the weights do not depend on earlier kernels, so their fetch overlaps
// the previous kernel's tail. Only launches whose weights take a small part of the L2 do so (prefetches()).
// Each lane also issues its first round of loads before that wait, by chunks and by slices alike, so that they too
// overlap the previous kernel's tail (faster on an H200; by slices only once the small kernels' chains were short).
//
// Every lane reads activations for each slice it takes: as many bytes as the weights, times the batch (for
// 4-bit weights twice as many). For batches of 2 or more, a thread block first copies the activations (up to
// kMaxStagedBytes) into shared memory, which takes that traffic off the caches; for one row the caches serve it
// faster than the copy and the barrier after it. Instead, for one row of quantized weights, a group of lanes
// computes two output rows: a lane loads the same slice (or chunk) of both rows and dots each with one load of the
// activations, which halves the activation bytes per weight byte (faster on an H200 for nearly every type and
// shape). F16 rows lost with two rows a group: the f32 activations are not what limits them. By chunks, a group
// takes four rows where the launch still has thread blocks enough, and by slices where a row takes two teams
// (with_variant() below).
//
// Where q and k have one type and v another (the _M mixes give v Q6_K in half the layers), one launch takes
// all three (matvec_two_types): v's thread blocks run the Q6_K code, the others the code of q and k, each as
// its own launch would, which saves a launch boundary.
//
// Bytes per token: every weight byte once (plus its share of header bytes), the activations once per team
// from cache. Nothing is written but one float per row and batch row.
#include <algorithm>

#include "backend/gpu/block_decoders.cuh"
#include "backend/gpu/device.cuh"
#include "backend/gpu/kernels.h"
#include "backend/gpu/tuning.h"

namespace rf::gpu {
namespace {

// Thread blocks of two teams: smaller blocks shorten the tail of a launch's last blocks (tuning.h).
constexpr int kThreads = tuning::kMatvecThreads;

// Accumulators of a group of lanes (kMaxBatch * kRows): a batch's rows, or for one activation row up to four output
// rows. Where two teams take a row, the second hands its accumulators to the first through shared memory.
constexpr int kMaxAccumulators = kMaxMatvecBatch;
constexpr int64_t kTeamSumsBytes = kThreads / kTeam * kMaxAccumulators * sizeof(float);
// Staged activations take what a launch may have of shared memory without asking for more (48 KiB) less the teams'
// exchange: staged, a batch of 3 rows of 4096 f32 values (48 KiB) had failed to launch ("invalid argument").
constexpr int64_t kMaxStagedBytes = 48 * 1024 - kTeamSumsBytes;

// Output rows of a thread block whose groups of `lanes` lanes take `group_rows` rows each.
__host__ __device__ constexpr int64_t rows_of_block(int lanes, int group_rows) {
  return kThreads / lanes * group_rows;
}

// Whether T's products read 8-bit activations (quantized weights, blocks of 32 values or more) rather than f32.
template <TensorType T>
constexpr bool kReadsQuantizedActivations = Decoder<T>::kBlockElements >= kActivationBlock;

// Slices a lane loads before it uses the first: about kMatvecSliceBytesInFlight bytes of decoded slices in registers,
// so that the bytes in flight stay high while the registers leave room for enough resident warps.
template <typename D>
constexpr int kUnroll =
    sizeof(typename D::Slice) >= tuning::kMatvecSliceBytesInFlight
        ? 1
        : (tuning::kMatvecSliceBytesInFlight / sizeof(typename D::Slice) > tuning::kMatvecMaxSlicesInFlight
               ? tuning::kMatvecMaxSlicesInFlight
               : tuning::kMatvecSliceBytesInFlight / sizeof(typename D::Slice));

// Dot product of one slice with batch row b of the activations; `block_first` is the row's first element of
// the slice's block.
template <typename D, int G, int I>
__device__ __forceinline__ float slice_dot(const QuantSlice<G, I>& s, int slice, const ProductInput& x, int64_t cols,
                                           int b, int64_t block_first) {
  const int8_t* q = x.q + b * cols + block_first;
  const ActivationScale* scales = x.scales + (b * cols + block_first) / kActivationBlock;
  float sum = 0.0f;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int start = D::group_start(slice, g);
    const int dot = decode::group_dot<I, dot4_i8>(s.q[g], q + start);
    const ActivationScale as = scales[start / kActivationBlock];
    const int level_sum = decode::group_level_sum<I>(as, start);
    sum += as.d * (s.scale[g] * static_cast<float>(dot) + s.offset[g] * static_cast<float>(level_sum));
  }
  return sum;
}

template <typename D, int G, int I>
__device__ __forceinline__ float slice_dot(const ScaledLevelSlice<G, I>& s, int slice, const ProductInput& x,
                                           int64_t cols, int b, int64_t block_first) {
  const int64_t first = b * cols + block_first;
  return decode::scaled_dot(s, x.q + first, x.scales + first / kActivationBlock,
                            [&](int g) { return D::group_start(slice, g); });
}

template <typename D, int N>
__device__ __forceinline__ float slice_dot(const FloatSlice<N>& s, int, const ProductInput& x, int64_t cols, int b,
                                           int64_t block_first) {
  const float* a = x.f32 + b * cols + block_first;
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < N; i += 4) {
    const float4 v = *reinterpret_cast<const float4*>(a + i);
    sum += s.v[i] * v.x + s.v[i + 1] * v.y + s.v[i + 2] * v.z + s.v[i + 3] * v.w;
  }
  return sum;
}

// A lane's share of one row of `blocks` blocks, each of kPerBlock pieces (slices or chunks): pieces lane,
// lane + lanes, ... counted along the row, so that consecutive lanes take consecutive pieces. `lanes` is a
// multiple of kPerBlock, so a lane takes the same piece of every block it visits, and whatever a decoder
// derives from the piece index is computed once, outside the loop. Each round issues kUnroll pieces' loads
// before it uses the first, which keeps enough bytes in flight to saturate device memory; dot(loaded, block,
// piece, b) is the piece's dot product with batch row b. With `early`, the lane waits for the kernel before
// this one (whose output are the activations) only once its first loads are out.
template <int kUnroll, int kPerBlock, int kMaxBatch, typename Load, typename Dot>
__device__ __forceinline__ void accumulate_row(int64_t blocks, int lane, int lanes, int batch, const Load& load,
                                               const Dot& dot, float (&acc)[kMaxBatch], bool early) {
  const int piece = lane % kPerBlock;
  const int first_block = lane / kPerBlock;
  const int block_step = lanes / kPerBlock;
  for (int64_t base = first_block; base < blocks; base += static_cast<int64_t>(block_step) * kUnroll) {
    decltype(load(int64_t{0}, 0)) loaded[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t block = base + u * block_step;
      if (block < blocks) loaded[u] = load(block, piece);
    }
    if (early && base == first_block) wait_for_predecessor();
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t block = base + u * block_step;
#pragma unroll
      for (int b = 0; b < kMaxBatch; ++b)
        if (block < blocks && b < batch) acc[b] += dot(loaded[u], block, piece, b);
    }
  }
}

// A group of lanes' rows: one (accumulate_row over the batch) or, for one activation row, kRows. Then the
// rows take the place of batch rows: a lane loads the same piece of each before it uses any, which keeps fewer
// rounds in flight, and all the dot products read the same activations (loaded once). load(block, piece)
// takes the block's index in the weight, first_block(r) is row r's first; dot(loaded, block, piece, b) takes
// the block's index in the row.
template <int kUnroll, int kPerBlock, int kMaxBatch, int kRows, typename FirstBlock, typename Load, typename Dot>
__device__ __forceinline__ void accumulate_rows(int64_t blocks, int lane, int lanes, int batch,
                                                const FirstBlock& first_block, const Load& load, const Dot& dot,
                                                float (&acc)[kMaxBatch * kRows], bool early) {
  if constexpr (kRows == 1) {
    const int64_t first = first_block(0);
    accumulate_row<kUnroll, kPerBlock, kMaxBatch>(
        blocks, lane, lanes, batch, [&](int64_t block, int piece) { return load(first + block, piece); }, dot, acc,
        early);
  } else {
    static_assert(kMaxBatch == 1, "several rows a group only for one activation row");
    struct Pieces {
      decltype(load(int64_t{0}, 0)) rows[kRows];
    };
    int64_t firsts[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) firsts[r] = first_block(r);
    accumulate_row<(kUnroll > kRows ? kUnroll / kRows : 1), kPerBlock, kRows>(
        blocks, lane, lanes, kRows,
        [&](int64_t block, int piece) {
          Pieces pieces;
#pragma unroll
          for (int r = 0; r < kRows; ++r) pieces.rows[r] = load(firsts[r] + block, piece);
          return pieces;
        },
        [&](const Pieces& loaded, int64_t block, int piece, int r) { return dot(loaded.rows[r], block, piece, 0); },
        acc, early);
  }
}

// The segments of one launch; thread blocks first_block[s] .. first_block[s + 1] - 1 compute segment s.
struct Segments {
  MatvecSegment segment[kMaxMatvecSegments];
  unsigned first_block[kMaxMatvecSegments + 1];
};

// The segment of this thread block, and its first thread block. Selected field by field, without indexing by a
// run-time value, which would move the parameters to local memory.
struct BlockSegment {
  MatvecSegment segment;
  unsigned first_block;
};
__device__ __forceinline__ BlockSegment block_segment(const Segments& segments) {
  const bool second = blockIdx.x >= segments.first_block[1];
  const bool third = blockIdx.x >= segments.first_block[2];
  const auto pick = [&](const auto& a, const auto& b, const auto& c) { return third ? c : second ? b : a; };
  return {{{pick(segments.segment[0].weight.blocks, segments.segment[1].weight.blocks,
                 segments.segment[2].weight.blocks),
            pick(segments.segment[0].weight.scales, segments.segment[1].weight.scales,
                 segments.segment[2].weight.scales)},
           pick(segments.segment[0].rows, segments.segment[1].rows, segments.segment[2].rows),
           pick(segments.segment[0].y, segments.segment[1].y, segments.segment[2].y)},
          pick(0u, segments.first_block[1], segments.first_block[2])};
}

// How a launch computes one weight type's rows: kChunks, by chunks (ChunkDecoder), else by slices (Decoder);
// kRows, output rows per group of lanes (more than one only for one activation row of quantized weights).
template <TensorType T, int kMaxBatch_, bool kChunks_, int kRows_>
struct Variant {
  static constexpr TensorType kType = T;
  static constexpr int kMaxBatch = kMaxBatch_;
  static constexpr bool kChunks = kChunks_;
  static constexpr int kRows = kRows_;
};

// What the thread blocks of one variant share: payload bytes per row, lanes per row.
struct RowShape {
  uint32_t row_bytes;
  int lanes;
};

// Thread block `block_index` of `segment` (its rows from block_index * rows_of_block on), computed as variant V.
template <typename V>
__device__ __forceinline__ void multiply_block(const MatvecSegment& segment, int64_t block_index, int64_t cols,
                                               RowShape shape, const ProductInput& input, int batch, bool staged,
                                               bool accumulate, bool prefetch) {
  constexpr TensorType T = V::kType;
  constexpr int kMaxBatch = V::kMaxBatch;
  constexpr bool kChunks = V::kChunks;
  constexpr int kRows = V::kRows;
  using D = Decoder<T>;
  const uint32_t row_bytes = shape.row_bytes;
  const int lanes = shape.lanes;
  const int64_t rows_per_block = rows_of_block(lanes, kRows);
  const int64_t block_row = block_index * rows_per_block;
  const int64_t row = block_row + threadIdx.x / lanes * kRows;
  const int lane = static_cast<int>(threadIdx.x) % lanes;
  const bool valid = row < segment.rows;  // rows past the end still join the shuffles below
  const WeightView weight = segment.weight;
  const int64_t blocks_per_row = cols / D::kBlockElements;
  const int64_t row_blocks = valid ? blocks_per_row : 0;
  // Row r of the group's first weight block; rows past the end read the first row again.
  const auto first_weight_block = [&](int r) { return (row + r < segment.rows ? row + r : row) * blocks_per_row; };

  // The weights do not depend on earlier kernels: the block's rows (and their split-off scales) are asked for
  // while the kernel before this one finishes (where the launch asks for it: see prefetches()).
  if (prefetch && threadIdx.x == 0) {
    const int64_t block_rows = min(rows_per_block, segment.rows - block_row);
    const auto prefetch_range = [](const void* base, int64_t begin, int64_t end) {
      const auto first = reinterpret_cast<uintptr_t>(base) + begin;
      const uintptr_t aligned = first & ~uintptr_t{15};
      const uintptr_t last = (reinterpret_cast<uintptr_t>(base) + end + 15) & ~uintptr_t{15};
      prefetch_to_l2(reinterpret_cast<const void*>(aligned), static_cast<uint32_t>(last - aligned));
    };
    prefetch_range(weight.blocks, block_row * row_bytes, (block_row + block_rows) * row_bytes);
    if (weight.scales)
      prefetch_range(weight.scales, block_row * blocks_per_row * 2, (block_row + block_rows) * blocks_per_row * 2);
  }
  // The first round of weight loads goes out before the wait (the top of the file), unless the activations are
  // staged first.
  const bool early = !staged;
  if (!early) wait_for_predecessor();

  extern __shared__ int4 stage[];
  ProductInput x{input.f32, input.q, input.scales, nullptr};
  if (staged) {
    // The batch's activation rows (8-bit levels and scales, or f32 values) to shared memory, 16 bytes a thread.
    const bool quantized = x.q != nullptr;
    const int64_t level_bytes = quantized ? batch * cols : batch * cols * 4;
    const int64_t scale_bytes = quantized ? batch * cols / kActivationBlock * 8 : 0;
    const auto* levels = reinterpret_cast<const int4*>(quantized ? static_cast<const void*>(x.q) : x.f32);
    const auto* scales = reinterpret_cast<const int4*>(x.scales);
    for (int64_t i = threadIdx.x; i < level_bytes / 16; i += kThreads) stage[i] = levels[i];
    for (int64_t i = threadIdx.x; i < scale_bytes / 16; i += kThreads) stage[level_bytes / 16 + i] = scales[i];
    __syncthreads();
    if (quantized) {
      x.q = reinterpret_cast<const int8_t*>(stage);
      x.scales = reinterpret_cast<const ActivationScale*>(stage + level_bytes / 16);
    } else {
      x.f32 = reinterpret_cast<const float*>(stage);
    }
  }

  constexpr int kAcc = kMaxBatch * kRows;
  static_assert(kAcc <= kMaxAccumulators);
  float acc[kAcc] = {};  // [row][batch row]
  if constexpr (kChunks) {
    using C = ChunkDecoder<T>;
    const auto load = [&](int64_t block, int chunk) { return C::load(weight, block, chunk); };
    const auto dot = [&](const typename C::Raw& raw, int64_t block, int chunk, int b) {
      const int64_t first = b * cols + block * D::kBlockElements;
      return C::dot(raw, chunk, x.q + first, x.scales + first / kActivationBlock);
    };
    accumulate_rows<C::kUnroll, C::kChunks, kMaxBatch, kRows>(row_blocks, lane, lanes, batch, first_weight_block,
                                                              load, dot, acc, early);
  } else {
    const auto load = [&](int64_t block, int slice) { return D::load(weight, block, slice); };
    const auto dot = [&](const typename D::Slice& loaded, int64_t block, int slice, int b) {
      return slice_dot<D>(loaded, slice, x, cols, b, block * D::kBlockElements);
    };
    accumulate_rows<kUnroll<D>, D::kSlices, kMaxBatch, kRows>(row_blocks, lane, lanes, batch, first_weight_block,
                                                              load, dot, acc, early);
  }
  if (early) wait_for_predecessor();  // lanes without a piece, and the accumulating store below
  for (int mask = min(lanes, kTeam) / 2; mask > 0; mask /= 2)
#pragma unroll
    for (int b = 0; b < kAcc; ++b) acc[b] += shuffle_xor(acc[b], mask, kTeam);
  if (lanes > kTeam) {
    // Two teams on a row: the second hands its sum to the first.
    __shared__ float team_sums[kThreads / kTeam][kAcc];
    const int team = static_cast<int>(threadIdx.x) / kTeam;
    if (lane == kTeam)
#pragma unroll
      for (int b = 0; b < kAcc; ++b) team_sums[team][b] = acc[b];
    __syncthreads();
    if (lane == 0)
#pragma unroll
      for (int b = 0; b < kAcc; ++b) acc[b] += team_sums[team + 1][b];
  }
  if (lane == 0) {
    // A group's rows of one activation row in one store where they are whole and aligned: the output matrix
    // writes the logits straight to host memory, where every store is a transaction of its own.
    if constexpr (kMaxBatch == 1 && (kRows == 2 || kRows == 4)) {
      float* out = segment.y + row;
      const bool aligned = reinterpret_cast<uintptr_t>(out) % (kRows * sizeof(float)) == 0;
      if (!accumulate && row + kRows <= segment.rows && aligned) {
        if constexpr (kRows == 4)
          *reinterpret_cast<float4*>(out) = make_float4(acc[0], acc[1], acc[2], acc[3]);
        else
          *reinterpret_cast<float2*>(out) = make_float2(acc[0], acc[1]);
        return;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int b = 0; b < kMaxBatch; ++b) {
        float* out = segment.y + b * segment.rows + row + r;
        const float sum = acc[r * kMaxBatch + b];
        if (b < batch && row + r < segment.rows) {
          if (accumulate)
            add_to(out, sum);
          else
            *out = sum;
        }
      }
    }
  }
}

// Every segment computed as variant V.
template <typename V>
__global__ void __launch_bounds__(kThreads, V::kMaxBatch * V::kRows == 1
                                                ? tuning::kMatvecMinBlocksPerMultiprocessorOneAccumulator
                                                : tuning::kMatvecMinBlocksPerMultiprocessor)
    matvec_kernel(Segments segments, int64_t cols, RowShape shape, ProductInput input, int batch, bool staged,
                  bool accumulate, bool prefetch) {
  start_successor();
  const BlockSegment s = block_segment(segments);
  multiply_block<V>(s.segment, blockIdx.x - s.first_block, cols, shape, input, batch, staged, accumulate, prefetch);
}

// One activation row, the last segment's matrix in a second type: its thread blocks (from last_first_block
// on) compute it as variant Last, the others theirs as First.
template <typename First, typename Last>
__global__ void __launch_bounds__(kThreads, tuning::kMatvecMinBlocksPerMultiprocessor)
    matvec_two_types_kernel(Segments segments, unsigned last_first_block, int64_t cols, RowShape first_shape,
                            RowShape last_shape, ProductInput input, bool accumulate, bool prefetch) {
  start_successor();
  const BlockSegment s = block_segment(segments);
  const int64_t block = blockIdx.x - s.first_block;
  if (blockIdx.x >= last_first_block)
    multiply_block<Last>(s.segment, block, cols, last_shape, input, 1, false, accumulate, prefetch);
  else
    multiply_block<First>(s.segment, block, cols, first_shape, input, 1, false, accumulate, prefetch);
}

constexpr int64_t kTwoTeamCols = tuning::kMatvecTwoTeamsAboveCols;

// Chunks of a row a lane takes at most where a team suffices for the row: fewer give narrow rows more lanes.
constexpr int kChunksPerLane = tuning::kMatvecMaxChunksPerLane;

// Lanes per row, at least 4 and the pieces of a block, at most a team (two for the widest rows): for slices,
// four to eight slices per lane, or 1.75 to 3.5 where a group of lanes takes kRows > 1 rows (tuning.h); for chunks,
// enough lanes that each takes at most kChunksPerLane chunks where a team suffices.
template <TensorType T, bool kChunks, int kRows>
int lanes_per_row(int64_t cols) {
  const int64_t blocks = cols / Decoder<T>::kBlockElements;
  int lanes = 4;
  if constexpr (kChunks) {
    lanes = std::max(lanes, ChunkDecoder<T>::kChunks);
    while (lanes < kTeam && lanes * kChunksPerLane < blocks * ChunkDecoder<T>::kChunks) lanes *= 2;
  } else {
    // Groups that take two rows are half as many; twice the lanes a row gives the launch its thread blocks back
    // (the K-quants' rows of 4096 then take 32 lanes, not 16). With one row a group (batches of 2 to 8), more
    // lanes were slower.
    constexpr int kMinQuarterSlices =
        kRows > 1 ? tuning::kMatvecMinQuarterSlicesPerLaneSeveralRows : tuning::kMatvecMinQuarterSlicesPerLane;
    lanes = std::max(lanes, Decoder<T>::kSlices);
    while (lanes < kTeam && 2 * lanes * kMinQuarterSlices <= 4 * blocks * Decoder<T>::kSlices) lanes *= 2;
  }
  // Rows wider than kTwoTeamCols take two teams, which doubles the thread blocks of a product with few such
  // rows (the 8B's down projection, 4096 rows of 14336, is one and a third waves of thread blocks with a team a
  // row, and its second wave keeps the device a third busy).
  if (lanes == kTeam && cols > kTwoTeamCols) lanes = 2 * kTeam;
  return lanes;
}

// Payload bytes and lanes per row of variant V.
template <typename V>
RowShape row_shape(int64_t cols) {
  const int64_t blocks_per_row = cols / Decoder<V::kType>::kBlockElements;
  return {static_cast<uint32_t>(device_layout(V::kType, static_cast<uint64_t>(blocks_per_row)).block_stride *
                                blocks_per_row),
          lanes_per_row<V::kType, V::kChunks, V::kRows>(cols)};
}

// Whether a launch's thread blocks ask for their rows in L2 before they wait for the kernel before them: only
// where its weights take at most the L2 over kMatvecPrefetchL2Divisor. In a larger product the prefetches are a
// burst of megabytes that fills the memory system while the small kernel before it (a norm, the attention, SwiGLU)
// works through its chains of dependent accesses; small launches, the 1B's above all, gain from starting early.
// row_bytes(i) is segment i's payload bytes per row.
template <typename RowBytes>
bool prefetches(std::span<const MatvecSegment> segments, const RowBytes& row_bytes) {
  static const uint64_t l2_bytes = device_info().l2_bytes;  // asks the driver: once
  uint64_t bytes = 0;
  for (size_t i = 0; i < segments.size(); ++i) bytes += static_cast<uint64_t>(segments[i].rows) * row_bytes(i);
  return bytes <= l2_bytes / tuning::kMatvecPrefetchL2Divisor;
}

// Packs `segments` for a kernel: segment i takes its rows' thread blocks at rows_per_block(i) rows each, after
// those of the segments before it. Returns the thread blocks in all.
template <typename RowsPerBlock>
unsigned pack(std::span<const MatvecSegment> segments, const RowsPerBlock& rows_per_block, Segments& packed) {
  unsigned blocks = 0;
  for (size_t i = 0; i < kMaxMatvecSegments; ++i) {
    packed.first_block[i] = blocks;
    if (i < segments.size()) {
      packed.segment[i] = segments[i];
      blocks += static_cast<unsigned>((segments[i].rows + rows_per_block(i) - 1) / rows_per_block(i));
    }
  }
  packed.first_block[kMaxMatvecSegments] = blocks;
  return blocks;
}

template <typename V>
void launch(std::span<const MatvecSegment> segments, int64_t cols, RowShape shape, const ProductInput& x, int batch,
            bool accumulate, gpuStream_t stream) {
  // Staged activations: levels and scales (quantized weights) or f32 values, whole 16-byte pieces.
  const int64_t stage_bytes = kReadsQuantizedActivations<V::kType> && x.q
                                  ? batch * cols + batch * cols / kActivationBlock * 8
                                  : batch * cols * 4;
  const bool staged = batch > 1 && stage_bytes <= kMaxStagedBytes && (batch * cols) % 64 == 0;
  const int64_t rows_per_block = rows_of_block(shape.lanes, V::kRows);
  Segments packed{};
  const unsigned blocks = pack(segments, [&](size_t) { return rows_per_block; }, packed);
  const size_t shared_bytes = staged ? static_cast<size_t>(stage_bytes) : 0;
  launch_overlapped("matvec", matvec_kernel<V>, blocks, kThreads, shared_bytes, stream, packed, cols, shape, x, batch,
                    staged, accumulate, prefetches(segments, [&](size_t) { return shape.row_bytes; }));
}

// The types whose products by slices take four rows a group of lanes wherever the launch still has thread blocks
// enough with four (four_rows_fill): those whose slices decode in few instructions; a type that takes many to
// decode gains more from rows of its own.
template <TensorType T>
constexpr bool kFourRowSlices = tuning::kMatvecFourRowSlices<T>;

// Whether a launch of `rows` rows of T, `cols` wide, has at least kFourRowBlocksPerMultiprocessor thread blocks per
// multiprocessor with four rows a group of lanes (by chunks or by slices); a smaller launch (the 1B's q + k) does
// better with two rows a group and twice the thread blocks.
constexpr int64_t kFourRowBlocksPerMultiprocessor = tuning::kMatvecFourRowBlocksPerMultiprocessor;
template <TensorType T, bool kChunks>
bool four_rows_fill(int64_t cols, int64_t rows) {
  static const int64_t multiprocessors = device_info().multiprocessors;  // asks the driver: once
  const int64_t blocks = rows / rows_of_block(lanes_per_row<T, kChunks, 4>(cols), 4);
  return blocks >= kFourRowBlocksPerMultiprocessor * multiprocessors;
}

// Calls fn.template operator()<V>(shape) with the variant V that computes `rows` rows of T, `cols` wide, for batches
// of up to kMaxBatch activation rows, and its row shape: by chunks where the type has a chunk decoder and the row is
// narrow enough for it, else by slices.
template <TensorType T, int kMaxBatch, typename Fn>
void with_variant(int64_t cols, int64_t rows, const Fn& fn) {
  // fn for variant V, with `teams` times the lanes a row that lanes_per_row() gives it.
  const auto run = [&]<typename V>(int teams) {
    RowShape shape = row_shape<V>(cols);
    shape.lanes *= teams;
    fn.template operator()<V>(shape);
  };
  if constexpr (ChunkDecoder<T>::kDefined) {
    if (cols / Decoder<T>::kBlockElements <= ChunkDecoder<T>::kMaxRowBlocks) {
      if constexpr (kMaxBatch == 1) {
        // Four rows a group of lanes where the launch still has thread blocks enough (four_rows_fill); two where it
        // would not, as a launch with too few thread blocks leaves multiprocessors idle.
        using Four = Variant<T, kMaxBatch, true, 4>;
        if (four_rows_fill<T, true>(cols, rows)) {
          run.template operator()<Four>(1);
          return;
        }
        // A launch that small is one wave of thread blocks, each lane's rounds of loads one after another; where a
        // team's lanes would take more than kChunksPerLane chunks of a row (Q6_K rows of 4096: four, in four rounds
        // of two rows), two teams take the row and four rows a group: the same thread blocks, half the rounds, so
        // that such a v no longer keeps the launch of q and k (whose lanes take two rounds) waiting.
        const int64_t chunks = cols / Decoder<T>::kBlockElements * ChunkDecoder<T>::kChunks;
        if (lanes_per_row<T, true, 4>(cols) == kTeam && kTeam * kChunksPerLane < chunks) {
          run.template operator()<Four>(2);
          return;
        }
      }
      run.template operator()<Variant<T, kMaxBatch, true, kMaxBatch == 1 ? 2 : 1>>(1);
      return;
    }
  }
  // One activation row of quantized weights: two output rows a group of lanes (see the top of the file), four
  // where a row takes two teams (wider than kTwoTeamCols: the 8B's down projection), and for the types whose
  // slices decode in few instructions (kFourRowSlices) also where the launch still has thread blocks enough with
  // four (four_rows_fill). Four rows for the widest rows were faster on an H200 than two once the large products
  // no longer prefetched (prefetches()).
  if constexpr (kMaxBatch == 1 && kReadsQuantizedActivations<T>) {
    if (cols > kTwoTeamCols || (kFourRowSlices<T> && four_rows_fill<T, false>(cols, rows))) {
      run.template operator()<Variant<T, 1, false, 4>>(1);
      return;
    }
  }
  run.template operator()<Variant<T, kMaxBatch, false, kMaxBatch == 1 && kReadsQuantizedActivations<T> ? 2 : 1>>(1);
}

int64_t total_rows(std::span<const MatvecSegment> segments) {
  int64_t rows = 0;
  for (const MatvecSegment& segment : segments) rows += segment.rows;
  return rows;
}

template <TensorType T, int kMaxBatch>
void launch(std::span<const MatvecSegment> segments, int64_t cols, const ProductInput& x, int batch, bool accumulate,
            gpuStream_t stream) {
  with_variant<T, kMaxBatch>(cols, total_rows(segments), [&]<typename V>(RowShape shape) {
    launch<V>(segments, cols, shape, x, batch, accumulate, stream);
  });
}

// The pairs of types one launch takes (matvec_two_types): the v projection of the _M mixes, Q6_K, after their
// Q4_K or Q5_K q and k. Both read the same 8-bit activations (Q8_K blocks).
template <TensorType T, TensorType TLast>
constexpr bool kOneLaunchPair =
    TLast == TensorType::Q6_K && (T == TensorType::Q4_K || T == TensorType::Q5_K);

// Each part in the variant its own launch would take, so that the results are those of two launches.
template <TensorType T, TensorType TLast>
void launch_two_types(std::span<const MatvecSegment> segments, const MatvecSegment& last, int64_t cols,
                      const ProductInput& x, bool accumulate, gpuStream_t stream) {
  with_variant<T, 1>(cols, total_rows(segments), [&]<typename First>(RowShape first_shape) {
    with_variant<TLast, 1>(cols, last.rows, [&]<typename Last>(RowShape last_shape) {
      MatvecSegment all[kMaxMatvecSegments];
      std::copy(segments.begin(), segments.end(), all);
      const size_t last_index = segments.size();
      all[last_index] = last;
      const auto rows_per_block = [&](size_t i) {
        return i == last_index ? rows_of_block(last_shape.lanes, Last::kRows)
                               : rows_of_block(first_shape.lanes, First::kRows);
      };
      const auto row_bytes = [&](size_t i) { return i == last_index ? last_shape.row_bytes : first_shape.row_bytes; };
      Segments packed{};
      const unsigned blocks = pack({all, last_index + 1}, rows_per_block, packed);
      launch_overlapped("matvec", matvec_two_types_kernel<First, Last>, blocks, kThreads, 0, stream, packed,
                        packed.first_block[last_index], cols, first_shape, last_shape, x, accumulate,
                        prefetches({all, last_index + 1}, row_bytes));
    });
  });
}

}  // namespace

bool has_kernels(TensorType type) {
  return row_fits_kernels(type, 0);
}

bool row_fits_kernels(TensorType type, int64_t cols) {
  bool fits = false;
  with_decoder(type, [&]<TensorType T>() { fits = cols % Decoder<T>::kBlockElements == 0; });
  return fits;
}

void matvec(TensorType type, std::span<const MatvecSegment> segments, int64_t cols, const ProductInput& x, int batch,
            bool accumulate, gpuStream_t stream) {
  if (segments.empty() || segments.size() > kMaxMatvecSegments)
    fail_with("matvec: 1 to 3 matrices per launch");
  with_decoder(type, [&]<TensorType T>() {
    // Batches are rounded up to 1, 2, 4 or 8 rows of accumulators; the unused ones cost nothing but registers.
    if (batch == 1)
      launch<T, 1>(segments, cols, x, batch, accumulate, stream);
    else if (batch == 2)
      launch<T, 2>(segments, cols, x, batch, accumulate, stream);
    else if (batch <= 4)
      launch<T, 4>(segments, cols, x, batch, accumulate, stream);
    else
      launch<T, kMaxMatvecBatch>(segments, cols, x, batch, accumulate, stream);
  });
}

bool matvec_two_types(TensorType type, std::span<const MatvecSegment> segments, TensorType last_type,
                      const MatvecSegment& last, int64_t cols, const ProductInput& x, bool accumulate,
                      gpuStream_t stream) {
  if (segments.empty() || segments.size() >= kMaxMatvecSegments)
    fail_with("matvec_two_types: 1 or 2 matrices before the last");
  bool launched = false;
  with_decoder(type, [&]<TensorType T>() {
    with_decoder(last_type, [&]<TensorType TLast>() {
      if constexpr (kOneLaunchPair<T, TLast>) {
        launch_two_types<T, TLast>(segments, last, cols, x, accumulate, stream);
        launched = true;
      }
    });
  });
  return launched;
}

}  // namespace rf::gpu
