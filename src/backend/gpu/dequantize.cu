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
// One thread per slice, consecutive threads on consecutive slices.
template <TensorType T, typename Out>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(WeightView weight, int64_t cols, const int32_t* row_ids,
                                                              int64_t first_row, int64_t n_rows, Out* out) {
  using D = Decoder<T>;
  start_successor();
  wait_for_predecessor();
  const int64_t blocks_per_row = cols / D::kBlockElements;
  const int64_t slices_per_row = blocks_per_row * D::kSlices;
  const auto index = static_cast<uint32_t>(blockIdx.x * kThreads + threadIdx.x);  // tiles stay below 2^32 slices
  if (index >= n_rows * slices_per_row) return;
  const auto r = static_cast<int64_t>(index / static_cast<uint32_t>(slices_per_row));
  const auto s = static_cast<int64_t>(index % static_cast<uint32_t>(slices_per_row));
  const int64_t weight_row = row_ids ? row_ids[r] : first_row + r;
  const int slice = static_cast<int>(s % D::kSlices);
  const auto loaded = D::load(weight, weight_row * blocks_per_row + s / D::kSlices, slice);
  store_values<D>(loaded, slice, out + r * cols + s / D::kSlices * D::kBlockElements);
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

void embed_tokens(TensorType type, const WeightView& table, int64_t cols, const int32_t* step, int64_t n_tokens,
                  float* out, gpuStream_t stream) {
  launch_dequantize(type, table, cols, step + 1, 0, n_tokens, out, stream);
}

void split_block_scales(const uint8_t* raw, int64_t blocks, int block_bytes, int scale_offset, uint8_t* payloads,
                        uint16_t* scales, gpuStream_t stream) {
  const auto grid = static_cast<unsigned>((blocks + kThreads - 1) / kThreads);
  split_scales_kernel<<<grid, kThreads, 0, stream>>>(raw, blocks, block_bytes, scale_offset, payloads, scales);
  check_launch("split_block_scales");
}

}  // namespace rf::gpu
