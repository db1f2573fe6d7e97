// Products of quantized weights with 8-bit activation rows, summed in integers on the tensor cores (int8 mma.sync:
// NVIDIA sm_80 and later). A thread block takes kTileRows weight rows and up to kMaxTileCols activation rows, K tile
// by K tile of 256 elements. Each tile's weight blocks, as stored, and activation levels and scales are copied to
// shared memory (cp.async) a few tiles ahead of the one being multiplied, so that the copies are in flight while the
// block computes. The weights are then decoded there by the type's Decoder (block_decoders.cuh) as the matrix-vector
// kernels decode them, into levels and group scales; each warp multiplies its 16 weight rows with every activation
// row, one group (16 or 32 elements under one scale) at a time, and applies the group's scales as the matrix-vector
// kernels do (a factor times the integer dot product, an offset times the activations' sum). So the weights are read
// once per kMaxTileCols rows in their stored type, never dequantized to f16, and the results differ from the
// matrix-vector kernels' only in the order of float additions.
//
// Matrices with too few row tiles to fill the device split K over thread blocks, by a count that depends on the
// matrix alone. Each split writes its part, and the last of a tile to finish adds the parts in split order: every
// value is summed in the same order however the thread blocks ran and whatever the batch, so a row's results are the
// same bits alone or among others.
#include <algorithm>
#include <type_traits>

#include "backend/gpu/block_decoders.cuh"
#include "backend/gpu/device.cuh"
#include "backend/gpu/kernels.h"
#include "backend/gpu/tuning.h"

