// RMSNorm. The residual add that precedes every norm is already done by the product that produced the
// block's output (it accumulates into the residual stream), so the norm reads the stream, writes the
// normalized row and, in the same pass, the 8-bit form that the next products read.
//
// A row is shared out in chunks of kQuantizeThreads values, one thread block per chunk, so that a single
// row (decoding) still spreads over many multiprocessors; every block sums the squares of the whole row
// itself (a few KiB from cache) rather than waiting for another launch.
#include "backend/gpu/device.cuh"
#include "backend/gpu/kernels.h"
#include "backend/gpu/quantize.cuh"

namespace rf::gpu {
namespace {

template <ActivationBlocks kBlocks>
__global__ void __launch_bounds__(kQuantizeThreads) rmsnorm_kernel(const float* x, const float* weight, int64_t cols,
                                                                   float eps, ActivationOutput out) {
  start_successor();
  // The norm's weight does not depend on earlier kernels: its load is under way while they finish.
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kQuantizeThreads + threadIdx.x;
  const float w = i < cols ? weight[i] : 0.0f;
  wait_for_predecessor();
  __shared__ float2 scratch[kQuantizeThreads / 32];
  __shared__ double sum_scratch[kQuantizeThreads / 32];
  const int64_t first = static_cast<int64_t>(blockIdx.y) * cols;
  const float* row = x + first;
  // The sum of squares in double, as the CPU backend sums it; four values per load.
  double squares = 0.0;
#pragma unroll 4
  for (int64_t i = 4 * threadIdx.x; i < cols; i += 4 * kQuantizeThreads) {
    const float4 v = *reinterpret_cast<const float4*>(row + i);
    squares += static_cast<double>(v.x) * v.x + static_cast<double>(v.y) * v.y + static_cast<double>(v.z) * v.z +
               static_cast<double>(v.w) * v.w;
  }
  const double total = block_sum(squares, sum_scratch);
  const float scale = 1.0f / sqrtf(static_cast<float>(total / static_cast<double>(cols)) + eps);
  const bool active = i - threadIdx.x % kTeam < cols;  // whole teams: quantized rows are whole blocks
  const float value = i < cols ? row[i] * scale * w : 0.0f;
  if (i < cols) out.f32[first + i] = value;
  quantize_element<kBlocks>(value, first + i, active, out.q, out.scales, out.f16, scratch);
}

}  // namespace

void rmsnorm(const float* x, const float* weight, int64_t rows, int64_t cols, float eps, const ActivationOutput& out,
             gpuStream_t stream) {
  const dim3 grid(static_cast<unsigned>((cols + kQuantizeThreads - 1) / kQuantizeThreads), static_cast<unsigned>(rows));
  with_activation_blocks(out.blocks, [&]<ActivationBlocks kBlocks>() {
    launch_overlapped("rmsnorm", rmsnorm_kernel<kBlocks>, grid, kQuantizeThreads, 0, stream, x, weight, cols, eps, out);
  });
}

}  // namespace rf::gpu
