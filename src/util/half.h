// IEEE half and bfloat16 <-> float conversions (bit-exact, round-to-nearest-even), used by file formats,
// quant blocks and kernels alike.
#pragma once
#include <bit>
#include <cstdint>

namespace rf {

inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // zero or subnormal: mantissa * 2^-24
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t fp32_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);  // inf / nan
  if (abs >= 0x477ff000u) return sign | 0x7c00u;                                       // overflow -> inf
  if (abs < 0x38800000u) {
    // subnormal half (or zero): round |f| * 2^24 to an integer, ties to even
    const float scaled = std::bit_cast<float>(abs) * 0x1p24f;
    const uint32_t rounded = static_cast<uint32_t>(scaled);
    const float remainder = scaled - static_cast<float>(rounded);
    uint32_t result = rounded;
    if (remainder > 0.5f || (remainder == 0.5f && (rounded & 1u))) ++result;
    return sign | static_cast<uint16_t>(result);
  }
  const uint32_t mantissa_odd = (abs >> 13) & 1u;
  const uint32_t rounded = abs + 0xfffu + mantissa_odd;
  return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
}

inline float bf16_to_fp32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

inline uint16_t fp32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace rf