namespace rf::gpu {

#if defined(ROCMFORGE_GPU_HIP)

// AMD GPUs have no mma.sync; their matrix cores would need a kernel of their own.
TileScratch::TileScratch() = default;

bool has_matmul_q8(TensorType) { return false; }

void matmul_q8(TensorType, const MatvecSegment&, int64_t, const ProductInput&, int64_t, bool, const TileScratch&,
               gpuStream_t) {
  fail_with("no 8-bit tensor-core products in this build");
}

#else

namespace {

constexpr int kTileRows = 64;  // weight rows of a thread block: 16 a warp
constexpr int kWarps = kTileRows / 16;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kMaxTileCols = 64;  // activation rows of a thread block at most
constexpr int kTileK = 256;       // elements of a K tile: a super-block, or eight 32-element blocks
// Bytes of a staged row: padded by 16, so that the eight rows of a fragment (272 bytes apart) fall in distinct
// banks.
constexpr int kStagedRowBytes = kTileK + 16;
constexpr int kActivationBlocksPerTile = kTileK / kActivationBlock;
// Shared memory a thread block may take, so that two fit on a multiprocessor (228 KB on sm_90) and one's copies
// are in flight while the other computes.
constexpr size_t kSharedBytesPerBlock = 110 * 1024;

template <typename Slice>
struct IntegerScales : std::false_type {};
template <int G, int I>
struct IntegerScales<ScaledLevelSlice<G, I>> : std::true_type {};

// How T's K tiles decode: slices of ScaledLevelSlice (integer scales under the block's d and dmin, with Q8_K
// activations, one scale per tile) or QuantSlice (a float scale and offset per group).
template <TensorType T>
struct Tiling {
  using D = Decoder<T>;
  using Slice = typename D::Slice;
  static constexpr bool kIntegerScales = IntegerScales<Slice>::value;
  static constexpr int kGroupElements = 4 * Slice::kInts;
  static constexpr int kGroups = kTileK / kGroupElements;
  static constexpr int kBlocks = kTileK / D::kBlockElements;  // weight blocks of a row in a tile
  static constexpr int kSlices = kBlocks * D::kSlices;        // slices of a row in a tile
  static constexpr int kRowBytes = kBlocks * D::kPayloadBytes;
  // The widest copy that every payload's alignment in device memory allows.
  static constexpr int kCopyBytes = D::kPayloadBytes % 16 == 0 ? 16 : D::kPayloadBytes % 8 == 0 ? 8 : 4;
  static constexpr bool kSplitScales = split_scale_offset(T) >= 0;
  using GroupScale = std::conditional_t<kIntegerScales, int, float>;
  static_assert(!kIntegerScales || kBlocks == 1, "integer scales come with super-blocks of 256 elements");
};

// One K tile as copied from device memory for a thread block of kCols activation rows: the weights' payloads as
// they lie there, for split types the aligned word that holds each block's scale (cp.async copies 4 bytes at least),
// and the activations' levels and scales.
template <TensorType T, int kCols>
struct Stage {
  using Z = Tiling<T>;
  alignas(16) uint8_t weights[kTileRows * Z::kRowBytes];
  alignas(16) int8_t activations[kCols][kStagedRowBytes];
  ActivationScale activation_scales[kCols][kActivationBlocksPerTile];
  uint32_t scale_words[Z::kSplitScales ? kTileRows * Z::kBlocks : 1];
};

// A stage decoded: the weights' levels in element order and each group's scales (rows padded by one, so that the
// eight rows of a fragment fall in distinct banks), and the activations' scales and level sums per weight group,
// column by column (a thread's two columns are one load).
template <TensorType T, int kCols>
struct Decoded {
  using Z = Tiling<T>;
  alignas(16) uint8_t weights[kTileRows][kStagedRowBytes];
  typename Z::GroupScale scale[kTileRows][Z::kGroups + 1];   // per weight group: the scale, and
  typename Z::GroupScale offset[kTileRows][Z::kGroups + 1];  // the offset (QuantSlice) or min (ScaledLevelSlice)
  float d[kTileRows];                                        // ScaledLevelSlice: the block's factors
  float dmin[kTileRows];
  alignas(8) float activation_d[kActivationBlocksPerTile][kCols];
  alignas(8) int level_sum[Z::kGroups][kCols];
};

template <TensorType T, int kCols, int kStages>
struct Shared {
  Stage<T, kCols> stages[kStages];
  Decoded<T, kCols> decoded;
};

// Stages in flight: as many as fit kSharedBytesPerBlock, from 2 to 4.
template <TensorType T, int kCols>
constexpr int kStages = sizeof(Shared<T, kCols, 4>) <= kSharedBytesPerBlock   ? 4
                        : sizeof(Shared<T, kCols, 3>) <= kSharedBytesPerBlock ? 3
                                                                              : 2;

// Asynchronous copies to shared memory (sm_80 and later); an invalid one writes zeros and reads nothing.
template <int kBytes>
__device__ __forceinline__ void copy_async(void* shared, const void* global, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  const int source_bytes = valid ? kBytes : 0;
  if constexpr (kBytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(address), "l"(global), "r"(source_bytes)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(address), "l"(global), "n"(kBytes),
                 "r"(source_bytes)
                 : "memory");
#endif
}

__device__ __forceinline__ void commit_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most kPending of this thread's committed groups of copies are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

// Calls fn(i) for i = threadIdx.x, + kThreads, ... below kCount, unrolled.
template <int kCount, typename Fn>
__device__ __forceinline__ void for_each_share(const Fn& fn) {
#pragma unroll
  for (int k = 0; k < (kCount + kThreads - 1) / kThreads; ++k) {
    const int i = k * kThreads + static_cast<int>(threadIdx.x);
    if (kCount % kThreads == 0 || i < kCount) fn(i);
  }
}

// c += a b for a 16 x k tile of weight levels (unsigned with integer scales, else signed) and a k x 8 tile of
// activation levels, k = 16 (a: 2 registers, b: 1) or 32 (a: 4, b: 2), in the fragment layouts of PTX's mma.
template <bool kUnsigned, int kK>
__device__ __forceinline__ void mma(int (&c)[4], const int (&a)[kK / 8], const int (&b)[kK / 16]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kK == 16 && kUnsigned)
    asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(b[0]));
  else if constexpr (kK == 16)
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(b[0]));
  else if constexpr (kUnsigned)
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // the host launches this only on sm_80 and later
#endif
}

// The thread block's rows and columns of the product, and how it copies and decodes their K tiles.
template <TensorType T, int kCols>
struct TileBlock {
  using Z = Tiling<T>;
  using D = typename Z::D;
  const MatvecSegment& w;
  int64_t cols;
  int64_t row_blocks;  // weight blocks of a row
  int64_t first_row;
  const ProductInput& x;
  int64_t n;
  int64_t first_col;

