// One decoder per weight type: how a lane reads a slice of a block and turns it into numbers. Every kernel
// that reads weights (matrix-vector products, dequantization for prompt GEMMs, embedding lookup) is written
// once against this interface:
//
//   Decoder<T>::kBlockElements  elements of one block (for the float types, the 16 bytes a lane loads)
//   Decoder<T>::kSlices         slices per block; a slice is what one lane decodes at a time: 16 or 32 bytes
//                               of quants with the header fields they need
//   Decoder<T>::Slice           what load() returns: quants in groups of 16 or 32 with an affine map
//                               x = scale * q + offset (QuantSlice), the same with integer scales under
//                               the block's float factors (ScaledLevelSlice: Q4_K, Q5_K, Q6_K), or plain
//                               values (FloatSlice)
//   Decoder<T>::group_start(s, g)  the block element where group g of slice s starts (its elements are
//                               consecutive, so the matching activations are one or two 16-byte loads)
//   Decoder<T>::load(w, b, s)   slice s of block b (blocks counted from the matrix's first, row after row)
//
// Quants stay packed four to an int, so a dot product with 8-bit activations is one dp4a per four elements
// and the per-group scale and offset are applied once per group. The hot types (Q8_0, Q4_K, Q5_K, Q6_K) take
// 32 bytes of quants per slice and decode their header fields without branches, which keeps the
// instructions per weight byte low enough for the products to stay bound by memory bandwidth. Offsets (the minimums of Q4_1 and the
// K-quants, the fixed -8, -16, -32, -4 of Q4_0, Q5_0, Q6_K, Q3_K) use the activations' precomputed sums.
// Block layouts are those of quant/blocks.h; split types (weight_layout.h) read their scale from w.scales.
// Quantized blocks are read with load_weight() (streaming loads: device.cuh), float rows with plain loads, which
// measured faster for them.
#pragma once
#include <cstdint>

#include "backend/gpu/device.cuh"
#include "backend/gpu/kernels.h"
#include "backend/gpu/tuning.h"
#include "backend/gpu/weight_layout.h"
#include "gguf/tensor_type.h"

