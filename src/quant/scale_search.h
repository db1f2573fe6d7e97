// The scale searches of llama.cpp's reference quantizer (ggml-quants.c, without an importance matrix).
// Rounding x / d for the obvious d = max / nmax is rarely the best fit: each search tries scales around it,
// refits d by least squares for the levels a trial produced, and keeps the trial with the smallest
// (weighted) error. The quantized files ROCmForge reads were made this way, and its own quantizer matches
// their round-trip error by doing the same.
#pragma once
#include <bit>
#include <cstdint>

namespace rf::quant {

// Round to nearest, ties to even, for |x| < 2^22: adding 1.5 * 2^23 leaves the rounded integer in the low
// mantissa bits. Branch-free, so loops over it vectorize; bit-identical to ggml's nearest_int.
inline int nearest_int(float x) {
  const float shifted = x + 12582912.0f;
  return static_cast<int>(std::bit_cast<uint32_t>(shifted) & 0x007fffffu) - 0x00400000;
}

// Symmetric levels -nmax..nmax-1 (stored as level + nmax in L), weighted by x^2: rounds at 19 trial scales
// around -nmax / max and returns the least-squares d of the best. Q6_K's sub-block search.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L);

// Symmetric levels -nmax..nmax-1 (stored + nmax), weighted by x^2: starts from d = max / -nmax and moves
// single levels while that lowers the error. Q3_K's sub-block search.
float make_q3_quants(int n, int nmax, const float* x, int8_t* L);

// Asymmetric levels 0..nmax with x ~ d * L - min: tries nstep + 1 scales (nmax + rmin + rdelta * step) /
// (max - min), fits d and min by weighted least squares for each, and keeps the smallest weighted squared
// (or absolute, use_mad) error. Returns d; stores min (>= 0, subtracted) in *min_out. Q2_K, Q4_K, Q5_K.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* min_out, float rmin,
                       float rdelta, int nstep, bool use_mad);

// Index of the IQ4_NL level nearest to x (ties go up).
int nearest_iq4_index(float x);

// IQ4_NL / IQ4_XS sub-block of 32: the scale d (x ~ d * kIQ4NLValues[index]) found by trying 15 scales
// around max / -127, weighted by x^2. 0 for an all-zero block.
float iq4_block_scale(const float* x);

}  // namespace rf::quant
