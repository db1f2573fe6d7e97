// The 256-element super-block types: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS. Each super-block has one or
// two fp16 scales and small per-sub-block scales quantized against them. Quantizers follow llama.cpp's
// reference quantizer without an importance matrix: a scale search per sub-block, the sub-block scales
// quantized to 4, 6 or 8 bits, then every element requantized with the scale it will really be read with.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/kernels.h"
#include "quant/scale_search.h"
#include "util/half.h"

namespace rf::quant {
namespace {

// Inverse of unpack_2bit.
void pack_2bit(const uint8_t* levels, uint8_t* qs) {
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t* e = levels + 128 * h + l;
      qs[32 * h + l] = static_cast<uint8_t>(e[0] | (e[32] << 2) | (e[64] << 4) | (e[96] << 6));
    }
  }
}

// Inverse of unpack_k_nibbles.
void pack_k_nibbles(const uint8_t* levels, uint8_t* qs) {
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l)
      qs[32 * p + l] = static_cast<uint8_t>((levels[64 * p + l] & 0xF) | ((levels[64 * p + 32 + l] & 0xF) << 4));
}

// Q4_K / Q5_K: x = d * scale * level - dmin * min per sub-block of 32.
void dequantize_scale_min(float d, float dmin, const uint8_t* packed_scales, const uint8_t* levels, float* dst) {
  const KScalesMins sm = unpack_k_scales_mins(packed_scales);
  for (int j = 0; j < 8; ++j) {
    const float scale = d * sm.scale(j);
    const float min = dmin * sm.min(j);
    for (int l = 0; l < 32; ++l) dst[32 * j + l] = scale * levels[32 * j + l] - min;
  }
}

// Q4_K / Q5_K: levels 0..nmax per sub-block of 32, x ~ d * scale * level - dmin * min, scales and mins
// quantized to 6 bits against the super-block's largest. Fills d, dmin and the 12 packed scale bytes.
struct ScaleMinBlock {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
};
void quantize_scale_min(const float* x, int nmax, float rmin, int nstep, ScaleMinBlock* out, uint8_t* levels) {
  float scales[8];
  float mins[8];
  float max_scale = 0;
  float max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    // Weigh each element by its magnitude plus the sub-block's rms: large values matter more, small ones
    // still count.
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float rms = std::sqrt(sum_x2 / 32);
    float weights[32];
    for (int l = 0; l < 32; ++l) weights[l] = rms + std::fabs(xs[l]);
    scales[j] = make_qkx2_quants(32, nmax, xs, weights, levels + 32 * j, &mins[j], rmin, 0.1f, nstep, false);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }

  const float inv_scale = max_scale > 0 ? 63 / max_scale : 0;
  const float inv_min = max_min > 0 ? 63 / max_min : 0;
  std::memset(out->scales, 0, sizeof(out->scales));
  for (int j = 0; j < 8; ++j) {
    const auto ls = static_cast<uint8_t>(std::clamp(nearest_int(inv_scale * scales[j]), 0, 63));
    const auto lm = static_cast<uint8_t>(std::clamp(nearest_int(inv_min * mins[j]), 0, 63));
    // The packing unpack_k_scales_mins reads back.
    if (j < 4) {
      out->scales[j] = ls;
      out->scales[j + 4] = lm;
    } else {
      out->scales[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      out->scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      out->scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  out->d = fp32_to_fp16(max_scale / 63);
  out->dmin = fp32_to_fp16(max_min / 63);

  const float d = fp16_to_fp32(out->d);
  const float dmin = fp16_to_fp32(out->dmin);
  const KScalesMins sm = unpack_k_scales_mins(out->scales);
  for (int j = 0; j < 8; ++j) {
    const float scale = d * sm.scale(j);
    if (scale == 0) continue;
    const float min = dmin * sm.min(j);
    for (int l = 0; l < 32; ++l)
      levels[32 * j + l] = static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + l] + min) / scale), 0, nmax));
  }
}

// The sub-block scale with the largest magnitude, keeping its sign.
float signed_max_scale(const float* scales, int count) {
  float max = 0;
  for (int j = 0; j < count; ++j)
    if (std::fabs(scales[j]) > std::fabs(max)) max = scales[j];
  return max;
}

}  // namespace