namespace rf::gpu {

// Groups of 16 or 32 quants (kInts ints) sharing one affine map; bytes of q are non-negative levels or signed
// values, four to an int, in element order.
template <int kGroups_, int kInts_ = 4>
struct QuantSlice {
  static constexpr int kGroups = kGroups_;
  static constexpr int kInts = kInts_;
  int q[kGroups][kInts];
  float scale[kGroups];
  float offset[kGroups];
};

// Groups of 16 or 32 unsigned levels (bytes, four to an int) with integer scales and mins under the block's
// float factors: x = d * scale[g] * q - dmin * min[g]. For K-quants and IQ4_XS (its values biased to unsigned
// levels), whose activations carry one scale per super-block (Q8_K), so that a slice's dot product is summed in
// integers and scaled once. A level may be left in place in the high nibble of its byte (16 q): its scale is
// then that of the low nibble divided by 16, which the decoder keeps integral by multiplying the other scales by
// 16 and dividing d by 16.
template <int kGroups_, int kInts_ = 4>
struct ScaledLevelSlice {
  static constexpr int kGroups = kGroups_;
  static constexpr int kInts = kInts_;
  int q[kGroups][kInts];
  int scale[kGroups];
  int min[kGroups];
  float d;
  float dmin;
};

template <int kElements_>
struct FloatSlice {
  static constexpr int kElements = kElements_;
  float v[kElements];
};

template <TensorType T>
struct Decoder;

namespace decode {

constexpr uint32_t kLowNibbles = 0x0F0F0F0Fu;
constexpr uint32_t kHighNibbles = 0xF0F0F0F0u;

__device__ __forceinline__ const uint8_t* payload(const WeightView& w, int64_t block, int stride) {
  return w.blocks + block * stride;
}

__device__ __forceinline__ int component(const int4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// Bits 0..3 of `bits` moved to bit 0 of bytes 0..3.
__device__ __forceinline__ int spread_bits(uint32_t bits) {
  return static_cast<int>((bits & 1u) | ((bits & 2u) << 7) | ((bits & 4u) << 14) | ((bits & 8u) << 21));
}

// 16 bytes of IQ4_NL / IQ4_XS levels (two per byte) -> their values (quant::kIQ4NLValues: -127, -104, -83,
// -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113) as signed bytes, or with kBiased as unsigned bytes
// value + 127 (0 .. 240, for products summed as levels under an offset), the low nibbles' to out.q[0] and the
// high nibbles' to out.q[1], as split_nibbles() orders levels. The table lives in registers: byte permutes pick
// four levels' values from its low half and from its high half at once, a third picks per level by the level's
// bit 3, and two more sort the eight values of a word into low and high nibbles. (An indexed local array went
// through local memory, which made IQ4_XS products about ten times slower than Q4_K's.)
template <bool kBiased, typename Slice>
__device__ __forceinline__ void split_iq4_values(const int4& qs, Slice& out) {
  // Each byte + 127: flip the sign bit (+ 128), then take 1 from every byte (none is zero after the flip).
  constexpr auto table = [](uint32_t word) { return kBiased ? (word ^ 0x80808080u) - 0x01010101u : word; };
  constexpr uint32_t kLow0 = table(0xBFAD9881u), kLow1 = table(0xF6EADDCFu);    // values of levels 0-3, 4-7
  constexpr uint32_t kHigh0 = table(0x26190D01u), kHigh1 = table(0x71594535u);  // values of levels 8-11, 12-15
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const auto word = static_cast<uint32_t>(component(qs, i));
    const uint32_t index = word & 0x77777777u;         // per nibble: the level within its half
    const uint32_t upper = (word & 0x88888888u) >> 1;  // per nibble: 4 where the level is 8 or more
    // Values of nibbles 0-3 (bytes 0 and 1 of the word, low nibble first), then of nibbles 4-7.
    const uint32_t first = __byte_perm(__byte_perm(kLow0, kLow1, index), __byte_perm(kHigh0, kHigh1, index),
                                       0x3210u | upper);
    const uint32_t second = __byte_perm(__byte_perm(kLow0, kLow1, index >> 16),
                                        __byte_perm(kHigh0, kHigh1, index >> 16), 0x3210u | (upper >> 16));
    out.q[0][i] = static_cast<int>(__byte_perm(first, second, 0x6420u));
    out.q[1][i] = static_cast<int>(__byte_perm(first, second, 0x7531u));
  }
}

// The 6-bit scales and mins of sub-blocks 2p and 2p + 1 of Q4_K and Q5_K (quant::unpack_k_scales_mins) from
// the 12 packed bytes, as words w0 w1 w2, without branches: lanes decoding different p stay converged.
// Sub-block j < 4 keeps its scale and min in the low 6 bits of bytes j and j + 4; j >= 4 keeps their low 4
// bits in byte j + 4 and their top 2 bits in the top bits of bytes j - 4 and j. All four sub-blocks of a
// half are unpacked at once, one per byte, and the pair's two bytes picked out.
__device__ __forceinline__ void k_scale_min_pair(uint32_t w0, uint32_t w1, uint32_t w2, int p, int (&scale)[2],
                                                 int (&min)[2]) {
  const uint32_t scales = p < 2 ? w0 & 0x3F3F3F3Fu : (w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u);
  const uint32_t mins = p < 2 ? w1 & 0x3F3F3F3Fu : ((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u);
  const int first = 2 * (p % 2);  // byte of sub-block 2p
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    scale[k] = static_cast<int>(__byte_perm(scales, 0, 0x4440 | (first + k)));
    min[k] = static_cast<int>(__byte_perm(mins, 0, 0x4440 | (first + k)));
  }
}

// Scales, mins and factors of slice p of a Q4_K or Q5_K block from its 16 header bytes (d, dmin, scales[12]).
// kHighInPlace: the second group's levels are left in the high nibble (16 q), so the first group's scale is
// multiplied by 16 and d divided by 16 (exactly: a power of two).
template <bool kHighInPlace, typename Slice>
__device__ __forceinline__ void k_header(const int4& header, int p, Slice& s) {
  k_scale_min_pair(static_cast<uint32_t>(header.y), static_cast<uint32_t>(header.z),
                   static_cast<uint32_t>(header.w), p, s.scale, s.min);
  const auto dd = static_cast<uint32_t>(header.x);
  s.d = half_to_float(static_cast<uint16_t>(dd));
  s.dmin = half_to_float(static_cast<uint16_t>(dd >> 16));
  if constexpr (kHighInPlace) {
    s.scale[0] *= 16;
    s.d *= 1.0f / 16.0f;
  }
}

// Q4_0, Q4_1, IQ4_NL: 16 nibble bytes; element j in the low nibble of byte j, element j + 16 in the high one.
template <typename Slice>
__device__ __forceinline__ void split_nibbles(const int4& qs, Slice& out) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out.q[0][i] = component(qs, i) & kLowNibbles;
    out.q[1][i] = (component(qs, i) >> 4) & kLowNibbles;
  }
}