  // Starts copying K tile `tile` of the weight rows into `stage`.
  __device__ __forceinline__ void copy_weights(int64_t tile, Stage<T, kCols>& stage) const {
    constexpr int kUnitsPerBlock = D::kPayloadBytes / Z::kCopyBytes;
    constexpr int kUnitsPerRow = Z::kBlocks * kUnitsPerBlock;
    for_each_share<kTileRows * kUnitsPerRow>([&](int i) {
      const int r = i / kUnitsPerRow;
      const int unit = i % kUnitsPerRow;
      const int64_t block = tile * Z::kBlocks + unit / kUnitsPerBlock;
      const bool valid = first_row + r < w.rows && block < row_blocks;
      const uint8_t* source = w.weight.blocks;
      if (valid)
        source += ((first_row + r) * row_blocks + block) * D::kPayloadBytes + unit % kUnitsPerBlock * Z::kCopyBytes;
      copy_async<Z::kCopyBytes>(&stage.weights[i * Z::kCopyBytes], source, valid);
    });
    if constexpr (Z::kSplitScales) {
      for_each_share<kTileRows * Z::kBlocks>([&](int i) {
        const int r = i / Z::kBlocks;
        const int64_t block = tile * Z::kBlocks + i % Z::kBlocks;
        const bool valid = first_row + r < w.rows && block < row_blocks;
        const uint16_t* source = w.weight.scales;
        if (valid) source += ((first_row + r) * row_blocks + block) & ~int64_t{1};
        copy_async<4>(&stage.scale_words[i], source, valid);
      });
    }
  }

  // Starts copying K tile `tile` of the activation rows into `stage`; rows past n and elements past the row's end
  // are zeros.
  __device__ __forceinline__ void copy_activations(int64_t tile, Stage<T, kCols>& stage) const {
    constexpr int kPieces = kTileK / 16;
    for_each_share<kCols * kPieces>([&](int i) {
      const int c = i / kPieces;
      const int64_t element = tile * kTileK + 16 * (i % kPieces);
      const bool valid = first_col + c < n && element < cols;
      copy_async<16>(&stage.activations[c][16 * (i % kPieces)], valid ? x.q + (first_col + c) * cols + element : x.q,
                     valid);
    });
    for_each_share<kCols * kActivationBlocksPerTile>([&](int i) {
      const int c = i / kActivationBlocksPerTile;
      const int64_t element = tile * kTileK + i % kActivationBlocksPerTile * kActivationBlock;
      const bool valid = first_col + c < n && element < cols;
      const ActivationScale* source =
          valid ? x.scales + ((first_col + c) * cols + element) / kActivationBlock : x.scales;
      copy_async<8>(&stage.activation_scales[c][i % kActivationBlocksPerTile], source, valid);
    });
  }

  // Decodes K tile `tile`, copied to `stage`, into `decoded`.
  __device__ __forceinline__ void decode(int64_t tile, const Stage<T, kCols>& stage, Decoded<T, kCols>& decoded) const {
    for_each_share<kCols * kActivationBlocksPerTile>([&](int i) {
      const int c = i % kCols;
      const int b = i / kCols;
      const ActivationScale scale = stage.activation_scales[c][b];
      decoded.activation_d[b][c] = scale.d;
      if constexpr (Z::kGroupElements == 32) {
        decoded.level_sum[b][c] = scale.sum[0] + scale.sum[1];
      } else {
        decoded.level_sum[2 * b][c] = scale.sum[0];
        decoded.level_sum[2 * b + 1][c] = scale.sum[1];
      }
    });
    for_each_share<kTileRows * Z::kSlices>([&](int i) {
      const int r = i / Z::kSlices;
      const int block = i % Z::kSlices / D::kSlices;
      const int slice = i % D::kSlices;
      const int staged = r * Z::kBlocks + block;
      WeightView view{stage.weights, nullptr};
      if constexpr (Z::kSplitScales) {
        // The block's scale is the half of its staged word that the parity of its index in device memory picks;
        // the decoder reads it at view.scales + staged.
        const int64_t index = (first_row + r) * row_blocks + tile * Z::kBlocks + block;
        view.scales = reinterpret_cast<const uint16_t*>(stage.scale_words) + staged + (index & 1);
      }
      const typename Z::Slice q = D::template load<StagedBlocks>(view, staged, slice);
#pragma unroll
      for (int g = 0; g < Z::Slice::kGroups; ++g) {
        const int start = block * D::kBlockElements + D::group_start(slice, g);
#pragma unroll
        for (int k = 0; k < Z::Slice::kInts; k += 4)
          *reinterpret_cast<int4*>(&decoded.weights[r][start + 4 * k]) =
              make_int4(q.q[g][k], q.q[g][k + 1], q.q[g][k + 2], q.q[g][k + 3]);
        const int group = start / Z::kGroupElements;
        decoded.scale[r][group] = q.scale[g];
        if constexpr (Z::kIntegerScales)
          decoded.offset[r][group] = q.min[g];
        else
          decoded.offset[r][group] = q.offset[g];
      }
      if constexpr (Z::kIntegerScales) {
        if (slice == 0) {
          decoded.d[r] = q.d;
          decoded.dmin[r] = q.dmin;
        }
      }
    });
  }
};

