// The plain float types: F32 is copied, F16 and BF16 convert element by element (round to nearest even).
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "quant/kernels.h"
#include "util/half.h"

namespace rf::quant {

namespace {

// An empty tensor's data may be a null pointer, which memcpy must not get even for 0 bytes (found by fuzz_gguf).
void copy_floats(void* dst, const void* src, int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

}  // namespace

void dequantize_f32(const void* src, float* dst, int64_t n) { copy_floats(dst, src, n); }

void quantize_f32(const float* src, void* dst, int64_t n) { copy_floats(dst, src, n); }

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
#if defined(__F16C__)
  // The scalar conversion branches on subnormals and specials; F16C converts 8 at a time to the same values
  // (a signaling NaN comes back quiet).
  for (; i + 8 <= n; i += 8) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(halves));
  }
#endif
  for (; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
}

void quantize_f16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(b[i]);
}

void quantize_bf16(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) b[i] = fp32_to_bf16(src[i]);
}

}  // namespace rf::quant