// Q5_0, Q5_1: the nibbles plus a fifth bit of element j at bit j of qh.
template <typename Slice>
__device__ __forceinline__ void split_nibbles_with_high_bit(const int4& qs, uint32_t qh, Slice& out) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out.q[0][i] = (component(qs, i) & kLowNibbles) | (spread_bits(qh >> (4 * i)) << 4);
    out.q[1][i] = ((component(qs, i) >> 4) & kLowNibbles) | (spread_bits(qh >> (16 + 4 * i)) << 4);
  }
}

}  // namespace decode

// ---- float types: a slice is 16 bytes of consecutive values -------------------------------------------------

template <>
struct Decoder<TensorType::F32> {
  static constexpr int kBlockElements = 4;
  static constexpr int kSlices = 1;
  using Slice = FloatSlice<4>;
  __device__ static Slice load(const WeightView& w, int64_t block, int) {
    const float4 v = *reinterpret_cast<const float4*>(decode::payload(w, block, 16));
    return {{v.x, v.y, v.z, v.w}};
  }
};

// F16 and BF16: a block is eight 16-bit floats read as one 16-byte load and widened by `widen`.
template <float (*widen)(uint16_t)>
struct HalfWidthDecoder {
  static constexpr int kBlockElements = 8;
  static constexpr int kSlices = 1;
  using Slice = FloatSlice<8>;
  __device__ static Slice load(const WeightView& w, int64_t block, int) {
    const int4 v = load_16(decode::payload(w, block, 16));
    Slice s;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const auto bits = static_cast<uint32_t>(decode::component(v, i));
      s.v[2 * i] = widen(static_cast<uint16_t>(bits));
      s.v[2 * i + 1] = widen(static_cast<uint16_t>(bits >> 16));
    }
    return s;
  }
};

template <>
struct Decoder<TensorType::F16> : HalfWidthDecoder<half_to_float> {};

template <>
struct Decoder<TensorType::BF16> : HalfWidthDecoder<bf16_to_float> {};

// ---- 32-element blocks -----------------------------------------------------------------------------------------

// Payload qs[32] (d split off); a slice is the whole block.
template <>
struct Decoder<TensorType::Q8_0> {
  static constexpr int kBlockElements = 32;
  static constexpr int kSlices = 1;
  using Slice = QuantSlice<1, 8>;
  __device__ static int group_start(int, int) { return 0; }
  __device__ static Slice load(const WeightView& w, int64_t block, int) {
    const uint8_t* p = decode::payload(w, block, 32);
    const int4 a = load_weight<int4>(p);
    const int4 b = load_weight<int4>(p + 16);
    Slice s;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s.q[0][i] = decode::component(a, i);
      s.q[0][i + 4] = decode::component(b, i);
    }
    s.scale[0] = half_to_float(load_weight<uint16_t>(w.scales + block));
    s.offset[0] = 0.0f;
    return s;
  }
};

// Payload qs[16] (d split off): x = d * (q - 8).
template <>
struct Decoder<TensorType::Q4_0> {
  static constexpr int kBlockElements = 32;
  static constexpr int kSlices = 1;
  using Slice = QuantSlice<2>;
  __device__ static int group_start(int, int group) { return 16 * group; }
  __device__ static Slice load(const WeightView& w, int64_t block, int) {
    Slice s;
    decode::split_nibbles(load_weight<int4>(decode::payload(w, block, 16)), s);
    const float d = half_to_float(load_weight<uint16_t>(w.scales + block));
    s.scale[0] = s.scale[1] = d;
    s.offset[0] = s.offset[1] = -8.0f * d;
    return s;
  }
};

// d, m, qs[16]: x = d * q + m.
template <>
struct Decoder<TensorType::Q4_1> {
  static constexpr int kBlockElements = 32;
  static constexpr int kSlices = 1;
  using Slice = QuantSlice<2>;
  __device__ static int group_start(int, int group) { return 16 * group; }
  __device__ static Slice load(const WeightView& w, int64_t block, int) {
    const uint8_t* p = decode::payload(w, block, 20);
    Slice s;
    decode::split_nibbles(load_weight_16_from_4(p + 4), s);
    const auto dm = static_cast<uint32_t>(load_weight<int>(p));
    s.scale[0] = s.scale[1] = half_to_float(static_cast<uint16_t>(dm));
    s.offset[0] = s.offset[1] = half_to_float(static_cast<uint16_t>(dm >> 16));
    return s;
  }
};

