// Per-type row converters behind rf::quant's dispatch table (quant.cpp). Each takes `n` elements, a whole
// number of blocks; none of the quantizers look across block boundaries, so one call may span many rows.
#pragma once
#include <cstdint>

namespace rf::quant {

using DequantizeFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeFn = void (*)(const float* src, void* dst, int64_t n);

// quant_float.cpp
void dequantize_f32(const void* src, float* dst, int64_t n);
void dequantize_f16(const void* src, float* dst, int64_t n);
void dequantize_bf16(const void* src, float* dst, int64_t n);
void quantize_f32(const float* src, void* dst, int64_t n);
void quantize_f16(const float* src, void* dst, int64_t n);
void quantize_bf16(const float* src, void* dst, int64_t n);

// quant_legacy.cpp
void dequantize_q4_0(const void* src, float* dst, int64_t n);
void dequantize_q4_1(const void* src, float* dst, int64_t n);
void dequantize_q5_0(const void* src, float* dst, int64_t n);
void dequantize_q5_1(const void* src, float* dst, int64_t n);
void dequantize_q8_0(const void* src, float* dst, int64_t n);
void dequantize_iq4_nl(const void* src, float* dst, int64_t n);
void quantize_q4_0(const float* src, void* dst, int64_t n);
void quantize_q4_1(const float* src, void* dst, int64_t n);
void quantize_q5_0(const float* src, void* dst, int64_t n);
void quantize_q5_1(const float* src, void* dst, int64_t n);
void quantize_q8_0(const float* src, void* dst, int64_t n);
void quantize_iq4_nl(const float* src, void* dst, int64_t n);

// quant_k.cpp
void dequantize_q2_k(const void* src, float* dst, int64_t n);
void dequantize_q3_k(const void* src, float* dst, int64_t n);
void dequantize_q4_k(const void* src, float* dst, int64_t n);
void dequantize_q5_k(const void* src, float* dst, int64_t n);
void dequantize_q6_k(const void* src, float* dst, int64_t n);
void dequantize_iq4_xs(const void* src, float* dst, int64_t n);
void quantize_q2_k(const float* src, void* dst, int64_t n);
void quantize_q3_k(const float* src, void* dst, int64_t n);
void quantize_q4_k(const float* src, void* dst, int64_t n);
void quantize_q5_k(const float* src, void* dst, int64_t n);
void quantize_q6_k(const float* src, void* dst, int64_t n);
void quantize_iq4_xs(const float* src, void* dst, int64_t n);
// rf::quant::quantize_q8_k after its checks.
void quantize_q8_k_unchecked(const float* src, void* dst, int64_t n);

}  // namespace rf::quant