// Thread block (row tile, column tile, split) of y (+)= x W^T for a segment of `T` weights; a column tile is
// kColTiles fragments of 8 activation rows. Where `splits` > 1 (one column tile), the splits write their parts to
// `parts` and count their arrivals at `arrivals` (zero between launches). K tiles are copied kStages - 1 ahead of
// the one being multiplied, so that a thread block keeps device memory busy while it decodes and multiplies.
template <TensorType T, int kColTiles>
__global__ void __launch_bounds__(kThreads)
    matmul_q8_kernel(MatvecSegment w, int64_t cols, ProductInput x, int64_t n, bool accumulate, int splits,
                     float* parts, unsigned* arrivals) {
  using Z = Tiling<T>;
  constexpr int kK = Z::kGroupElements;
  constexpr int kCols = 8 * kColTiles;
  constexpr int kDepth = kStages<T, kCols>;
  extern __shared__ uint4 shared_memory[];
  auto& s = *reinterpret_cast<Shared<T, kCols, kDepth>*>(shared_memory);
  start_successor();
  const TileBlock<T, kCols> block{w,
                                  cols,
                                  cols / Z::D::kBlockElements,
                                  static_cast<int64_t>(blockIdx.x) * kTileRows,
                                  x,
                                  n,
                                  static_cast<int64_t>(blockIdx.y) * kCols};
  const int64_t tiles = (cols + kTileK - 1) / kTileK;
  const int64_t tiles_per_split = (tiles + splits - 1) / splits;
  const int64_t first_tile = blockIdx.z * tiles_per_split;
  const int64_t end_tile = min(tiles, first_tile + tiles_per_split);

  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int group_id = lane / 4;  // the fragments' row (of A and C) and column (of B)
  const int thread_id = lane % 4;
  const int rows[2] = {warp * 16 + group_id, warp * 16 + group_id + 8};

  // The weights come from no earlier kernel: their first stages are requested before waiting for it.
  for (int k = 0; k < kDepth - 1; ++k)
    if (first_tile + k < end_tile) block.copy_weights(first_tile + k, s.stages[k]);
  wait_for_predecessor();
  for (int k = 0; k < kDepth - 1; ++k) {
    if (first_tile + k < end_tile) block.copy_activations(first_tile + k, s.stages[k]);
    commit_copies();
  }

  float acc[kColTiles][4] = {};
  for (int64_t tile = first_tile; tile < end_tile; ++tile) {
    const int64_t step = tile - first_tile;
    wait_copies<kDepth - 2>();  // this thread's copies of the tile have landed
    __syncthreads();            // and everyone's; the previous tile's stage and fragments are read
    const int64_t ahead = tile + kDepth - 1;
    if (ahead < end_tile) {
      Stage<T, kCols>& next = s.stages[(step + kDepth - 1) % kDepth];
      block.copy_weights(ahead, next);
      block.copy_activations(ahead, next);
    }
    commit_copies();  // possibly empty: every step commits one group
    const Stage<T, kCols>& stage = s.stages[step % kDepth];
    block.decode(tile, stage, s.decoded);
    __syncthreads();
    const Decoded<T, kCols>& d = s.decoded;
    int sums[kColTiles][4] = {};
    int mins[kColTiles][4] = {};
#pragma unroll
    for (int group = 0; group < Z::kGroups; ++group) {
      const int k = group * kK + 4 * thread_id;
      int a[kK / 8];
      a[0] = *reinterpret_cast<const int*>(&d.weights[rows[0]][k]);
      a[1] = *reinterpret_cast<const int*>(&d.weights[rows[1]][k]);
      if constexpr (kK == 32) {
        a[2] = *reinterpret_cast<const int*>(&d.weights[rows[0]][k + 16]);
        a[3] = *reinterpret_cast<const int*>(&d.weights[rows[1]][k + 16]);
      }
      const typename Z::GroupScale scale[2] = {d.scale[rows[0]][group], d.scale[rows[1]][group]};
      const typename Z::GroupScale offset[2] = {d.offset[rows[0]][group], d.offset[rows[1]][group]};
#pragma unroll
      for (int t = 0; t < kColTiles; ++t) {
        int b[kK / 16];
        b[0] = *reinterpret_cast<const int*>(&stage.activations[8 * t + group_id][k]);
        if constexpr (kK == 32) b[1] = *reinterpret_cast<const int*>(&stage.activations[8 * t + group_id][k + 16]);
        int c[4] = {0, 0, 0, 0};
        mma<Z::kIntegerScales, kK>(c, a, b);
        // c[i]: weight row rows[i / 2], activation row 8t + 2 thread_id + i % 2.
        const int col = 8 * t + 2 * thread_id;
        const int2 sum2 = *reinterpret_cast<const int2*>(&d.level_sum[group][col]);
        const int sum[2] = {sum2.x, sum2.y};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if constexpr (Z::kIntegerScales) {
            sums[t][i] += scale[i / 2] * c[i];
            mins[t][i] += offset[i / 2] * sum[i % 2];
          } else {
            const float xd = d.activation_d[group * kK / kActivationBlock][col + i % 2];
            acc[t][i] +=
                xd * (scale[i / 2] * static_cast<float>(c[i]) + offset[i / 2] * static_cast<float>(sum[i % 2]));
          }
        }
      }
    }
    if constexpr (Z::kIntegerScales) {
      // One Q8_K scale per activation row and tile.
#pragma unroll
      for (int t = 0; t < kColTiles; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = rows[i / 2];
          acc[t][i] += d.activation_d[0][8 * t + 2 * thread_id + i % 2] *
                       (d.d[row] * static_cast<float>(sums[t][i]) - d.dmin[row] * static_cast<float>(mins[t][i]));
        }
    }
  }

  const auto store = [&](int t, int i, float value) {
    const int64_t row = block.first_row + rows[i / 2];
    const int64_t col = block.first_col + 8 * t + 2 * thread_id + i % 2;
    if (row >= w.rows || col >= n) return;
    float* out = w.y + col * w.rows + row;
    *out = accumulate ? *out + value : value;
  };
  if (splits == 1) {
#pragma unroll
    for (int t = 0; t < kColTiles; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) store(t, i, acc[t][i]);
    return;
  }
  // A value's place in a split's part of the tile.
  const auto part_index = [&](int t, int i) { return rows[i / 2] * kCols + 8 * t + 2 * thread_id + i % 2; };
  constexpr int kPartFloats = kTileRows * kCols;
  float* const tile_parts = parts + static_cast<int64_t>(blockIdx.x) * splits * kPartFloats;