// Payload qh[4], qs[16] (d split off): x = d * (q - 16).
template <>
struct Decoder<TensorType::Q5_0> {
  static constexpr int kBlockElements = 32;
  static constexpr int kSlices = 1;
  using Slice = QuantSlice<2>;
  __device__ static int group_start(int, int group) { return 16 * group; }
  __device__ static Slice load(const WeightView& w, int64_t block, int) {
    const uint8_t* p = decode::payload(w, block, 20);
    Slice s;
    decode::split_nibbles_with_high_bit(load_weight_16_from_4(p + 4), load_weight<unsigned>(p), s);
    const float d = half_to_float(load_weight<uint16_t>(w.scales + block));
    s.scale[0] = s.scale[1] = d;
    s.offset[0] = s.offset[1] = -16.0f * d;
    return s;
  }
};

// d, m, qh[4], qs[16]: x = d * q + m.
template <>
struct Decoder<TensorType::Q5_1> {
  static constexpr int kBlockElements = 32;
  static constexpr int kSlices = 1;
  using Slice = QuantSlice<2>;
  __device__ static int group_start(int, int group) { return 16 * group; }
  __device__ static Slice load(const WeightView& w, int64_t block, int) {
    const uint8_t* p = decode::payload(w, block, 24);
    Slice s;
    const int2 header = load_weight<int2>(p);
    decode::split_nibbles_with_high_bit(load_weight_16_from_8(p + 8), static_cast<uint32_t>(header.y), s);
    const auto dm = static_cast<uint32_t>(header.x);
    s.scale[0] = s.scale[1] = half_to_float(static_cast<uint16_t>(dm));
    s.offset[0] = s.offset[1] = half_to_float(static_cast<uint16_t>(dm >> 16));
    return s;
  }
};

// Payload qs[16] (d split off): x = d * kIQ4NLValues[q].
template <>
struct Decoder<TensorType::IQ4_NL> {
  static constexpr int kBlockElements = 32;
  static constexpr int kSlices = 1;
  using Slice = QuantSlice<2>;
  __device__ static int group_start(int, int group) { return 16 * group; }
  __device__ static Slice load(const WeightView& w, int64_t block, int) {
    Slice s;
    decode::split_iq4_values<false>(load_weight<int4>(decode::payload(w, block, 16)), s);
    s.scale[0] = s.scale[1] = half_to_float(load_weight<uint16_t>(w.scales + block));
    s.offset[0] = s.offset[1] = 0.0f;
    return s;
  }
};

// ---- 256-element super-blocks ----------------------------------------------------------------------------------

// scales[16], qs[64], d, dmin. Slice (h, m) = 16 bytes of qs at 32h + 16m: their 2-bit fields k = 0..3 are
// elements 128h + 32k + 16m + 0..15, sub-block 8h + 2k + m.
template <>
struct Decoder<TensorType::Q2_K> {
  static constexpr int kBlockElements = 256;
  static constexpr int kSlices = 4;
  using Slice = QuantSlice<4>;
  __device__ static int group_start(int slice, int group) { return 128 * (slice / 2) + 32 * group + 16 * (slice % 2); }
  __device__ static Slice load(const WeightView& w, int64_t block, int slice) {
    const uint8_t* p = decode::payload(w, block, 84);
    const int h = slice / 2;
    const int m = slice % 2;
    const int4 v = load_weight_16_from_4(p + 16 + 32 * h + 16 * m);
    const auto dd = static_cast<uint32_t>(load_weight<int>(p + 80));
    const float d = half_to_float(static_cast<uint16_t>(dd));
    const float dmin = half_to_float(static_cast<uint16_t>(dd >> 16));
    Slice s;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
      for (int i = 0; i < 4; ++i) s.q[k][i] = (decode::component(v, i) >> (2 * k)) & 0x03030303;
      const int sc = load_weight<uint8_t>(p + 8 * h + 2 * k + m);
      s.scale[k] = d * static_cast<float>(sc & 15);
      s.offset[k] = -dmin * static_cast<float>(sc >> 4);
    }
    return s;
  }
};

// Payload hmask[32], qs[64], scales[12] (d split off). Slices as Q2_K; the third bit of element
// 128h + 32k + 16m + i is bit 4h + k of hmask[16m + i]; x = d * (scale - 32) * (q - 4).
template <>
struct Decoder<TensorType::Q3_K> {
  static constexpr int kBlockElements = 256;
  static constexpr int kSlices = 4;
  using Slice = QuantSlice<4>;
  __device__ static int group_start(int slice, int group) { return 128 * (slice / 2) + 32 * group + 16 * (slice % 2); }
  __device__ static Slice load(const WeightView& w, int64_t block, int slice) {
    const uint8_t* p = decode::payload(w, block, 108);
    const int h = slice / 2;
    const int m = slice % 2;
    const int4 v = load_weight_16_from_4(p + 32 + 32 * h + 16 * m);
    const int4 hmask = load_weight_16_from_4(p + 16 * m);
    const uint8_t* packed_scales = p + 96;
    const float d = half_to_float(load_weight<uint16_t>(w.scales + block));
    Slice s;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        s.q[k][i] = ((decode::component(v, i) >> (2 * k)) & 0x03030303) |
                    (((decode::component(hmask, i) >> (4 * h + k)) & 0x01010101) << 2);
      const int j = 8 * h + 2 * k + m;
      const int sc = ((load_weight<uint8_t>(packed_scales + j % 8) >> (4 * (j / 8))) & 0xF) |
                     (((load_weight<uint8_t>(packed_scales + 8 + j % 4) >> (2 * (j / 4))) & 3) << 4);
      s.scale[k] = d * static_cast<float>(sc - 32);
      s.offset[k] = -4.0f * s.scale[k];
    }
    return s;
  }
};

