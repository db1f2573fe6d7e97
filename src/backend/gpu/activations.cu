// Element-wise work on activations: the feed-forward activation (SwiGLU, GeGLU or GELU, quantizing its output for
// the down projection in the same pass), and the 8-bit and f16 forms that products read.
#include "backend/gpu/device.cuh"
#include "backend/gpu/kernels.h"
#include "backend/gpu/quantize.cuh"

namespace rf::gpu {
namespace {

constexpr int kThreads = kQuantizeThreads;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// One thread per value; a thread block covers kThreads consecutive values (a Q8_K block, eight Q8_0 blocks).
template <ActivationBlocks kBlocks>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const float* x, int64_t n, int8_t* q,
                                                            ActivationScale* scales, uint16_t* f16) {
  start_successor();
  wait_for_predecessor();
  __shared__ float2 scratch[kThreads / 32];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const bool active = i - threadIdx.x % kTeam < n;  // n is a multiple of the block size
  quantize_element<kBlocks>(i < n ? x[i] : 0.0f, i, active, q, scales, f16, scratch);
}

__global__ void __launch_bounds__(kThreads) f16_kernel(const float* x, int64_t n, uint16_t* out) {
  start_successor();
  wait_for_predecessor();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) out[i] = float_to_half(x[i]);
}

// GELU's tanh form, as llama.cpp computes it.
__device__ __forceinline__ float gelu(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x)));
}

template <ActivationBlocks kBlocks, Activation kActivation>
__global__ void __launch_bounds__(kThreads) activation_kernel(const float* gate, const float* up, int64_t n,
                                                              ActivationOutput out) {
  start_successor();
  wait_for_predecessor();
  __shared__ float2 scratch[kThreads / 32];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const bool active = i - threadIdx.x % kTeam < n;
  float value = 0.0f;
  if (i < n) {
    const float g = gate[i];
    if constexpr (kActivation == Activation::Silu)
      value = silu_times(g, up ? up[i] : 1.0f);
    else
      value = gelu(g) * (up ? up[i] : 1.0f);
    out.f32[i] = value;
  }
  quantize_element<kBlocks>(value, i, active, out.q, out.scales, out.f16, scratch);
}

}  // namespace

ActivationBlocks activation_blocks(TensorType weight_type) {
  switch (weight_type) {
    case TensorType::F32:
    case TensorType::F16:
    case TensorType::BF16:
      return ActivationBlocks::None;
    case TensorType::Q2_K:
    case TensorType::Q3_K:
    case TensorType::Q4_K:
    case TensorType::Q5_K:
    case TensorType::Q6_K:
    case TensorType::IQ4_XS:
      return ActivationBlocks::Q8_K;
    default:
      return ActivationBlocks::Q8_0;
  }
}

void quantize_rows(ActivationBlocks blocks, const float* x, int64_t rows, int64_t cols, int8_t* q,
                   ActivationScale* scales, uint16_t* f16, gpuStream_t stream) {
  const int64_t n = rows * cols;
  with_activation_blocks(blocks, [&]<ActivationBlocks kBlocks>() {
    launch_overlapped("quantize_rows", quantize_kernel<kBlocks>, blocks_for(n), kThreads, 0, stream, x, n, q, scales,
                      f16);
  });
}

void convert_to_f16(const float* x, int64_t n, uint16_t* out, gpuStream_t stream) {
  launch_overlapped("convert_to_f16", f16_kernel, blocks_for(n), kThreads, 0, stream, x, n, out);
}

void activate(Activation activation, const float* gate, const float* up, int64_t rows, int64_t cols,
              const ActivationOutput& out, gpuStream_t stream) {
  const int64_t n = rows * cols;
  with_activation_blocks(out.blocks, [&]<ActivationBlocks kBlocks>() {
    if (activation == Activation::Silu)
      launch_overlapped("activate", activation_kernel<kBlocks, Activation::Silu>, blocks_for(n), kThreads, 0, stream,
                        gate, up, n, out);
    else
      launch_overlapped("activate", activation_kernel<kBlocks, Activation::Gelu>, blocks_for(n), kThreads, 0, stream,
                        gate, up, n, out);
  });
}

}  // namespace rf::gpu
