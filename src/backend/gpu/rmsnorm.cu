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

// What a thread block's one reduction gathers: the row's sum of squares, and the extremes of its own values
// before the scale, which a Q8_K output takes (see below).
struct NormTotals {
  double squares;
  float2 extremes;
};
__device__ __forceinline__ NormTotals shuffle_xor(const NormTotals& totals, int mask, int width) {
  return {rf::gpu::shuffle_xor(totals.squares, mask, width), rf::gpu::shuffle_xor(totals.extremes, mask, width)};
}

template <ActivationBlocks kBlocks>
__global__ void __launch_bounds__(kQuantizeThreads) rmsnorm_kernel(const float* x, const float* weight, int64_t cols,
                                                                   float eps, ActivationOutput out) {
  start_successor();
  // The norm's weight does not depend on earlier kernels: its load is under way while they finish.
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kQuantizeThreads + threadIdx.x;
  const float w = i < cols ? weight[i] : 0.0f;
  wait_for_predecessor();
  __shared__ NormTotals scratch[kQuantizeThreads / 32];
  const int64_t first = static_cast<int64_t>(blockIdx.y) * cols;
  const float* row = x + first;
  // The sum of squares: each thread's share in float, four values per load, the threads' sums in double (the CPU
  // sums in double throughout): widening every value to double was slower on an H200.
  float thread_squares = 0.0f;
#pragma unroll 4
  for (int64_t i = 4 * threadIdx.x; i < cols; i += 4 * kQuantizeThreads) {
    const float4 v = *reinterpret_cast<const float4*>(row + i);
    thread_squares += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  const float own = i < cols ? row[i] : 0.0f;
  // A Q8_K block is this thread block's values, and scaling them all by the same positive factor keeps the
  // largest the largest: the extremes come from x * weight in the one reduction that sums the squares, rather
  // than from a second one once the scale is known (the CPU scales first and takes the extremes after; where the
  // two orders round differently, d differs in its last bit). One reduction is faster than two: each is a chain
  // of dependent steps that the products after the norm wait for.
  const float weighted = own * w;
  const NormTotals totals = block_reduce(NormTotals{thread_squares, make_float2(weighted, -weighted)}, scratch,
                                         [](const NormTotals& a, const NormTotals& b) {
                                           return NormTotals{a.squares + b.squares,
                                                             make_float2(fmaxf(a.extremes.x, b.extremes.x),
                                                                         fmaxf(a.extremes.y, b.extremes.y))};
                                         });
  const float scale = rms_scale(totals.squares, cols, eps);
  const float value = i < cols ? own * scale * w : 0.0f;
  if (i < cols) out.f32[first + i] = value;
  if constexpr (kBlocks == ActivationBlocks::Q8_K) {
    quantize_q8_k_element(value, make_float2(totals.extremes.x * scale, totals.extremes.y * scale), first + i, out.q,
                          out.scales, out.f16);
  } else {
    __shared__ float2 pairs[kQuantizeThreads / 32];
    const bool active = i - threadIdx.x % kTeam < cols;  // whole teams: quantized rows are whole blocks
    quantize_element<kBlocks>(value, first + i, active, out.q, out.scales, out.f16, pairs);
  }
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
