// The 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (one scale, optionally a minimum, per block) and
// IQ4_NL (one scale, 16 non-uniform levels). Quantizers follow llama.cpp's reference quantizer without an
// importance matrix: absmax / min-max scaling for the Q types, a weighted scale search for IQ4_NL.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/kernels.h"
#include "quant/scale_search.h"
#include "util/half.h"

namespace rf::quant {
namespace {

// Inverse of unpack_fifth_bits.
void pack_fifth_bits(const uint8_t* levels, uint8_t* qh_bytes) {
  uint32_t qh = 0;
  for (int j = 0; j < kBlock; ++j) qh |= static_cast<uint32_t>((levels[j] >> 4) & 1) << j;
  std::memcpy(qh_bytes, &qh, sizeof(qh));
}

// std::round (halves away from zero) inlined rather than a libm call per element: Q8_0 also quantizes the
// activations of every matrix product. v - trunc(v) is exact, so ties go exactly as std::round's.
float round_half_away(float v) {
  const float truncated = std::trunc(v);
  const float step = std::fabs(v - truncated) >= 0.5f ? 1.0f : 0.0f;
  return truncated + std::copysign(step, v);
}

// Q4_0 / Q5_0: the element of largest magnitude becomes level 0, i.e. -nmax after the bias, so that the sign
// of d spends the one extra negative level on it. Levels 0..2 nmax - 1, x = d * (level - nmax).
float quantize_absmax_block(const float* x, int nmax, uint8_t* levels) {
  float amax = 0;
  float max = 0;
  for (int j = 0; j < kBlock; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / static_cast<float>(-nmax);
  const float id = d != 0 ? 1 / d : 0;
  for (int j = 0; j < kBlock; ++j) {
    // Truncation of a value >= 0.5 is round-half-up, as the reference quantizer does it.
    const int level = static_cast<int>(x[j] * id + (static_cast<float>(nmax) + 0.5f));
    levels[j] = static_cast<uint8_t>(std::min(2 * nmax - 1, level));
  }
  return d;
}

// Q4_1 / Q5_1: levels 0..nmax spread from the block's minimum to its maximum, x = d * level + min.
float quantize_minmax_block(const float* x, int nmax, uint8_t* levels, float* min_out) {
  float min = x[0];
  float max = x[0];
  for (int j = 1; j < kBlock; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / static_cast<float>(nmax);
  const float id = d != 0 ? 1 / d : 0;
  for (int j = 0; j < kBlock; ++j) {
    const int level = static_cast<int>((x[j] - min) * id + 0.5f);
    levels[j] = static_cast<uint8_t>(std::min(nmax, level));
  }
  *min_out = min;
  return d;
}

}  // namespace

void dequantize_q4_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_0*>(src);
  for (int64_t b = 0; b < n / kBlock; ++b, dst += kBlock) {
    const float d = fp16_to_fp32(blocks[b].d);
    uint8_t q[kBlock];
    unpack_nibbles(blocks[b].qs, q);
    for (int j = 0; j < kBlock; ++j) dst[j] = d * static_cast<float>(q[j] - 8);
  }
}

void dequantize_q4_1(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_1*>(src);
  for (int64_t b = 0; b < n / kBlock; ++b, dst += kBlock) {
    const float d = fp16_to_fp32(blocks[b].d);
    const float m = fp16_to_fp32(blocks[b].m);
    uint8_t q[kBlock];
    unpack_nibbles(blocks[b].qs, q);
    for (int j = 0; j < kBlock; ++j) dst[j] = d * static_cast<float>(q[j]) + m;
  }
}

void dequantize_q5_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_0*>(src);
  for (int64_t b = 0; b < n / kBlock; ++b, dst += kBlock) {
    const float d = fp16_to_fp32(blocks[b].d);
    uint8_t q[kBlock];
    unpack_nibbles(blocks[b].qs, q);
    unpack_fifth_bits(blocks[b].qh, q);
    for (int j = 0; j < kBlock; ++j) dst[j] = d * static_cast<float>(q[j] - 16);
  }
}

void dequantize_q5_1(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_1*>(src);
  for (int64_t b = 0; b < n / kBlock; ++b, dst += kBlock) {
    const float d = fp16_to_fp32(blocks[b].d);
    const float m = fp16_to_fp32(blocks[b].m);
    uint8_t q[kBlock];
    unpack_nibbles(blocks[b].qs, q);
    unpack_fifth_bits(blocks[b].qh, q);
    for (int j = 0; j < kBlock; ++j) dst[j] = d * static_cast<float>(q[j]) + m;
  }
}

void dequantize_q8_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / kBlock; ++b, dst += kBlock) {
    const float d = fp16_to_fp32(blocks[b].d);
    for (int j = 0; j < kBlock; ++j) dst[j] = d * static_cast<float>(blocks[b].qs[j]);
  }
}