// d, dmin, scales[12], qs[128]. Slice p = 32 bytes of qs at 32p: low nibbles are elements 64p + 0..31
// (sub-block 2p), high nibbles 64p + 32..63 (sub-block 2p + 1), left in place (decode::kHighNibbles).
template <>
struct Decoder<TensorType::Q4_K> {
  static constexpr int kBlockElements = 256;
  static constexpr int kSlices = 4;
  using Slice = ScaledLevelSlice<2, 8>;
  __device__ static int group_start(int slice, int group) { return 64 * slice + 32 * group; }
  __device__ static Slice load(const WeightView& w, int64_t block, int slice) {
    const uint8_t* p = decode::payload(w, block, 144);
    const int4 header = load_weight<int4>(p);
    const int4 a = load_weight<int4>(p + 16 + 32 * slice);
    const int4 b = load_weight<int4>(p + 32 + 32 * slice);
    Slice s;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s.q[0][i] = decode::component(a, i) & decode::kLowNibbles;
      s.q[0][i + 4] = decode::component(b, i) & decode::kLowNibbles;
      s.q[1][i] = decode::component(a, i) & decode::kHighNibbles;
      s.q[1][i + 4] = decode::component(b, i) & decode::kHighNibbles;
    }
    decode::k_header<true>(header, slice, s);
    return s;
  }
};

// d, dmin, scales[12], qh[32], qs[128]. Slices as Q4_K; the fifth bit of element 64p + l is bit 2p of qh[l],
// of element 64p + 32 + l bit 2p + 1.
template <>
struct Decoder<TensorType::Q5_K> {
  static constexpr int kBlockElements = 256;
  static constexpr int kSlices = 4;
  using Slice = ScaledLevelSlice<2, 8>;
  __device__ static int group_start(int slice, int group) { return 64 * slice + 32 * group; }
  __device__ static Slice load(const WeightView& w, int64_t block, int slice) {
    const uint8_t* p = decode::payload(w, block, 176);
    const int4 a = load_weight<int4>(p + 48 + 32 * slice);
    const int4 b = load_weight<int4>(p + 64 + 32 * slice);
    const int4 ha = load_weight<int4>(p + 16);
    const int4 hb = load_weight<int4>(p + 32);
    const int4 header = load_weight<int4>(p);
    Slice s;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int low_a = (decode::component(ha, i) >> (2 * slice)) & 0x01010101;
      const int low_b = (decode::component(hb, i) >> (2 * slice)) & 0x01010101;
      const int high_a = (decode::component(ha, i) >> (2 * slice + 1)) & 0x01010101;
      const int high_b = (decode::component(hb, i) >> (2 * slice + 1)) & 0x01010101;
      s.q[0][i] = (decode::component(a, i) & decode::kLowNibbles) | (low_a << 4);
      s.q[0][i + 4] = (decode::component(b, i) & decode::kLowNibbles) | (low_b << 4);
      s.q[1][i] = ((decode::component(a, i) >> 4) & decode::kLowNibbles) | (high_a << 4);
      s.q[1][i + 4] = ((decode::component(b, i) >> 4) & decode::kLowNibbles) | (high_b << 4);
    }
    decode::k_header<false>(header, slice, s);
    return s;
  }
};

