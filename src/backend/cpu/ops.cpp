#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>

#if defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "util/half.h"

namespace rf::cpu {
namespace {

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void add_scaled(float* out, float weight, const float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += weight * v[i];
}

// The f16 versions convert eight values at a time where the CPU has F16C; the scalar loops finish the rest.
float dot(const float* a, const uint16_t* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
#if defined(__F16C__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 bf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), bf, acc);
  }
  __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  half = _mm_add_ps(half, _mm_movehl_ps(half, half));
  half = _mm_add_ss(half, _mm_movehdup_ps(half));
  sum = _mm_cvtss_f32(half);
#endif
  for (; i < n; ++i) sum += a[i] * fp16_to_fp32(b[i]);
  return sum;
}

void add_scaled(float* out, float weight, const uint16_t* v, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__FMA__)
  const __m256 w = _mm256_set1_ps(weight);
  for (; i + 8 <= n; i += 8) {
    const __m256 vf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + i)));
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(w, vf, _mm256_loadu_ps(out + i)));
  }
#endif
  for (; i < n; ++i) out[i] += weight * fp16_to_fp32(v[i]);
}

}  // namespace

void rmsnorm(float* out, const float* x, const float* weight, int64_t n, float eps) {
  double sum_of_squares = 0.0;  // llama.cpp sums in double too; rows are short, so it costs nothing
  for (int64_t i = 0; i < n; ++i) sum_of_squares += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum_of_squares / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void softmax(float* x, int64_t n) {
  const float max = *std::max_element(x, x + n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inverse = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inverse;
}

void swiglu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

std::vector<double> rope_inverse_frequencies(const model::ModelConfig& config, const float* freq_factors) {
  std::vector<double> inverse(static_cast<size_t>(config.rope_dims / 2));
  for (size_t i = 0; i < inverse.size(); ++i) {
    double frequency = std::pow(static_cast<double>(config.rope_base),
                                -2.0 * static_cast<double>(i) / static_cast<double>(config.rope_dims));
    if (config.rope_scaling == model::RopeScaling::Linear) frequency /= config.rope_scale_factor;
    if (config.rope_scaling == model::RopeScaling::Llama3) frequency /= freq_factors[i];
    inverse[i] = frequency;
  }
  return inverse;
}

void rope_angles(float* cos_sin, int64_t position, std::span<const double> inverse_frequencies) {
  for (size_t i = 0; i < inverse_frequencies.size(); ++i) {
    const double angle = static_cast<double>(position) * inverse_frequencies[i];
    cos_sin[2 * i] = static_cast<float>(std::cos(angle));
    cos_sin[2 * i + 1] = static_cast<float>(std::sin(angle));
  }
}

void rope(float* heads, int64_t n_heads, int64_t head_dim, const float* cos_sin, int64_t n_pairs,
          model::RopeStyle style) {
  // Normal: pair i is (2i, 2i + 1). NeoX: pair i is (i, i + n_pairs).
  const int64_t first_step = style == model::RopeStyle::Normal ? 2 : 1;
  const int64_t partner = style == model::RopeStyle::Normal ? 1 : n_pairs;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* head = heads + h * head_dim;
    for (int64_t i = 0; i < n_pairs; ++i) {
      float* a = head + i * first_step;
      float* b = a + partner;
      const float c = cos_sin[2 * i];
      const float s = cos_sin[2 * i + 1];
      const float a0 = *a;
      const float b0 = *b;
      *a = a0 * c - b0 * s;
      *b = a0 * s + b0 * c;
    }
  }
}

template <typename KvElement>
void attend(float* out, const float* q, const KvElement* keys, const KvElement* values, int64_t n_positions,
            int64_t stride, int64_t head_dim, float scale, float* scores) {
  for (int64_t j = 0; j < n_positions; ++j) scores[j] = scale * dot(q, keys + j * stride, head_dim);
  softmax(scores, n_positions);
  std::fill(out, out + head_dim, 0.0f);
  for (int64_t j = 0; j < n_positions; ++j) add_scaled(out, scores[j], values + j * stride, head_dim);
}

template void attend<float>(float*, const float*, const float*, const float*, int64_t, int64_t, int64_t, float, float*);
template void attend<uint16_t>(float*, const float*, const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t, float,
                               float*);

}  // namespace rf::cpu
