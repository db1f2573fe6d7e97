// Products of quantized weights with 8-bit activation rows, summed in integers on the tensor cores (int8 mma.sync:
// NVIDIA sm_80 and later). A thread block takes kTileRows weight rows and up to kMaxTileCols activation rows. For each
// K tile of 256 elements it stages the weights' levels and group scales, decoded by the type's Decoder
// (block_decoders.cuh) as the matrix-vector kernels decode them, and the activations' 8-bit levels, scales and sums;
// then each warp multiplies its 16 weight rows with every activation row, one group (16 or 32 elements under one
// scale) at a time, and applies the group's scales as the matrix-vector kernels do (a factor times the integer dot
// product, an offset times the activations' sum). So the weights are read once per kMaxTileCols rows in their stored
// type, never dequantized to f16, and the results differ from the matrix-vector kernels' only in the order of float
// additions.
//
// Matrices with too few row tiles to fill the device split K over thread blocks, by a count that depends on the
// matrix alone. Each split writes its part, and the last of a tile to finish adds the parts in split order: every
// value is summed in the same order however the thread blocks ran and whatever the batch, so a row's results are the
// same bits alone or among others.
//
// A tile of 64 rows that holds only a few activation rows leaves the tensor cores mostly idle while each thread
// block stages and decodes its weights: up to kMaxOrderedRows activation rows of weights with integer scales (the
// K-quants and IQ4_XS) run instead as a matrix-vector pass that sums in the tile kernel's order
// (matvec_in_tile_order_kernel). Its lanes read the weights as the matrix-vector kernels do, each lane a slice of a K
// tile at a time, several in flight, in any order: a tile's integer sums are exact whatever the order, and its float
// factor (tile_inner) is computed with the same roundings. The thread block keeps those factors in shared memory
// and then walks each row's tiles in the tile kernel's order, split by split (add_tile), and adds the splits in
// split order. So a row's results are the same bits at every batch, while the weights stream at matrix-vector speed.
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
constexpr int kMaxGroups = kTileK / 16;
constexpr int kActivationBlocksPerTile = kTileK / kActivationBlock;

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
  using GroupScale = std::conditional_t<kIntegerScales, int, float>;
  static_assert(!kIntegerScales || kBlocks == 1, "integer scales come with super-blocks of 256 elements");
};

// A K tile's term of one output with integer scales is xd (d sum - dmin offset), for the activation row's scale xd
// and the weight row's factors: tile_inner is the part in brackets, add_tile adds the term to acc. Every rounding is
// spelled out, so that the compiler contracts nothing its own way and both kernels that sum tiles get the same bits.
__device__ __forceinline__ float tile_inner(float d, float dmin, int sum, int offset) {
  return __fmaf_rn(d, static_cast<float>(sum), __fmul_rn(-dmin, static_cast<float>(offset)));
}
__device__ __forceinline__ float add_tile(float acc, float xd, float inner) { return __fmaf_rn(xd, inner, acc); }

// Output (weight row, activation row) of y (+)= x W^T.
__device__ __forceinline__ void store_output(const MatvecSegment& w, int64_t row, int64_t col, bool accumulate,
                                             float value) {
  float* out = w.y + col * w.rows + row;
  *out = accumulate ? *out + value : value;
}

// How K is split over thread blocks for a matrix of `rows` rows and `k_tiles` K tiles: where the row tiles alone give
// fewer than kMatmulQ8BlocksPerMultiprocessor thread blocks a multiprocessor, each split taking at least one K tile
// and every split some. By the matrix alone, not the batch.
struct KSplit {
  int64_t splits;
  int64_t tiles_per_split;
};
KSplit k_split(int64_t rows, int64_t k_tiles) {
  static const int multiprocessors = device_info().multiprocessors;  // asks the driver: once
  const int64_t row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int64_t wanted = tuning::kMatmulQ8BlocksPerMultiprocessor * multiprocessors;
  const int64_t splits = std::clamp<int64_t>((wanted + row_tiles - 1) / row_tiles, 1, k_tiles);
  const int64_t tiles_per_split = (k_tiles + splits - 1) / splits;
  return {(k_tiles + tiles_per_split - 1) / tiles_per_split, tiles_per_split};
}

