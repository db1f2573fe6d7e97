// ggml's block layouts, byte for byte, and the small unpacking helpers that dequantizers and dot-product
// kernels share. A block holds a fixed number of elements (32 for the legacy types and IQ4_NL, 256 for the
// K-quants and IQ4_XS: a "super-block" of 8 or 16 sub-blocks with their own small scales). Scales stored
// as IEEE half are uint16_t here and converted with rf::fp16_to_fp32.
#pragma once
#include <cstdint>
#include <cstring>

namespace rf::quant {

constexpr int kBlock = 32;        // elements per block of Q4_0..Q8_0 and IQ4_NL
constexpr int kSuperBlock = 256;  // elements per block of the K-quants, IQ4_XS and Q8_K

// x = d * (q - 8); element j in the low nibble of qs[j], element j + 16 in its high nibble.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kBlock / 2];
};

// x = d * q + m; nibbles as Q4_0.
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kBlock / 2];
};

// x = d * (q - 16); low 4 bits as Q4_0, bit 4 of element j is bit j of qh (little-endian u32).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kBlock / 2];
};

// x = d * q + m; bits as Q5_0.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kBlock / 2];
};

// x = d * q.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kBlock];
};

// x = d * kIQ4NLValues[q]; nibbles as Q4_0.
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kBlock / 2];
};

// 16 sub-blocks of 16: x = d * (scales[s] & 15) * q - dmin * (scales[s] >> 4), q 2 bits.
// qs[32 * h + l] holds, from its low bits up, elements 128 * h + l, +32, +64, +96.
struct BlockQ2_K {
  uint8_t scales[kSuperBlock / 16];
  uint8_t qs[kSuperBlock / 4];
  uint16_t d;
  uint16_t dmin;
};

// 16 sub-blocks of 16: x = d * (scale[s] - 32) * (q - 4), q 3 bits: the low 2 bits packed as Q2_K, the high
// bit of element e in bit e / 32 of hmask[e % 32]. The 6-bit scales are packed into 12 bytes (see
// unpack_q3_k_scales).
struct BlockQ3_K {
  uint8_t hmask[kSuperBlock / 8];
  uint8_t qs[kSuperBlock / 4];
  uint8_t scales[12];
  uint16_t d;
};

// 8 sub-blocks of 32: x = d * scale[s] * q - dmin * min[s], 6-bit scales and mins (unpack_k_scales_mins), q 4 bits:
// qs[32 * p + l] holds element 64 * p + l in its low nibble and 64 * p + 32 + l in its high nibble.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kSuperBlock / 2];
};

// As Q4_K with a fifth bit: bit 2p of qh[l] is that of element 64 * p + l, bit 2p + 1 that of 64 * p + 32 + l.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kSuperBlock / 8];
  uint8_t qs[kSuperBlock / 2];
};

// 16 sub-blocks of 16: x = d * scales[s] * (q - 32), q 6 bits. Per half h of 128 elements, element
// 128h + 32k + l (k = 0..3, l = 0..31) has its low 4 bits in ql[64h + 32(k & 1) + l] (low nibble for k < 2,
// high for k >= 2) and its high 2 bits at bit 2k of qh[32h + l].
struct BlockQ6_K {
  uint8_t ql[kSuperBlock / 2];
  uint8_t qh[kSuperBlock / 4];
  int8_t scales[kSuperBlock / 16];
  uint16_t d;
};

// 8 sub-blocks of 32: x = d * (scale[s] - 32) * kIQ4NLValues[q]; 6-bit scales, low 4 bits of sub-block s in
// nibble s % 2 of scales_l[s / 2], high 2 bits at bit 2s of scales_h; qs per sub-block as IQ4_NL.
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kSuperBlock / 64];
  uint8_t qs[kSuperBlock / 2];
};

// Activations for K-quant dot products: x = d * q, with the sums of each 16 q precomputed (bsums) so that
// kernels can apply sub-block minimums without touching the quants again.
struct BlockQ8_K {
  float d;
  int8_t qs[kSuperBlock];
  int16_t bsums[kSuperBlock / 16];
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockQ8_K) == 292);

// The 16 levels of IQ4_NL and IQ4_XS: a non-uniform grid, denser near zero where weights crowd.
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// The nibble layout of Q4_0, Q4_1, Q5_x (low 4 bits), IQ4_NL and each IQ4_XS sub-block: element j of 32
// sits in the low nibble of qs[j], element j + 16 in the high nibble.
inline void unpack_nibbles(const uint8_t* qs, uint8_t* levels) {
  for (int j = 0; j < kBlock / 2; ++j) {
    levels[j] = qs[j] & 0xF;
    levels[j + kBlock / 2] = qs[j] >> 4;
  }
}

inline void pack_nibbles(const uint8_t* levels, uint8_t* qs) {
  for (int j = 0; j < kBlock / 2; ++j)
    qs[j] = static_cast<uint8_t>((levels[j] & 0xF) | ((levels[j + kBlock / 2] & 0xF) << 4));
}

// Q5_0 / Q5_1: ORs bit 4 of element j, bit j of the little-endian u32 qh, into levels[j].
inline void unpack_fifth_bits(const uint8_t* qh_bytes, uint8_t* levels) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof(qh));
  for (int j = 0; j < kBlock; ++j) levels[j] |= static_cast<uint8_t>(((qh >> j) & 1) << 4);
}