void dequantize_iq4_nl(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ4_NL*>(src);
  for (int64_t b = 0; b < n / kBlock; ++b, dst += kBlock) {
    const float d = fp16_to_fp32(blocks[b].d);
    uint8_t q[kBlock];
    unpack_nibbles(blocks[b].qs, q);
    for (int j = 0; j < kBlock; ++j) dst[j] = d * static_cast<float>(kIQ4NLValues[q[j]]);
  }
}

void quantize_q4_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_0*>(dst);
  for (int64_t b = 0; b < n / kBlock; ++b, src += kBlock) {
    uint8_t levels[kBlock];
    blocks[b].d = fp32_to_fp16(quantize_absmax_block(src, 8, levels));
    pack_nibbles(levels, blocks[b].qs);
  }
}

void quantize_q4_1(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_1*>(dst);
  for (int64_t b = 0; b < n / kBlock; ++b, src += kBlock) {
    uint8_t levels[kBlock];
    float min;
    blocks[b].d = fp32_to_fp16(quantize_minmax_block(src, 15, levels, &min));
    blocks[b].m = fp32_to_fp16(min);
    pack_nibbles(levels, blocks[b].qs);
  }
}

void quantize_q5_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ5_0*>(dst);
  for (int64_t b = 0; b < n / kBlock; ++b, src += kBlock) {
    uint8_t levels[kBlock];
    blocks[b].d = fp32_to_fp16(quantize_absmax_block(src, 16, levels));
    pack_nibbles(levels, blocks[b].qs);
    pack_fifth_bits(levels, blocks[b].qh);
  }
}

void quantize_q5_1(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ5_1*>(dst);
  for (int64_t b = 0; b < n / kBlock; ++b, src += kBlock) {
    uint8_t levels[kBlock];
    float min;
    blocks[b].d = fp32_to_fp16(quantize_minmax_block(src, 31, levels, &min));
    blocks[b].m = fp32_to_fp16(min);
    pack_nibbles(levels, blocks[b].qs);
    pack_fifth_bits(levels, blocks[b].qh);
  }
}

void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / kBlock; ++b, src += kBlock) {
    float amax = 0;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float d = amax / 127;
    const float id = d != 0 ? 1 / d : 0;
    blocks[b].d = fp32_to_fp16(d);
    for (int j = 0; j < kBlock; ++j) blocks[b].qs[j] = static_cast<int8_t>(round_half_away(src[j] * id));
  }
}

void quantize_iq4_nl(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockIQ4_NL*>(dst);
  for (int64_t b = 0; b < n / kBlock; ++b, src += kBlock) {
    const float d = iq4_block_scale(src);
    blocks[b].d = fp32_to_fp16(d);
    const float id = d != 0 ? 1 / d : 0;
    uint8_t levels[kBlock];
    for (int j = 0; j < kBlock; ++j) levels[j] = static_cast<uint8_t>(nearest_iq4_index(id * src[j]));
    pack_nibbles(levels, blocks[b].qs);
  }
}

}  // namespace rf::quant