// What a thread block of kCols activation rows stages of one K tile.
template <TensorType T, int kCols>
struct Staged {
  using GroupScale = typename Tiling<T>::GroupScale;
  alignas(16) uint8_t weights[kTileRows][kStagedRowBytes];  // levels, in element order
  alignas(16) int8_t activations[kCols][kStagedRowBytes];   // levels
  GroupScale scale[kTileRows][kMaxGroups];                  // per weight group: the scale, and
  GroupScale offset[kTileRows][kMaxGroups];                 // the offset (QuantSlice) or min (ScaledLevelSlice)
  float d[kTileRows];                                       // ScaledLevelSlice: the block's factors
  float dmin[kTileRows];
  float activation_d[kCols][kActivationBlocksPerTile];
  int16_t activation_sum[kCols][kMaxGroups];  // levels' sum per weight group
};

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

// Stages K tile `tile` of the block's weight rows (from first_row) and activation rows (from first_col).
template <TensorType T, int kCols>
__device__ __forceinline__ void stage(Staged<T, kCols>& s, const MatvecSegment& w, int64_t cols, int64_t first_row,
                                      const ProductInput& x, int64_t n, int64_t first_col, int64_t tile) {
  using Z = Tiling<T>;
  using D = typename Z::D;
  const int64_t row_blocks = cols / D::kBlockElements;
  for (int i = static_cast<int>(threadIdx.x); i < kTileRows * Z::kSlices; i += kThreads) {
    const int r = i / Z::kSlices;
    const int block = i % Z::kSlices / D::kSlices;
    const int slice = i % D::kSlices;
    const int64_t row_block = tile * Z::kBlocks + block;
    const bool valid = first_row + r < w.rows && row_block < row_blocks;
    typename Z::Slice q{};
    if (valid) q = D::load(w.weight, (first_row + r) * row_blocks + row_block, slice);
#pragma unroll
    for (int g = 0; g < Z::Slice::kGroups; ++g) {
      const int start = block * D::kBlockElements + D::group_start(slice, g);
#pragma unroll
      for (int k = 0; k < Z::Slice::kInts; k += 4)
        *reinterpret_cast<int4*>(&s.weights[r][start + 4 * k]) =
            make_int4(q.q[g][k], q.q[g][k + 1], q.q[g][k + 2], q.q[g][k + 3]);
      const int group = start / Z::kGroupElements;
      if constexpr (Z::kIntegerScales) {
        s.scale[r][group] = q.scale[g];
        s.offset[r][group] = q.min[g];
      } else {
        s.scale[r][group] = q.scale[g];
        s.offset[r][group] = q.offset[g];
      }
    }
    if constexpr (Z::kIntegerScales) {
      if (slice == 0) {
        s.d[r] = valid ? q.d : 0.0f;
        s.dmin[r] = valid ? q.dmin : 0.0f;
      }
    }
  }
  // Activation rows past n and elements past the row's end stage as zeros.
  constexpr int kPieces = kTileK / 16;
  for (int i = static_cast<int>(threadIdx.x); i < kCols * kPieces; i += kThreads) {
    const int c = i / kPieces;
    const int64_t element = tile * kTileK + 16 * (i % kPieces);
    int4 levels = make_int4(0, 0, 0, 0);
    if (first_col + c < n && element < cols) levels = load_16(x.q + (first_col + c) * cols + element);
    *reinterpret_cast<int4*>(&s.activations[c][16 * (i % kPieces)]) = levels;
  }
  for (int i = static_cast<int>(threadIdx.x); i < kCols * kActivationBlocksPerTile; i += kThreads) {
    const int c = i / kActivationBlocksPerTile;
    const int b = i % kActivationBlocksPerTile;
    const int64_t element = tile * kTileK + b * kActivationBlock;
    ActivationScale scale{0.0f, {0, 0}};
    if (first_col + c < n && element < cols) scale = x.scales[((first_col + c) * cols + element) / kActivationBlock];
    s.activation_d[c][b] = scale.d;
    if constexpr (Z::kGroupElements == 32) {
      s.activation_sum[c][b] = static_cast<int16_t>(scale.sum[0] + scale.sum[1]);
    } else {
      s.activation_sum[c][2 * b] = scale.sum[0];
      s.activation_sum[c][2 * b + 1] = scale.sum[1];
    }
  }
}