#pragma unroll
  for (int t = 0; t < kColTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) tile_parts[blockIdx.z * kPartFloats + part_index(t, i)] = acc[t][i];
  if (!arrive_last(arrivals + blockIdx.x, static_cast<unsigned>(splits))) return;
  // Split after split, so that a thread's loads of one split are in flight together.
  float sums[kColTiles][4] = {};
  for (int split = 0; split < splits; ++split)
#pragma unroll
    for (int t = 0; t < kColTiles; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) sums[t][i] += __ldcg(&tile_parts[split * kPartFloats + part_index(t, i)]);
#pragma unroll
  for (int t = 0; t < kColTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) store(t, i, sums[t][i]);
}

template <TensorType T>
constexpr bool kTiled = Decoder<T>::kBlockElements >= kActivationBlock;

}  // namespace

TileScratch::TileScratch() {
  // A launch splits K only where it has fewer row tiles than the wanted thread blocks, and then takes one column tile:
  // fewer tiles than that, and parts for fewer than twice as many tiles.
  max_tiles = tuning::kMatmulQ8BlocksPerMultiprocessor * device_info().multiprocessors;
  part_floats = 2 * max_tiles * kTileRows * kMaxTileCols;
  parts = DeviceBuffer(static_cast<size_t>(part_floats) * sizeof(float), "the split products' parts");
  arrivals = DeviceBuffer(static_cast<size_t>(max_tiles) * sizeof(unsigned), "the split products' counters");
  const Stream stream;
  check(gpuMemsetAsync(arrivals.data(), 0, arrivals.bytes(), stream.get()), "clearing the split products' counters");
  stream.synchronize();
}