void dequantize_q2_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ2_K*>(src);
  for (int64_t b = 0; b < n / kSuperBlock; ++b, dst += kSuperBlock) {
    const BlockQ2_K& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    const float dmin = fp16_to_fp32(block.dmin);
    uint8_t levels[kSuperBlock];
    unpack_2bit(block.qs, levels);
    for (int s = 0; s < 16; ++s) {
      const float scale = d * (block.scales[s] & 0xF);
      const float min = dmin * (block.scales[s] >> 4);
      for (int l = 0; l < 16; ++l) dst[16 * s + l] = scale * levels[16 * s + l] - min;
    }
  }
}

void dequantize_q3_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ3_K*>(src);
  for (int64_t b = 0; b < n / kSuperBlock; ++b, dst += kSuperBlock) {
    const BlockQ3_K& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    uint8_t scales[16];
    unpack_q3_k_scales(block.scales, scales);
    int8_t levels[kSuperBlock];
    q3_k_levels(block, levels);
    for (int s = 0; s < 16; ++s) {
      const float scale = d * static_cast<float>(scales[s] - 32);
      for (int l = 0; l < 16; ++l) dst[16 * s + l] = scale * levels[16 * s + l];
    }
  }
}

void dequantize_q4_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_K*>(src);
  for (int64_t b = 0; b < n / kSuperBlock; ++b, dst += kSuperBlock) {
    uint8_t levels[kSuperBlock];
    unpack_k_nibbles(blocks[b].qs, levels);
    dequantize_scale_min(fp16_to_fp32(blocks[b].d), fp16_to_fp32(blocks[b].dmin), blocks[b].scales, levels, dst);
  }
}

void dequantize_q5_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_K*>(src);
  for (int64_t b = 0; b < n / kSuperBlock; ++b, dst += kSuperBlock) {
    const BlockQ5_K& block = blocks[b];
    uint8_t levels[kSuperBlock];
    q5_k_levels(block, levels);
    dequantize_scale_min(fp16_to_fp32(block.d), fp16_to_fp32(block.dmin), block.scales, levels, dst);
  }
}

void dequantize_q6_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6_K*>(src);
  for (int64_t b = 0; b < n / kSuperBlock; ++b, dst += kSuperBlock) {
    const BlockQ6_K& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    int8_t levels[kSuperBlock];
    q6_k_levels(block, levels);
    for (int s = 0; s < 16; ++s) {
      const float scale = d * block.scales[s];
      for (int l = 0; l < 16; ++l) dst[16 * s + l] = scale * levels[16 * s + l];
    }
  }
}

void dequantize_iq4_xs(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ4_XS*>(src);
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const BlockIQ4_XS& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    for (int j = 0; j < 8; ++j, dst += kBlock) {
      const float scale = d * static_cast<float>(iq4_xs_scale(block, j) - 32);
      uint8_t levels[kBlock];
      unpack_nibbles(block.qs + 16 * j, levels);
      for (int l = 0; l < kBlock; ++l) dst[l] = scale * kIQ4NLValues[levels[l]];
    }
  }
}

void quantize_q2_k(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ2_K*>(dst);
  for (int64_t b = 0; b < n / kSuperBlock; ++b, src += kSuperBlock) {
    BlockQ2_K& block = blocks[b];
    uint8_t levels[kSuperBlock];
    float scales[16];
    float mins[16];
    for (int s = 0; s < 16; ++s) {
      // With only 4 levels, weigh by magnitude and minimize absolute error: outliers pull less.
      float weights[16];
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(src[16 * s + l]);
      scales[s] = make_qkx2_quants(16, 3, src + 16 * s, weights, levels + 16 * s, &mins[s], -0.5f, 0.1f, 15, true);
    }
    // Scales and mins to 4 bits each against the largest of each.
    const float max_scale = *std::max_element(scales, scales + 16);
    const float max_min = *std::max_element(mins, mins + 16);
    std::memset(block.scales, 0, sizeof(block.scales));
    if (max_scale > 0) {
      const float iscale = 15 / max_scale;
      for (int s = 0; s < 16; ++s)
        block.scales[s] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * scales[s]), 0, 15));
    }
    block.d = fp32_to_fp16(max_scale > 0 ? max_scale / 15 : 0.0f);
    if (max_min > 0) {
      const float iscale = 15 / max_min;
      for (int s = 0; s < 16; ++s)
        block.scales[s] |= static_cast<uint8_t>(std::clamp(nearest_int(iscale * mins[s]), 0, 15) << 4);
    }
    block.dmin = fp32_to_fp16(max_min > 0 ? max_min / 15 : 0.0f);

    const float d = fp16_to_fp32(block.d);
    const float dmin = fp16_to_fp32(block.dmin);
    for (int s = 0; s < 16; ++s) {
      const float scale = d * (block.scales[s] & 0xF);
      if (scale == 0) continue;
      const float min = dmin * (block.scales[s] >> 4);
      for (int l = 0; l < 16; ++l)
        levels[16 * s + l] = static_cast<uint8_t>(std::clamp(nearest_int((src[16 * s + l] + min) / scale), 0, 3));
    }
    pack_2bit(levels, block.qs);
  }
}

