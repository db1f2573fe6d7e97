// Portable dot-product kernels for every supported weight type: plain C++ over the shared block unpackers of
// quant/blocks.h. Integer sums per block (or sub-block), float scales applied once per block, as the SIMD
// kernels do, so both agree to float rounding.
#include "backend/cpu/vec_dot.h"
#include "quant/blocks.h"
#include "util/half.h"

namespace rf::cpu {
namespace {

using namespace rf::quant;

int dot_i8(const int8_t* w, const int8_t* a, int count) {
  int sum = 0;
  for (int i = 0; i < count; ++i) sum += w[i] * a[i];
  return sum;
}

int dot_u8(const uint8_t* w, const int8_t* a, int count) {
  int sum = 0;
  for (int i = 0; i < count; ++i) sum += w[i] * a[i];
  return sum;
}

int sum_i8(const int8_t* a, int count) {
  int sum = 0;
  for (int i = 0; i < count; ++i) sum += a[i];
  return sum;
}

// ---- float weights, f32 activations ------------------------------------------------------------------------

template <float (*to_f32)(uint16_t)>
float dot_half(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const uint16_t*>(w);
  const auto* x = static_cast<const float*>(a);
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += to_f32(weights[i]) * x[i];
  return sum;
}

float dot_f32(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const float*>(w);
  const auto* x = static_cast<const float*>(a);
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += weights[i] * x[i];
  return sum;
}

// ---- 32-element blocks, Q8_0 activations ----------------------------------------------------------------

// Weight blocks whose levels are zero-centred (x = d * level): the levels of block b as int8.
void levels_of(const BlockQ4_0& b, int8_t* levels) {
  uint8_t q[kBlock];
  unpack_nibbles(b.qs, q);
  for (int j = 0; j < kBlock; ++j) levels[j] = static_cast<int8_t>(q[j] - 8);
}
void levels_of(const BlockQ5_0& b, int8_t* levels) {
  uint8_t q[kBlock] = {};
  unpack_nibbles(b.qs, q);
  unpack_fifth_bits(b.qh, q);
  for (int j = 0; j < kBlock; ++j) levels[j] = static_cast<int8_t>(q[j] - 16);
}
void levels_of(const BlockQ8_0& b, int8_t* levels) {
  for (int j = 0; j < kBlock; ++j) levels[j] = b.qs[j];
}
void levels_of(const BlockIQ4_NL& b, int8_t* levels) {
  uint8_t q[kBlock];
  unpack_nibbles(b.qs, q);
  for (int j = 0; j < kBlock; ++j) levels[j] = kIQ4NLValues[q[j]];
}

template <typename Block>
float dot_symmetric(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const Block*>(w);
  const auto* acts = static_cast<const BlockQ8_0*>(a);
  float sum = 0;
  for (int64_t b = 0; b < n / kBlock; ++b) {
    int8_t levels[kBlock];
    levels_of(weights[b], levels);
    const float scale = fp16_to_fp32(weights[b].d) * fp16_to_fp32(acts[b].d);
    sum += scale * static_cast<float>(dot_i8(levels, acts[b].qs, kBlock));
  }
  return sum;
}

// Blocks with a minimum (x = d * level + m): levels 0..31 as uint8.
void levels_of(const BlockQ4_1& b, uint8_t* levels) { unpack_nibbles(b.qs, levels); }
void levels_of(const BlockQ5_1& b, uint8_t* levels) {
  unpack_nibbles(b.qs, levels);
  unpack_fifth_bits(b.qh, levels);
}

template <typename Block>
float dot_with_min(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const Block*>(w);
  const auto* acts = static_cast<const BlockQ8_0*>(a);
  float sum = 0;
  for (int64_t b = 0; b < n / kBlock; ++b) {
    uint8_t levels[kBlock];
    levels_of(weights[b], levels);
    const float da = fp16_to_fp32(acts[b].d);
    sum += fp16_to_fp32(weights[b].d) * da * static_cast<float>(dot_u8(levels, acts[b].qs, kBlock)) +
           fp16_to_fp32(weights[b].m) * da * static_cast<float>(sum_i8(acts[b].qs, kBlock));
  }
  return sum;
}

// ---- super-blocks, Q8_K activations ----------------------------------------------------------------------

float dot_q2_k(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const BlockQ2_K*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  float sum = 0;
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const BlockQ2_K& wb = weights[b];
    const BlockQ8_K& ab = acts[b];
    uint8_t levels[kSuperBlock];
    unpack_2bit(wb.qs, levels);
    int scaled = 0;
    int mins = 0;
    for (int s = 0; s < 16; ++s) {
      scaled += (wb.scales[s] & 0xF) * dot_u8(levels + 16 * s, ab.qs + 16 * s, 16);
      mins += (wb.scales[s] >> 4) * ab.bsums[s];
    }
    sum += ab.d * (fp16_to_fp32(wb.d) * static_cast<float>(scaled) - fp16_to_fp32(wb.dmin) * static_cast<float>(mins));
  }
  return sum;
}

float dot_q3_k(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const BlockQ3_K*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  float sum = 0;
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    int8_t levels[kSuperBlock];
    q3_k_levels(weights[b], levels);
    uint8_t scales[16];
    unpack_q3_k_scales(weights[b].scales, scales);
    int total = 0;
    for (int s = 0; s < 16; ++s) total += (scales[s] - 32) * dot_i8(levels + 16 * s, acts[b].qs + 16 * s, 16);
    sum += acts[b].d * fp16_to_fp32(weights[b].d) * static_cast<float>(total);
  }
  return sum;
}

// Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins.
template <typename Block, void (*levels_of_block)(const Block&, uint8_t*)>
float dot_scale_min(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const Block*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  float sum = 0;
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const Block& wb = weights[b];
    const BlockQ8_K& ab = acts[b];
    uint8_t levels[kSuperBlock];
    levels_of_block(wb, levels);
    int scaled = 0;
    int mins = 0;
    const KScalesMins sm = unpack_k_scales_mins(wb.scales);
    for (int j = 0; j < 8; ++j) {
      scaled += sm.scale(j) * dot_u8(levels + 32 * j, ab.qs + 32 * j, 32);
      mins += sm.min(j) * (ab.bsums[2 * j] + ab.bsums[2 * j + 1]);
    }
    sum += ab.d * (fp16_to_fp32(wb.d) * static_cast<float>(scaled) - fp16_to_fp32(wb.dmin) * static_cast<float>(mins));
  }
  return sum;
}

void q4_k_levels(const BlockQ4_K& block, uint8_t* levels) { unpack_k_nibbles(block.qs, levels); }

float dot_q6_k(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const BlockQ6_K*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  float sum = 0;
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    int8_t levels[kSuperBlock];
    q6_k_levels(weights[b], levels);
    int total = 0;
    for (int s = 0; s < 16; ++s) total += weights[b].scales[s] * dot_i8(levels + 16 * s, acts[b].qs + 16 * s, 16);
    sum += acts[b].d * fp16_to_fp32(weights[b].d) * static_cast<float>(total);
  }
  return sum;
}

float dot_iq4_xs(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const BlockIQ4_XS*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  float sum = 0;
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const BlockIQ4_XS& wb = weights[b];
    int total = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t q[kBlock];
      unpack_nibbles(wb.qs + 16 * j, q);
      int8_t levels[kBlock];
      for (int l = 0; l < kBlock; ++l) levels[l] = kIQ4NLValues[q[l]];
      total += (iq4_xs_scale(wb, j) - 32) * dot_i8(levels, acts[b].qs + 32 * j, kBlock);
    }
    sum += acts[b].d * fp16_to_fp32(wb.d) * static_cast<float>(total);
  }
  return sum;
}

struct KernelEntry {
  TensorType type;
  VecDotFn kernel;
};
constexpr KernelEntry kKernels[] = {
    {TensorType::F32, dot_f32},
    {TensorType::F16, dot_half<fp16_to_fp32>},
    {TensorType::BF16, dot_half<bf16_to_fp32>},
    {TensorType::Q4_0, dot_symmetric<BlockQ4_0>},
    {TensorType::Q4_1, dot_with_min<BlockQ4_1>},
    {TensorType::Q5_0, dot_symmetric<BlockQ5_0>},
    {TensorType::Q5_1, dot_with_min<BlockQ5_1>},
    {TensorType::Q8_0, dot_symmetric<BlockQ8_0>},
    {TensorType::IQ4_NL, dot_symmetric<BlockIQ4_NL>},
    {TensorType::Q2_K, dot_q2_k},
    {TensorType::Q3_K, dot_q3_k},
    {TensorType::Q4_K, dot_scale_min<BlockQ4_K, q4_k_levels>},
    {TensorType::Q5_K, dot_scale_min<BlockQ5_K, q5_k_levels>},
    {TensorType::Q6_K, dot_q6_k},
    {TensorType::IQ4_XS, dot_iq4_xs},
};

}  // namespace

VecDotFn portable_vec_dot_kernel(TensorType weight_type) {
  for (const KernelEntry& e : kKernels)
    if (e.type == weight_type) return e.kernel;
  return nullptr;
}

}  // namespace rf::cpu