// Payload ql[128], qh[64], scales[16] (d split off). Slice (h, j) = 32 bytes of ql at 64h + 32j: low nibbles
// are elements 128h + 32j + 0..31, high nibbles the same + 64; their top two bits sit at bits 2j and 2j + 4 of
// qh[32h + 0..31]. Sub-blocks are 16 elements (scale of element e: scales[e / 16]), so a slice has four
// groups: (k, m) = (j, 0), (j, 1), (j + 2, 0), (j + 2, 1) at 128h + 32k + 16m. x = d * scale * (q - 32).
template <>
struct Decoder<TensorType::Q6_K> {
  static constexpr int kBlockElements = 256;
  static constexpr int kSlices = 4;
  using Slice = ScaledLevelSlice<4>;
  __device__ static int group_start(int slice, int group) {
    return 128 * (slice / 2) + 32 * (slice % 2 + 2 * (group / 2)) + 16 * (group % 2);
  }
  __device__ static Slice load(const WeightView& w, int64_t block, int slice) {
    const uint8_t* p = decode::payload(w, block, 208);
    const int h = slice / 2;
    const int j = slice % 2;
    const int4 low[2] = {load_weight<int4>(p + 64 * h + 32 * j), load_weight<int4>(p + 64 * h + 32 * j + 16)};
    const int4 high[2] = {load_weight<int4>(p + 128 + 32 * h), load_weight<int4>(p + 128 + 32 * h + 16)};
    const int2 scale_words = load_weight<int2>(p + 192 + 8 * h);
    Slice s;
    s.d = s.dmin = half_to_float(load_weight<uint16_t>(w.scales + block));
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int l = decode::component(low[m], i);
        const int hb = decode::component(high[m], i);
        s.q[m][i] = (l & decode::kLowNibbles) | (((hb >> (2 * j)) & 0x03030303) << 4);
        s.q[2 + m][i] = ((l >> 4) & decode::kLowNibbles) | (((hb >> (2 * j + 4)) & 0x03030303) << 4);
      }
      // scales[8h + 2k + m]: bytes 2j + m of the word at 8h (k = j) and at 8h + 4 (k = j + 2).
      s.scale[m] = static_cast<int8_t>(scale_words.x >> (8 * (2 * j + m)));
      s.scale[2 + m] = static_cast<int8_t>(scale_words.y >> (8 * (2 * j + m)));
    }
#pragma unroll
    for (int g = 0; g < 4; ++g) s.min[g] = 32 * s.scale[g];
    return s;
  }
};

// d, scales_h, scales_l[4], qs[128]. Slice s = sub-block s: 16 bytes of qs at 16s in IQ4_NL's nibble order;
// x = d * (scale - 32) * kIQ4NLValues[q], taken as d * (scale - 32) * (kIQ4NLValues[q] + 127) less
// d * 127 * (scale - 32), so that a slice's dot product with Q8_K activations is summed in integers like the
// K-quants' (ScaledLevelSlice).
template <>
struct Decoder<TensorType::IQ4_XS> {
  static constexpr int kBlockElements = 256;
  static constexpr int kSlices = 8;
  using Slice = ScaledLevelSlice<2>;
  __device__ static int group_start(int slice, int group) { return 32 * slice + 16 * group; }
  __device__ static Slice load(const WeightView& w, int64_t block, int slice) {
    const uint8_t* p = decode::payload(w, block, 136);
    const int2 header = load_weight<int2>(p);
    Slice s;
    decode::split_iq4_values<true>(load_weight_16_from_8(p + 8 + 16 * slice), s);
    const auto dh = static_cast<uint32_t>(header.x);
    const int low = (static_cast<uint32_t>(header.y) >> (4 * slice)) & 0xF;
    const int high = (dh >> (16 + 2 * slice)) & 3;
    const int scale = (low | (high << 4)) - 32;
    s.scale[0] = s.scale[1] = scale;
    s.min[0] = s.min[1] = 127 * scale;
    s.d = s.dmin = half_to_float(static_cast<uint16_t>(dh));
    return s;
  }
};

