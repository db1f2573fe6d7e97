// The 8-bit activation forms (kernels.h: ActivationBlocks) computed inside a thread block of
// kQuantizeThreads threads, thread t holding element base + t of a chunk of kQuantizeThreads consecutive
// elements. Kernels that produce activations (RMSNorm, SwiGLU) quantize what they have just computed, so the
// products that follow find their input ready without another launch.
#pragma once
#include <cstdint>

#include "backend/gpu/device.cuh"
#include "backend/gpu/kernels.h"

namespace rf::gpu {

// A Q8_K block's values, so that a block's scale is one reduction over the thread block: the format fixes it, not a
// tuning (tuning.h).
constexpr int kQuantizeThreads = 256;

// Writes the level of element i (lane l of its team holds value l of a 32-value block) under scale d, the
// sums of each half of the block, and, when asked, the value the level stands for as f16.
__device__ __forceinline__ void store_level(int64_t i, int level, float d, int8_t* q, ActivationScale* scales,
                                            uint16_t* f16) {
  const int lane = static_cast<int>(threadIdx.x % kTeam);
  q[i] = static_cast<int8_t>(level);
  if (f16) f16[i] = float_to_half(d * static_cast<float>(level));
  const int low = team_sum(lane < 16 ? level : 0);
  const int high = team_sum(lane < 16 ? 0 : level);
  if (lane == 0) scales[i / kActivationBlock] = {d, {static_cast<int16_t>(low), static_cast<int16_t>(high)}};
}

// Element i of a Q8_K block whose largest value and largest negated value are `extremes`:
// quant::quantize_q8_k_unchecked. The value of largest magnitude in 256 maps to -127; levels round half to even
// and stop at 127. Where both signs reach that magnitude exactly, this takes the positive value and the CPU the
// first: finding the first (a second reduction in that case, or one reduction of 64-bit keys) cost the 1B's
// decoding 2-3% on an H200 for a case that real activations do not meet.
__device__ __forceinline__ void quantize_q8_k_element(float value, float2 extremes, int64_t i, int8_t* q,
                                                      ActivationScale* scales, uint16_t* f16) {
  const float largest = extremes.x;
  const float smallest = -extremes.y;
  const float extreme = largest >= -smallest ? largest : smallest;
  const float inverse = extreme != 0.0f ? -127.0f / extreme : 0.0f;
  const float d = extreme != 0.0f ? 1.0f / inverse : 0.0f;
  store_level(i, min(127, __float2int_rn(inverse * value)), d, q, scales, f16);
}

// Quantizes `value`, element i. Every thread of the block calls this for the same chunk (Q8_K reduces over
// the whole block); for Q8_0, teams whose 32 elements lie past the end pass active = false and skip.
// `scratch` holds kQuantizeThreads / 32 pairs.
template <ActivationBlocks kBlocks>
__device__ __forceinline__ void quantize_element(float value, int64_t i, bool active, int8_t* q,
                                                 ActivationScale* scales, uint16_t* f16, float2* scratch) {
  if constexpr (kBlocks == ActivationBlocks::Q8_0) {
    // quant::quantize_q8_0: d = max |x| / 127 stored as f16; levels round half away from zero against the
    // unrounded d.
    if (!active) return;
    const float d = team_max(fabsf(value)) / 127.0f;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    store_level(i, static_cast<int>(roundf(value * inverse)), half_to_float(float_to_half(d)), q, scales, f16);
  } else if constexpr (kBlocks == ActivationBlocks::Q8_K) {
    quantize_q8_k_element(value, block_extremes(value, scratch), i, q, scales, f16);
  }
}

// Calls fn.template operator()<kBlocks>() with the activation form as a compile-time constant.
template <typename Fn>
void with_activation_blocks(ActivationBlocks blocks, Fn&& fn) {
  switch (blocks) {
    case ActivationBlocks::None: fn.template operator()<ActivationBlocks::None>(); break;
    case ActivationBlocks::Q8_0: fn.template operator()<ActivationBlocks::Q8_0>(); break;
    case ActivationBlocks::Q8_K: fn.template operator()<ActivationBlocks::Q8_K>(); break;
  }
}

}  // namespace rf::gpu