bool has_matmul_q8(TensorType type) {
  static const bool tensor_cores = device_info().compute_capability >= 80;  // asks the driver: once
  bool tiled = false;
  with_decoder(type, [&]<TensorType T>() { tiled = kTiled<T>; });
  return tiled && tensor_cores;
}

void matmul_q8(TensorType type, const MatvecSegment& segment, int64_t cols, const ProductInput& x, int64_t n,
               bool accumulate, const TileScratch& scratch, gpuStream_t stream) {
  static const int multiprocessors = device_info().multiprocessors;  // asks the driver: once
  if (!x.q || !x.scales) fail_with("matmul_q8: the activations have no 8-bit form");
  with_decoder(type, [&]<TensorType T>() {
    if constexpr (kTiled<T>) {
      // Activation rows a thread block takes: n rounded up to 8, 16 or 32 where it is that small, else kMaxTileCols.
      const auto launch = [&]<int kColTiles>() {
        constexpr int kCols = 8 * kColTiles;
        const int64_t row_tiles = (segment.rows + kTileRows - 1) / kTileRows;
        // K is split where the row tiles alone give fewer than kMatmulQ8BlocksPerMultiprocessor thread blocks a
        // multiprocessor, each split taking at least one K tile: by the matrix alone, not the batch.
        const int64_t k_tiles = (cols + kTileK - 1) / kTileK;
        const int64_t wanted = tuning::kMatmulQ8BlocksPerMultiprocessor * multiprocessors;
        int64_t splits = std::clamp<int64_t>((wanted + row_tiles - 1) / row_tiles, 1, k_tiles);
        const int64_t tiles_per_split = (k_tiles + splits - 1) / splits;
        splits = (k_tiles + tiles_per_split - 1) / tiles_per_split;
        constexpr size_t kSharedBytes = sizeof(Shared<T, kCols, kStages<T, kCols>>);
        // Asked for once per kernel rather than at every launch.
        static const auto kernel = [] {
          check(cudaFuncSetAttribute(matmul_q8_kernel<T, kColTiles>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kSharedBytes)),
                "matmul_q8: asking for shared memory");
          return matmul_q8_kernel<T, kColTiles>;
        }();
        const auto launch_columns = [&](int64_t first, int64_t count, unsigned col_tiles) {
          ProductInput columns = x;
          columns.q += first * cols;
          columns.scales += first * cols / kActivationBlock;
          MatvecSegment out = segment;
          out.y += first * segment.rows;
          launch_overlapped("matmul_q8", kernel,
                            dim3(static_cast<unsigned>(row_tiles), col_tiles, static_cast<unsigned>(splits)),
                            dim3(kThreads), kSharedBytes, stream, out, cols, columns, count, accumulate,
                            static_cast<int>(splits), scratch.parts.as<float>(), scratch.arrivals.as<unsigned>());
        };
        if (splits == 1) {
          launch_columns(0, n, static_cast<unsigned>((n + kCols - 1) / kCols));
          return;
        }
        if (row_tiles > scratch.max_tiles || row_tiles * splits * kTileRows * kCols > scratch.part_floats)
          fail_with("matmul_q8: the split products' scratch is too small");
        // A split launch takes one column tile, so that its parts fit the scratch.
        for (int64_t first = 0; first < n; first += kCols)
          launch_columns(first, std::min<int64_t>(kCols, n - first), 1);
      };
      if (n <= 8)
        launch.template operator()<1>();
      else if (n <= 16)
        launch.template operator()<2>();
      else if (n <= 32)
        launch.template operator()<4>();
      else
        launch.template operator()<kMaxTileCols / 8>();
    } else {
      fail_with("matmul_q8: weights that take f32 activations");
    }
  });
}

#endif

}  // namespace rf::gpu