// ---- chunks, for the matrix-vector products of Q4_K and Q6_K -------------------------------------------------
//
// ChunkDecoder<T> reads a block as kChunks chunks of 16 bytes of quants, each with the header fields it needs:
// a lane takes one chunk at a time, so consecutive lanes on consecutive chunks read the quants in full 16-byte
// loads that together cover whole sectors, and a lane holds only its raw chunk (8 registers) until it dots it
// with the 8-bit activations, which leaves room for kUnroll chunks in flight per lane.
//
//   ChunkDecoder<T>::kMaxRowBlocks        rows of at most this many blocks go by chunks, wider ones by slices
//                                         (Decoder<T>), whichever measured faster at that width
//   ChunkDecoder<T>::kChunks, kUnroll     chunks per block; chunks a lane loads before it decodes the first
//   ChunkDecoder<T>::load(w, b, c)        the raw bytes of chunk c of block b (b counted as in Decoder<T>)
//   ChunkDecoder<T>::dot(raw, c, x, xs)   sum over the chunk of weight * activation; x and xs are the 8-bit
//                                         activations and their scales (Q8_K blocks of 32) from the block's first
//                                         element
namespace decode {

// The integer dot product of a group's kInts ints of quants (signed or unsigned bytes, as `dot4` reads them)
// with the 4 kInts activation levels at x.
template <int kInts, int (*dot4)(int, int, int)>
__device__ __forceinline__ int group_dot(const int (&q)[kInts], const int8_t* x) {
  int dot = 0;
#pragma unroll
  for (int i = 0; i < kInts; i += 4) {
    const int4 a = load_16(x + 4 * i);
    dot = dot4(q[i], a.x, dot);
    dot = dot4(q[i + 1], a.y, dot);
    dot = dot4(q[i + 2], a.z, dot);
    dot = dot4(q[i + 3], a.w, dot);
  }
  return dot;
}

// The sum of the activation levels of a group of 4 kInts starting at element `first`: a group of 32 is a whole
// activation block, a group of 16 one half of it.
template <int kInts>
__device__ __forceinline__ int group_level_sum(const ActivationScale& as, int first) {
  return kInts == 8 ? as.sum[0] + as.sum[1] : as.sum[(first / 16) % 2];
}

// A slice's integer sums with activations in Q8_K blocks (one scale per 256 values): the levels times the
// activations' levels, each group under its scale, and the mins times the activations' level sums (at most 2^27 in
// magnitude for the K-quants). x and xs are the levels and scales from the block's first element, group g starts at
// element start(g).
struct ScaledSums {
  int sum;
  int offset;
};
template <int G, int I, typename Start>
__device__ __forceinline__ ScaledSums scaled_sums(const ScaledLevelSlice<G, I>& s, const int8_t* x,
                                                  const ActivationScale* xs, Start start) {
  ScaledSums sums{0, 0};
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int first = start(g);
    sums.sum += s.scale[g] * group_dot<I, dot4_u8_i8>(s.q[g], x + first);
    sums.offset += s.min[g] * group_level_sum<I>(xs[first / kActivationBlock], first);
  }
  return sums;
}

// Sum over a slice of weight * activation, for activations in Q8_K blocks: the integer sums, the floats applied once.
template <int G, int I, typename Start>
__device__ __forceinline__ float scaled_dot(const ScaledLevelSlice<G, I>& s, const int8_t* x,
                                            const ActivationScale* xs, Start start) {
  const ScaledSums sums = scaled_sums(s, x, xs, start);
  // The Q8_K block's one scale, from the entry whose sums were just read: the same load (entry 0 instead, a
  // load of its own, was slower).
  return xs[start(0) / kActivationBlock].d *
         (s.d * static_cast<float>(sums.sum) - s.dmin * static_cast<float>(sums.offset));
}

}  // namespace decode

template <TensorType T>
struct ChunkDecoder {
  static constexpr bool kDefined = false;
  static constexpr int64_t kMaxRowBlocks = 0;
};

// Chunk j = qs[16j .. 16j + 15] of pair p = j / 2, half m = j % 2: elements 64p + 16m + i (low nibbles,
// sub-block 2p) and 64p + 32 + 16m + i (high nibbles, sub-block 2p + 1); each lane also loads the block's 16
// header bytes (one load that the eight lanes on a block share). x = d * scale * q - dmin * min. Rows of 4096
// and more (the 8B's) run faster by slices (32 bytes a lane, the header decoded once for them), rows of 2048
// (the 1B's) by chunks, where slices would leave only four lanes on a row (tuning.h).
template <>
struct ChunkDecoder<TensorType::Q4_K> {
  static constexpr bool kDefined = true;
  static constexpr int64_t kMaxRowBlocks = tuning::kQ4KChunkMaxRowBlocks;
  static constexpr int kChunks = 8;
  static constexpr int kUnroll = tuning::kQ4KChunksInFlight;
  struct Raw {
    int4 header;
    int4 q;
  };
  __device__ static Raw load(const WeightView& w, int64_t block, int j) {
    const uint8_t* p = decode::payload(w, block, 144);
    return {load_weight<int4>(p), load_weight<int4>(p + 16 + 16 * j)};
  }
  __device__ static float dot(const Raw& r, int j, const int8_t* x, const ActivationScale* scales) {
    const int p = j / 2;
    const int m = j % 2;
    ScaledLevelSlice<2> s;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s.q[0][i] = decode::component(r.q, i) & decode::kLowNibbles;
      s.q[1][i] = decode::component(r.q, i) & decode::kHighNibbles;
    }
    decode::k_header<true>(r.header, p, s);
    return decode::scaled_dot(s, x, scales, [&](int g) { return 64 * p + 32 * g + 16 * m; });
  }
};