// Q2_K / Q3_K low 2 bits of 256 elements: qs[32h + l] holds elements 128h + 32k + l at bits 2k (k = 0..3).
inline void unpack_2bit(const uint8_t* qs, uint8_t* levels) {
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) levels[128 * h + 32 * k + l] = (qs[32 * h + l] >> (2 * k)) & 3;
}

// Q4_K / Q5_K low 4 bits of 256 elements: qs[32p + l] holds element 64p + l in its low nibble and
// 64p + 32 + l in its high nibble.
inline void unpack_k_nibbles(const uint8_t* qs, uint8_t* levels) {
  for (int p = 0; p < 4; ++p) {
    for (int l = 0; l < 32; ++l) {
      levels[64 * p + l] = qs[32 * p + l] & 0xF;
      levels[64 * p + 32 + l] = qs[32 * p + l] >> 4;
    }
  }
}

// Levels of whole super-blocks, as the dequantizers and the portable dot products read them.
// Q3_K: -4..3.
inline void q3_k_levels(const BlockQ3_K& block, int8_t* levels) {
  uint8_t low[kSuperBlock];
  unpack_2bit(block.qs, low);
  for (int e = 0; e < kSuperBlock; ++e) {
    const int high = (block.hmask[e % 32] >> (e / 32)) & 1;
    levels[e] = static_cast<int8_t>((low[e] | (high << 2)) - 4);
  }
}

// Q5_K: 0..31; bit j of qh[l] is the fifth bit of element 32j + l.
inline void q5_k_levels(const BlockQ5_K& block, uint8_t* levels) {
  unpack_k_nibbles(block.qs, levels);
  for (int e = 0; e < kSuperBlock; ++e) levels[e] |= static_cast<uint8_t>(((block.qh[e % 32] >> (e / 32)) & 1) << 4);
}

// Q6_K: -32..31.
inline void q6_k_levels(const BlockQ6_K& block, int8_t* levels) {
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        const int low = (block.ql[64 * h + 32 * (k & 1) + l] >> (4 * (k / 2))) & 0xF;
        const int high = (block.qh[32 * h + l] >> (2 * k)) & 3;
        levels[128 * h + 32 * k + l] = static_cast<int8_t>((low | (high << 4)) - 32);
      }
    }
  }
}

// Q4_K / Q5_K: the 6-bit scales and mins of the 8 sub-blocks from the 12 packed bytes. Sub-blocks 0-3 keep
// theirs in the low 6 bits of bytes j (scale) and j + 4 (min); sub-blocks 4-7 keep their low 4 bits in the
// nibbles of byte j + 4 and their top 2 bits in the spare top bits of bytes j - 4 (scale) and j (min).
// Unpacked four bytes at a time into four little-endian words: scales 0-7 in bytes 0-7, mins 0-7 in bytes
// 8-15, which SIMD kernels move into a register directly.
struct KScalesMins {
  uint32_t word[4];
  int scale(int j) const { return (word[j / 4] >> (8 * (j % 4))) & 0xFF; }
  int min(int j) const { return (word[2 + j / 4] >> (8 * (j % 4))) & 0xFF; }
};
inline KScalesMins unpack_k_scales_mins(const uint8_t* packed) {
  uint32_t word[3];
  std::memcpy(word, packed, sizeof(word));
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  return {{
      word[0] & kLow6,
      (word[2] & kLow4) | (((word[0] >> 6) & kLow2) << 4),
      word[1] & kLow6,
      ((word[2] >> 4) & kLow4) | (((word[1] >> 6) & kLow2) << 4),
  }};
}

// Q3_K: the 16 6-bit scales (still biased by 32) from the 12 packed bytes. Scale j has its low 4 bits in
// nibble j / 8 of byte j % 8 and its high 2 bits at bit 2 * (j / 4) of byte 8 + j % 4. Returned four to a
// little-endian word (scale 4i + k in byte k of word i), which SIMD kernels move into a register directly.
struct Q3KScaleWords {
  uint32_t word[4];
};
inline Q3KScaleWords q3_k_scale_words(const uint8_t* packed) {
  uint32_t word[3];
  std::memcpy(word, packed, sizeof(word));
  constexpr uint32_t kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  return {{
      (word[0] & kLow4) | ((word[2] & kLow2) << 4),
      (word[1] & kLow4) | (((word[2] >> 2) & kLow2) << 4),
      ((word[0] >> 4) & kLow4) | (((word[2] >> 4) & kLow2) << 4),
      ((word[1] >> 4) & kLow4) | (((word[2] >> 6) & kLow2) << 4),
  }};
}
inline void unpack_q3_k_scales(const uint8_t* packed, uint8_t* scales) {
  const Q3KScaleWords words = q3_k_scale_words(packed);
  std::memcpy(scales, words.word, sizeof(words.word));
}

// IQ4_XS: the 6-bit scale (biased by 32) of sub-block j.
inline int iq4_xs_scale(const BlockIQ4_XS& block, int j) {
  const int low = (block.scales_l[j / 2] >> (4 * (j % 2))) & 0xF;
  const int high = (block.scales_h >> (2 * j)) & 3;
  return low | (high << 4);
}

}  // namespace rf::quant