void quantize_q3_k(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ3_K*>(dst);
  for (int64_t b = 0; b < n / kSuperBlock; ++b, src += kSuperBlock) {
    BlockQ3_K& block = blocks[b];
    int8_t levels[kSuperBlock];
    float scales[16];
    for (int s = 0; s < 16; ++s) scales[s] = make_q3_quants(16, 4, src + 16 * s, levels + 16 * s);

    // Scales to 6 bits (-32..31), the largest in magnitude on -32.
    const float max_scale = signed_max_scale(scales, 16);
    std::memset(block.scales, 0, sizeof(block.scales));
    if (max_scale != 0) {
      const float iscale = -32 / max_scale;
      for (int s = 0; s < 16; ++s) {
        const int l = std::clamp(nearest_int(iscale * scales[s]), -32, 31) + 32;
        // The packing unpack_q3_k_scales reads back.
        block.scales[s % 8] |= static_cast<uint8_t>((l & 0xF) << (4 * (s / 8)));
        block.scales[8 + s % 4] |= static_cast<uint8_t>((l >> 4) << (2 * (s / 4)));
      }
      block.d = fp32_to_fp16(1 / iscale);
    } else {
      block.d = fp32_to_fp16(0.0f);
    }

    const float d = fp16_to_fp32(block.d);
    uint8_t biased_scales[16];
    unpack_q3_k_scales(block.scales, biased_scales);
    for (int s = 0; s < 16; ++s) {
      const float scale = d * static_cast<float>(biased_scales[s] - 32);
      if (scale == 0) continue;
      for (int l = 0; l < 16; ++l)
        levels[16 * s + l] = static_cast<int8_t>(std::clamp(nearest_int(src[16 * s + l] / scale), -4, 3) + 4);
    }

    // Levels 0..7: bit 2 goes to hmask, bits 0-1 to qs.
    std::memset(block.hmask, 0, sizeof(block.hmask));
    uint8_t low_bits[kSuperBlock];
    for (int e = 0; e < kSuperBlock; ++e) {
      block.hmask[e % 32] |= static_cast<uint8_t>(((levels[e] >> 2) & 1) << (e / 32));
      low_bits[e] = levels[e] & 3;
    }
    pack_2bit(low_bits, block.qs);
  }
}

void quantize_q4_k(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_K*>(dst);
  for (int64_t b = 0; b < n / kSuperBlock; ++b, src += kSuperBlock) {
    ScaleMinBlock header;
    uint8_t levels[kSuperBlock];
    quantize_scale_min(src, 15, -1.0f, 20, &header, levels);
    blocks[b].d = header.d;
    blocks[b].dmin = header.dmin;
    std::memcpy(blocks[b].scales, header.scales, sizeof(header.scales));
    pack_k_nibbles(levels, blocks[b].qs);
  }
}

void quantize_q5_k(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ5_K*>(dst);
  for (int64_t b = 0; b < n / kSuperBlock; ++b, src += kSuperBlock) {
    BlockQ5_K& block = blocks[b];
    ScaleMinBlock header;
    uint8_t levels[kSuperBlock];
    quantize_scale_min(src, 31, -0.5f, 15, &header, levels);
    block.d = header.d;
    block.dmin = header.dmin;
    std::memcpy(block.scales, header.scales, sizeof(header.scales));
    std::memset(block.qh, 0, sizeof(block.qh));
    for (int e = 0; e < kSuperBlock; ++e) block.qh[e % 32] |= static_cast<uint8_t>((levels[e] >> 4) << (e / 32));
    pack_k_nibbles(levels, block.qs);
  }
}