// Chunk c = ql[16c .. 16c + 15], c = 4h + 2j + m: elements 128h + 32j + 16m + i (low nibbles, top bits at bit
// 2j of qh[32h + 16m + i]) and the same + 64 (high nibbles, bit 2j + 4), with scales 8h + 2j + m and
// 8h + 4 + 2j + m. x = d * scale * (q - 32). Rows of every width go by chunks, two in flight a lane (tuning.h).
template <>
struct ChunkDecoder<TensorType::Q6_K> {
  static constexpr bool kDefined = true;
  static constexpr int64_t kMaxRowBlocks = tuning::kQ6KChunkMaxRowBlocks;
  static constexpr int kChunks = 8;
  static constexpr int kUnroll = tuning::kQ6KChunksInFlight;
  struct Raw {
    int4 low;
    int4 high;
    int2 scales;
    float d;
  };
  __device__ static Raw load(const WeightView& w, int64_t block, int c) {
    const uint8_t* p = decode::payload(w, block, 208);
    const int h = c / 4;
    return {load_weight<int4>(p + 16 * c), load_weight<int4>(p + 128 + 32 * h + 16 * (c % 2)),
            load_weight<int2>(p + 192 + 8 * h), half_to_float(load_weight<uint16_t>(w.scales + block))};
  }
  __device__ static float dot(const Raw& r, int c, const int8_t* x, const ActivationScale* scales) {
    const int h = c / 4;
    const int j = (c / 2) % 2;
    const int m = c % 2;
    int sum = 0;
#pragma unroll
    for (int top = 0; top < 2; ++top) {
      // 16 q = 16 * nibble + 256 * top bits, with both fields masked in place (the high nibble is already 16
      // times its value, the top bits 2^shift times theirs): two dp4a per four levels and no shifts.
      const int first = 128 * h + 64 * top + 32 * j + 16 * m;
      const int4 a = load_16(x + first);
      const uint32_t nibbles = top == 0 ? decode::kLowNibbles : decode::kHighNibbles;
      const int shift = 2 * j + 4 * top;
      const uint32_t top_bits = 0x03030303u << shift;
      int nibble_dot = 0;
      int top_dot = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        nibble_dot = dot4_u8_i8(decode::component(r.low, i) & nibbles, decode::component(a, i), nibble_dot);
        top_dot = dot4_u8_i8(decode::component(r.high, i) & top_bits, decode::component(a, i), top_dot);
      }
      const int sixteen_q_dot = (top == 0 ? 16 : 1) * nibble_dot + (top_dot << (8 - shift));
      const int scale = static_cast<int8_t>((top == 0 ? r.scales.x : r.scales.y) >> (8 * (2 * j + m)));
      // x = d * scale * (q - 32); at most 2^29 in magnitude per half.
      sum += scale * (sixteen_q_dot - 512 * scales[first / kActivationBlock].sum[m]);
    }
    return scales[4 * h].d * r.d * (1.0f / 16.0f) * static_cast<float>(sum);
  }
};

// Calls fn.template operator()<T>() with the weight type as a compile-time constant; false for a type without
// a decoder.
template <typename Fn>
bool with_decoder(TensorType type, Fn&& fn) {
  switch (type) {
    case TensorType::F32: fn.template operator()<TensorType::F32>(); return true;
    case TensorType::F16: fn.template operator()<TensorType::F16>(); return true;
    case TensorType::BF16: fn.template operator()<TensorType::BF16>(); return true;
    case TensorType::Q4_0: fn.template operator()<TensorType::Q4_0>(); return true;
    case TensorType::Q4_1: fn.template operator()<TensorType::Q4_1>(); return true;
    case TensorType::Q5_0: fn.template operator()<TensorType::Q5_0>(); return true;
    case TensorType::Q5_1: fn.template operator()<TensorType::Q5_1>(); return true;
    case TensorType::Q8_0: fn.template operator()<TensorType::Q8_0>(); return true;
    case TensorType::Q2_K: fn.template operator()<TensorType::Q2_K>(); return true;
    case TensorType::Q3_K: fn.template operator()<TensorType::Q3_K>(); return true;
    case TensorType::Q4_K: fn.template operator()<TensorType::Q4_K>(); return true;
    case TensorType::Q5_K: fn.template operator()<TensorType::Q5_K>(); return true;
    case TensorType::Q6_K: fn.template operator()<TensorType::Q6_K>(); return true;
    case TensorType::IQ4_NL: fn.template operator()<TensorType::IQ4_NL>(); return true;
    case TensorType::IQ4_XS: fn.template operator()<TensorType::IQ4_XS>(); return true;
    default: return false;
  }
}

}  // namespace rf::gpu
