// Weights turned into plain numbers, through the same block decoders as the products: a tile of a matrix
// as f16 for a tensor-core GEMM (prompt processing), and the rows of the embedding table that a batch of
// tokens selects, as f32. Also the one-time repacking of split types at upload (weight_layout.h).
#include "backend/gpu/block_decoders.cuh"
#include "backend/gpu/device.cuh"
#include "backend/gpu/kernels.h"

namespace rf::gpu {
namespace {

constexpr int kThreads = 256;

// Stores n consecutive values (n a multiple of 4) computed by value(i) with 16-byte stores (8-byte ones for
// four halves): `out` is aligned to n values.
template <typename Out, int N, typename Value>
__device__ __forceinline__ void store_run(Out* out, Value value) {
  if constexpr (sizeof(Out) == 2) {
#pragma unroll
    for (int i = 0; i < N; i += 8) {
      if (i + 8 <= N) {
        uint32_t words[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
          words[k] = float_to_half(value(i + 2 * k)) | (static_cast<uint32_t>(float_to_half(value(i + 2 * k + 1))) << 16);
        *reinterpret_cast<int4*>(out + i) = make_int4(static_cast<int>(words[0]), static_cast<int>(words[1]),
                                                      static_cast<int>(words[2]), static_cast<int>(words[3]));
      } else {
        const uint32_t low = float_to_half(value(i)) | (static_cast<uint32_t>(float_to_half(value(i + 1))) << 16);
        const uint32_t high = float_to_half(value(i + 2)) | (static_cast<uint32_t>(float_to_half(value(i + 3))) << 16);
        *reinterpret_cast<int2*>(out + i) = make_int2(static_cast<int>(low), static_cast<int>(high));
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; i += 4)
      *reinterpret_cast<float4*>(out + i) = make_float4(value(i), value(i + 1), value(i + 2), value(i + 3));
  }
}

template <typename D, int G, int I, typename Out>
__device__ __forceinline__ void store_values(const QuantSlice<G, I>& s, int slice, Out* block_out) {
#pragma unroll
  for (int g = 0; g < G; ++g)
    store_run<Out, 4 * I>(block_out + D::group_start(slice, g), [&](int i) {
      const auto q = static_cast<int8_t>(s.q[g][i / 4] >> (8 * (i % 4)));
      return s.scale[g] * static_cast<float>(q) + s.offset[g];
    });
}

template <typename D, int G, int I, typename Out>
__device__ __forceinline__ void store_values(const ScaledLevelSlice<G, I>& s, int slice, Out* block_out) {
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const float scale = s.d * static_cast<float>(s.scale[g]);
    const float offset = s.dmin * static_cast<float>(s.min[g]);
    store_run<Out, 4 * I>(block_out + D::group_start(slice, g), [&](int i) {
      const auto q = static_cast<uint8_t>(s.q[g][i / 4] >> (8 * (i % 4)));
      return scale * static_cast<float>(q) - offset;
    });
  }
}

template <typename D, int N, typename Out>
__device__ __forceinline__ void store_values(const FloatSlice<N>& s, int, Out* block_out) {
  store_run<Out, N>(block_out, [&](int i) { return s.v[i]; });
}

// Row r of the output is weight row rows[r] when `row_ids` is given (tokens: step + 1), else first_row + r.
// One thread per slice, consecutive threads on consecutive slices. A thread block's slices cover consecutive
// output values (rows of whole blocks follow each other), so f16 tiles (the GEMMs' weights, the bulk of the
// bytes) are decoded into shared memory first and written out in 16-byte pieces that consecutive threads
// take in order: written straight from the slices, each store of a warp would touch 32 cache lines.
template <TensorType T, typename Out>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(WeightView weight, int64_t cols, const int32_t* row_ids,
                                                              int64_t first_row, int64_t n_rows, Out* out) {
  using D = Decoder<T>;
  constexpr int kSliceValues = D::kBlockElements / D::kSlices;
  constexpr bool kStaged = sizeof(Out) == 2;
  __shared__ int4 tile[kStaged ? kThreads * kSliceValues * sizeof(Out) / 16 : 1];
  start_successor();
  wait_for_predecessor();
  const int64_t blocks_per_row = cols / D::kBlockElements;
  const int64_t slices_per_row = blocks_per_row * D::kSlices;
  const int64_t slices = n_rows * slices_per_row;
  const auto first_index = static_cast<int64_t>(blockIdx.x) * kThreads;  // tiles stay below 2^32 slices
  const int64_t index = first_index + threadIdx.x;
  if (index < slices) {
    const int64_t r = index / slices_per_row;
    const int64_t s = index % slices_per_row;
    const int64_t weight_row = row_ids ? row_ids[r] : first_row + r;
    const int slice = static_cast<int>(s % D::kSlices);
    const auto loaded = D::load(weight, weight_row * blocks_per_row + s / D::kSlices, slice);
    // The value offset of the slice's block: in the tile, or in the output.
    const int64_t block_value = (index - slice) * kSliceValues;
    if constexpr (kStaged)
      store_values<D>(loaded, slice, reinterpret_cast<Out*>(tile) + (block_value - first_index * kSliceValues));
    else
      store_values<D>(loaded, slice, out + block_value);
  }
  if constexpr (kStaged) {
    __syncthreads();
    const int64_t values = (min(slices, first_index + kThreads) - first_index) * kSliceValues;
    Out* target = out + first_index * kSliceValues;
    const int64_t pieces = values * static_cast<int64_t>(sizeof(Out)) / 16;
    for (int64_t i = threadIdx.x; i < pieces; i += kThreads) reinterpret_cast<int4*>(target)[i] = tile[i];
    // A last tile of the 4-value float slices may end in the middle of a piece.
    for (int64_t i = pieces * 16 / static_cast<int64_t>(sizeof(Out)) + threadIdx.x; i < values; i += kThreads)
      target[i] = reinterpret_cast<const Out*>(tile)[i];
  }
}

template <typename Out>
void launch_dequantize(TensorType type, const WeightView& weight, int64_t cols, const int32_t* row_ids,
                       int64_t first_row, int64_t n_rows, Out* out, gpuStream_t stream) {
  with_decoder(type, [&]<TensorType T>() {
    const int64_t slices = n_rows * cols / Decoder<T>::kBlockElements * Decoder<T>::kSlices;
    const auto blocks = static_cast<unsigned>((slices + kThreads - 1) / kThreads);
    launch_overlapped("dequantize", dequantize_kernel<T, Out>, blocks, kThreads, 0, stream, weight, cols, row_ids,
                      first_row, n_rows, out);
  });
}

__global__ void split_scales_kernel(const uint8_t* raw, int64_t blocks, int block_bytes, int scale_offset,
                                    uint8_t* payloads, uint16_t* scales) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  // Blocks and payloads are 2-byte aligned; copy in halves.
  const auto* in = reinterpret_cast<const uint16_t*>(raw + b * block_bytes);
  auto* out = reinterpret_cast<uint16_t*>(payloads + b * (block_bytes - 2));
  const int scale_index = scale_offset / 2;
  for (int i = 0, o = 0; i < block_bytes / 2; ++i) {
    if (i == scale_index)
      scales[b] = in[i];
    else
      out[o++] = in[i];
  }
}

}  // namespace

void dequantize_to_f16(TensorType type, const WeightView& weight, int64_t cols, int64_t first_row, int64_t n_rows,
                       uint16_t* out, gpuStream_t stream) {
  launch_dequantize(type, weight, cols, nullptr, first_row, n_rows, out, stream);
}

void embed_tokens(TensorType type, const WeightView& table, int64_t cols, const int32_t* tokens, int64_t n_tokens,
                  float* out, gpuStream_t stream) {
  launch_dequantize(type, table, cols, tokens, 0, n_tokens, out, stream);
}

void split_block_scales(const uint8_t* raw, int64_t blocks, int block_bytes, int scale_offset, uint8_t* payloads,
                        uint16_t* scales, gpuStream_t stream) {
  const auto grid = static_cast<unsigned>((blocks + kThreads - 1) / kThreads);
  split_scales_kernel<<<grid, kThreads, 0, stream>>>(raw, blocks, block_bytes, scale_offset, payloads, scales);
  check_launch("split_block_scales");
}

}  // namespace rf::gpu