void quantize_q6_k(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ6_K*>(dst);
  for (int64_t b = 0; b < n / kSuperBlock; ++b, src += kSuperBlock) {
    BlockQ6_K& block = blocks[b];
    int8_t levels[kSuperBlock];
    float scales[16];
    for (int s = 0; s < 16; ++s) scales[s] = make_qx_quants(16, 32, src + 16 * s, levels + 16 * s);

    // Scales to int8, the largest in magnitude on -128.
    const float max_scale = signed_max_scale(scales, 16);
    if (std::fabs(max_scale) < 1e-15f) {
      std::memset(&block, 0, sizeof(block));
      continue;
    }
    const float iscale = -128 / max_scale;
    block.d = fp32_to_fp16(1 / iscale);
    for (int s = 0; s < 16; ++s)
      block.scales[s] = static_cast<int8_t>(std::clamp(nearest_int(iscale * scales[s]), -128, 127));

    const float d = fp16_to_fp32(block.d);
    for (int s = 0; s < 16; ++s) {
      const float scale = d * block.scales[s];
      if (scale == 0) continue;
      for (int l = 0; l < 16; ++l)
        levels[16 * s + l] = static_cast<int8_t>(std::clamp(nearest_int(src[16 * s + l] / scale), -32, 31) + 32);
    }

    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 32; ++l) {
        const int8_t* e = levels + 128 * h + l;  // elements 128h + 32k + l at e[32k]
        block.ql[64 * h + l] = static_cast<uint8_t>((e[0] & 0xF) | ((e[64] & 0xF) << 4));
        block.ql[64 * h + 32 + l] = static_cast<uint8_t>((e[32] & 0xF) | ((e[96] & 0xF) << 4));
        block.qh[32 * h + l] =
            static_cast<uint8_t>((e[0] >> 4) | ((e[32] >> 4) << 2) | ((e[64] >> 4) << 4) | ((e[96] >> 4) << 6));
      }
    }
  }
}

void quantize_iq4_xs(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t b = 0; b < n / kSuperBlock; ++b, src += kSuperBlock) {
    BlockIQ4_XS& block = blocks[b];
    float scales[8];
    for (int j = 0; j < 8; ++j) scales[j] = iq4_block_scale(src + kBlock * j);

    // Sub-block scales to 6 bits (-32..31), the largest in magnitude on -32; then each sub-block's levels are
    // found again for the scale it will be read with.
    const float d = -signed_max_scale(scales, 8) / 32;
    block.d = fp32_to_fp16(d);
    const float id = d != 0 ? 1 / d : 0;
    block.scales_h = 0;
    std::memset(block.scales_l, 0, sizeof(block.scales_l));
    for (int j = 0; j < 8; ++j) {
      const int l = std::clamp(nearest_int(id * scales[j]), -32, 31);
      const float sub_scale = d * static_cast<float>(l);
      const float inverse = sub_scale != 0 ? 1 / sub_scale : 0;
      uint8_t levels[kBlock];
      for (int i = 0; i < kBlock; ++i)
        levels[i] = static_cast<uint8_t>(nearest_iq4_index(inverse * src[kBlock * j + i]));
      pack_nibbles(levels, block.qs + 16 * j);
      const int biased = l + 32;
      block.scales_l[j / 2] |= static_cast<uint8_t>((biased & 0xF) << (4 * (j % 2)));
      block.scales_h |= static_cast<uint16_t>((biased >> 4) << (2 * j));
    }
  }
}

void quantize_q8_k_unchecked(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_K*>(dst);
  for (int64_t b = 0; b < n / kSuperBlock; ++b, src += kSuperBlock) {
    BlockQ8_K& block = blocks[b];
    float max = 0;
    for (int e = 0; e < kSuperBlock; ++e)
      if (std::fabs(src[e]) > std::fabs(max)) max = src[e];
    if (max == 0) {
      std::memset(&block, 0, sizeof(block));
      continue;
    }
    // The largest magnitude goes to -127 and nothing rounds past 127.
    const float iscale = -127 / max;
    for (int e = 0; e < kSuperBlock; ++e)
      block.qs[e] = static_cast<int8_t>(std::min(127, nearest_int(iscale * src[e])));
    for (int s = 0; s < 16; ++s) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += block.qs[16 * s + l];
      block.bsums[s] = static_cast<int16_t>(sum);
    }
    block.d = 1 / iscale;
  }
}

}  // namespace rf::quant