// Thread block (row tile, column tile, split) of y (+)= x W^T for a segment of `T` weights; a column tile is
// kColTiles fragments of 8 activation rows. K is split as k_split says; where `splits` > 1 (one column tile), the
// splits write their parts to `parts` and count their arrivals at `arrivals` (zero between launches).
template <TensorType T, int kColTiles>
__global__ void __launch_bounds__(kThreads)
    matmul_q8_kernel(MatvecSegment w, int64_t cols, ProductInput x, int64_t n, bool accumulate, int splits,
                     int tiles_per_split, float* parts, unsigned* arrivals) {
  using Z = Tiling<T>;
  constexpr int kK = Z::kGroupElements;
  constexpr int kCols = 8 * kColTiles;
  __shared__ Staged<T, kCols> s;
  start_successor();
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kTileRows;
  const int64_t first_col = static_cast<int64_t>(blockIdx.y) * kCols;
  const int64_t tiles = (cols + kTileK - 1) / kTileK;
  const int64_t first_tile = static_cast<int64_t>(blockIdx.z) * tiles_per_split;
  const int64_t end_tile = min(tiles, first_tile + tiles_per_split);

  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int group_id = lane / 4;  // the fragments' row (of A and C) and column (of B)
  const int thread_id = lane % 4;
  const int rows[2] = {warp * 16 + group_id, warp * 16 + group_id + 8};

  float acc[kColTiles][4] = {};
  wait_for_predecessor();
  for (int64_t tile = first_tile; tile < end_tile; ++tile) {
    __syncthreads();  // the previous tile's fragments are read
    stage<T>(s, w, cols, first_row, x, n, first_col, tile);
    __syncthreads();
    int sums[kColTiles][4] = {};
    int mins[kColTiles][4] = {};
#pragma unroll
    for (int group = 0; group < Z::kGroups; ++group) {
      const int k = group * kK + 4 * thread_id;
      int a[kK / 8];
      a[0] = *reinterpret_cast<const int*>(&s.weights[rows[0]][k]);
      a[1] = *reinterpret_cast<const int*>(&s.weights[rows[1]][k]);
      if constexpr (kK == 32) {
        a[2] = *reinterpret_cast<const int*>(&s.weights[rows[0]][k + 16]);
        a[3] = *reinterpret_cast<const int*>(&s.weights[rows[1]][k + 16]);
      }
      const typename Z::GroupScale scale[2] = {s.scale[rows[0]][group], s.scale[rows[1]][group]};
      const typename Z::GroupScale offset[2] = {s.offset[rows[0]][group], s.offset[rows[1]][group]};
#pragma unroll
      for (int t = 0; t < kColTiles; ++t) {
        int b[kK / 16];
        b[0] = *reinterpret_cast<const int*>(&s.activations[8 * t + group_id][k]);
        if constexpr (kK == 32) b[1] = *reinterpret_cast<const int*>(&s.activations[8 * t + group_id][k + 16]);
        int c[4] = {0, 0, 0, 0};
        mma<Z::kIntegerScales, kK>(c, a, b);
        // c[i]: weight row rows[i / 2], activation row 8t + 2 thread_id + i % 2.
        const int col = 8 * t + 2 * thread_id;
        const int level_sum[2] = {s.activation_sum[col][group], s.activation_sum[col + 1][group]};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if constexpr (Z::kIntegerScales) {
            sums[t][i] += scale[i / 2] * c[i];
            mins[t][i] += offset[i / 2] * level_sum[i % 2];
          } else {
            const float d = s.activation_d[col + i % 2][group * kK / kActivationBlock];
            acc[t][i] +=
                d * (scale[i / 2] * static_cast<float>(c[i]) + offset[i / 2] * static_cast<float>(level_sum[i % 2]));
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
          acc[t][i] = add_tile(acc[t][i], s.activation_d[8 * t + 2 * thread_id + i % 2][0],
                               tile_inner(s.d[row], s.dmin[row], sums[t][i], mins[t][i]));
        }
    }
  }

  const auto store = [&](int t, int i, float value) {
    const int64_t row = first_row + rows[i / 2];
    const int64_t col = first_col + 8 * t + 2 * thread_id + i % 2;
    if (row < w.rows && col < n) store_output(w, row, col, accumulate, value);
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

constexpr int kOrderedThreads = 256;  // threads of a block of matvec_in_tile_order_kernel
constexpr int kOrderedInFlight = 4;   // slices a lane loads before it uses the first
// Activation rows up to which integer-scale products take matvec_in_tile_order_kernel rather than tiles: from 4 rows
// on the tiles were faster on an H200 (PERFORMANCE.md, ideas not kept).
constexpr int64_t kMaxOrderedRows = 2;

// Weight rows of a thread block of the matrix-vector pass: enough slices for kOrderedInFlight a lane.
int64_t ordered_rows_per_block(int64_t k_tiles, int slices) {
  return std::max<int64_t>(1, kOrderedThreads * kOrderedInFlight / (k_tiles * slices));
}

// The matrix-vector pass in the tile kernel's order (see the top of the file) over kCols activation rows (n of them)
// and weights of type T with integer scales, K split as k_split says. A thread block takes rows_per_block weight
// rows; its lanes first take the slices of their K tiles, consecutive lanes on consecutive slices of a row, and
// keep each tile's factor of each activation row in shared memory; then a thread for each (row, activation row)
// adds the terms up.
template <TensorType T, int kCols>
__global__ void __launch_bounds__(kOrderedThreads)
    matvec_in_tile_order_kernel(MatvecSegment w, int64_t cols, ProductInput x, int n, bool accumulate, int splits,
                                int tiles_per_split, int rows_per_block) {
  using D = Decoder<T>;
  constexpr int kSlices = D::kSlices;
  static_assert(kOrderedThreads % kSlices == 0, "a lane takes the same slice of every tile it visits");
  extern __shared__ float inner[];  // [row of the block][tile][activation row]
  start_successor();
  const int tiles = static_cast<int>(cols / kTileK);
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int block_rows = static_cast<int>(min(static_cast<int64_t>(rows_per_block), w.rows - first_row));
  const int items = block_rows * tiles * kSlices;  // (row, tile, slice), slice fastest
  const int slice = static_cast<int>(threadIdx.x) % kSlices;
  const unsigned team_mask = ((1u << kSlices) - 1) << (static_cast<int>(threadIdx.x) % kWarpSize / kSlices * kSlices);

  bool waited = false;
  for (int base = static_cast<int>(threadIdx.x); base < items; base += kOrderedThreads * kOrderedInFlight) {
    // Items past the end load the block's last one of this slice again (from cache), unused: without a branch the
    // loads all issue before the first is used.
    typename D::Slice slices[kOrderedInFlight];
#pragma unroll
    for (int u = 0; u < kOrderedInFlight; ++u) {
      const int unit = min(base + u * kOrderedThreads, items - kSlices + slice) / kSlices;
      slices[u] = D::load(w.weight, first_row * tiles + unit, slice);
    }
    if (!waited) {
      wait_for_predecessor();  // the activations (and y) are written by earlier kernels
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < kOrderedInFlight; ++u) {
      const int item = base + u * kOrderedThreads;
      if (item >= items) break;  // alike in a team's lanes, which share the tile
      const int unit = item / kSlices;
      const int64_t element = static_cast<int64_t>(unit % tiles) * kTileK;
#pragma unroll
      for (int b = 0; b < kCols; ++b) {
        if (b >= n) break;
        const int64_t first = b * cols + element;
        decode::ScaledSums sums = decode::scaled_sums(slices[u], x.q + first, x.scales + first / kActivationBlock,
                                                      [&](int g) { return D::group_start(slice, g); });
#pragma unroll
        for (int m = 1; m < kSlices; m *= 2) {
          sums.sum += __shfl_xor_sync(team_mask, sums.sum, m);
          sums.offset += __shfl_xor_sync(team_mask, sums.offset, m);
        }
        if (slice == 0) inner[unit * kCols + b] = tile_inner(slices[u].d, slices[u].dmin, sums.sum, sums.offset);
      }
    }
  }
  if (!waited) wait_for_predecessor();
  __syncthreads();

  for (int i = static_cast<int>(threadIdx.x); i < block_rows * n; i += kOrderedThreads) {
    const int r = i / n;
    const int b = i % n;
    const float* row_inner = inner + r * tiles * kCols + b;
    const ActivationScale* xs = x.scales + b * cols / kActivationBlock;
    float total = 0.0f;
    for (int split = 0; split < splits; ++split) {
      float acc = 0.0f;
      for (int tile = split * tiles_per_split; tile < min(tiles, (split + 1) * tiles_per_split); ++tile)
        acc = add_tile(acc, xs[tile * (kTileK / kActivationBlock)].d, row_inner[tile * kCols]);
      total = splits == 1 ? acc : total + acc;  // as the tile kernel stores a lone split, or adds the parts
    }
    store_output(w, first_row + r, b, accumulate, total);
  }
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
  if (!x.q || !x.scales) fail_with("matmul_q8: the activations have no 8-bit form");
  with_decoder(type, [&]<TensorType T>() {
    if constexpr (kTiled<T>) {
      const int64_t row_tiles = (segment.rows + kTileRows - 1) / kTileRows;
      const int64_t k_tiles = (cols + kTileK - 1) / kTileK;
      const KSplit split = k_split(segment.rows, k_tiles);
      const int64_t splits = split.splits;
      if constexpr (Tiling<T>::kIntegerScales) {
        if (n <= kMaxOrderedRows) {
          const int64_t rows_per_block = ordered_rows_per_block(k_tiles, Decoder<T>::kSlices);
          const auto ordered = [&]<int kCols>() {
            launch_overlapped("matvec_in_tile_order", matvec_in_tile_order_kernel<T, kCols>,
                              dim3(static_cast<unsigned>((segment.rows + rows_per_block - 1) / rows_per_block)),
                              dim3(kOrderedThreads), rows_per_block * k_tiles * kCols * sizeof(float), stream, segment,
                              cols, x, static_cast<int>(n), accumulate, static_cast<int>(splits),
                              static_cast<int>(split.tiles_per_split), static_cast<int>(rows_per_block));
          };
          if (n == 1)
            ordered.template operator()<1>();
          else
            ordered.template operator()<kMaxOrderedRows>();
          return;
        }
      }
      // Activation rows a thread block takes: n rounded up to 8, 16 or 32 where it is that small, else kMaxTileCols.
      const auto launch = [&]<int kColTiles>() {
        constexpr int kCols = 8 * kColTiles;
        const auto launch_columns = [&](int64_t first, int64_t count, unsigned col_tiles) {
          ProductInput columns = x;
          columns.q += first * cols;
          columns.scales += first * cols / kActivationBlock;
          MatvecSegment out = segment;
          out.y += first * segment.rows;
          launch_overlapped("matmul_q8", matmul_q8_kernel<T, kColTiles>,
                            dim3(static_cast<unsigned>(row_tiles), col_tiles, static_cast<unsigned>(splits)),
                            dim3(kThreads), 0, stream, out, cols, columns, count, accumulate, static_cast<int>(splits),
                            static_cast<int>(split.tiles_per_split), scratch.parts.as<float>(),
                            scratch.arrivals.as<unsigned>());
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
